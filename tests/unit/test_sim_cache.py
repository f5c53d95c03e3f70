"""The block LRU and the IsolatedLRU pool: prefix semantics, touch order, resizing, quotas."""

import pytest

from kvtier.sim.cache import IsolatedLRU, LRUCache


def test_a_request_hits_only_its_resident_prefix():
    cache = LRUCache(10)
    assert cache.access([1, 2, 3]) == 0
    assert cache.access([1, 2, 4]) == 2
    # Blocks 2 and 3 are resident, but block 0 of this request is not: no hit at all.
    assert cache.access([5, 2, 3]) == 0
    assert cache.access([1, 2, 4, 9]) == 3


def test_blocks_are_touched_last_to_first_so_block_zero_is_most_recent():
    cache = LRUCache(2)
    cache.access([1, 2, 3])
    assert list(cache) == [2, 1]  # least recently used first; 3 was evicted
    assert cache.evicted == 1


def test_prefix_hits_does_not_change_state_and_can_start_midway():
    cache = LRUCache(10)
    cache.touch([1, 2, 3])
    assert cache.prefix_hits([1, 2, 7]) == 2
    assert cache.prefix_hits([7, 2, 3], start=1) == 2
    assert list(cache) == [3, 2, 1]


def test_a_request_longer_than_the_capacity_keeps_its_first_blocks():
    cache = LRUCache(3)
    cache.access([1, 2, 3, 4, 5])
    assert sorted(cache) == [1, 2, 3]
    assert cache.access([1, 2, 3, 4, 5]) == 3


def test_shrinking_evicts_the_lru_tail_at_once_and_growing_adds_empty_space():
    cache = LRUCache(5)
    cache.access([1, 2, 3, 4, 5])
    assert list(cache) == [5, 4, 3, 2, 1]
    assert cache.resize(2) == 3
    assert list(cache) == [2, 1]
    assert cache.resize(4) == 0
    assert list(cache) == [2, 1]
    assert cache.access([1, 2, 3]) == 2
    assert len(cache) == 3


def test_capacity_zero_retains_nothing():
    cache = LRUCache(0)
    assert cache.access([1, 2]) == 0
    assert cache.access([1, 2]) == 0
    assert len(cache) == 0


def test_negative_sizes_are_rejected():
    with pytest.raises(ValueError):
        LRUCache(-1)
    with pytest.raises(ValueError):
        LRUCache(1).resize(-1)
    with pytest.raises(ValueError):
        IsolatedLRU().set_quota("a", -1)


def test_a_salt_without_a_quota_has_limit_zero():
    pool = IsolatedLRU({"a": 4})
    assert pool.quota("b") is None
    pool.partition("b").access([1, 2])
    assert pool.usage("b") == 0
    assert pool.partition("b").access([1, 2]) == 0


def test_salts_never_evict_each_other():
    pool = IsolatedLRU({"a": 2, "b": 2})
    pool.partition("b").access([10, 11])
    for block in range(100):
        pool.partition("a").access([block])
    assert pool.partition("b").access([10, 11]) == 2
    assert pool.usage("a") == 2 and pool.used == 4


def test_quota_changes_take_effect_immediately():
    pool = IsolatedLRU({"a": 4, "b": 4})
    a = pool.partition("a")
    a.access([1, 2, 3, 4])
    pool.partition("b").access([9])
    assert pool.set_quota("a", 1) == 3
    assert list(a) == [1] and pool.usage("b") == 1
    # A growing salt starts with the space empty: the evicted blocks do not come back.
    pool.set_quota("a", 4)
    assert a.access([1, 2]) == 1
    assert pool.delete_quota("a") == 2
    assert pool.quota("a") is None and pool.usage("a") == 0
    assert pool.quotas() == {"b": 4}
    assert pool.salts() == ["a", "b"]
    assert pool.partition("a") is a
