"""Block caches with prefix semantics, as ``scenarios/README.md`` defines them.

A request's prompt is a sequence of block ids. It hits block k only if it also hits blocks
0..k-1, so its hits are the longest resident prefix. After the lookup all its blocks become
resident, touched from the last to the first (block 0 ends up most recent), and the least
recently used blocks beyond the capacity are evicted.

Eviction runs once after all of a request's blocks are touched. The survivors are the same as
with an eviction after every single touch (both keep the top ``capacity`` of the LRU stack),
and no block of the request is evicted and re-inserted within one request.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence


class LRUCache:
    """An LRU over block ids with a live-resizable capacity (in blocks)."""

    __slots__ = ("_blocks", "_capacity", "evicted")

    def __init__(self, capacity: int = 0) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        # Block id -> None, least recently used first.
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self._capacity = capacity
        #: Blocks evicted so far (by inserts and by shrinking).
        self.evicted = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: int) -> bool:
        return block in self._blocks

    def __iter__(self) -> Iterator[int]:
        """Resident blocks, least recently used first."""
        return iter(self._blocks)

    def resize(self, capacity: int) -> int:
        """Set the capacity; a shrink evicts the LRU tail at once. Returns the blocks evicted."""
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self._capacity = capacity
        return self._evict()

    def clear(self) -> None:
        self.evicted += len(self._blocks)
        self._blocks.clear()

    def prefix_hits(self, blocks: Sequence[int], start: int = 0) -> int:
        """How many consecutive blocks from ``blocks[start]`` on are resident (no state change)."""
        resident = self._blocks
        hits = 0
        for index in range(start, len(blocks)):
            if blocks[index] not in resident:
                break
            hits += 1
        return hits

    def touch(self, blocks: Sequence[int]) -> int:
        """Make all ``blocks`` resident, touched last to first; returns the blocks evicted."""
        resident = self._blocks
        move = resident.move_to_end
        for block in reversed(blocks):
            if block in resident:
                move(block)
            else:
                resident[block] = None
        return self._evict()

    def access(self, blocks: Sequence[int]) -> int:
        """Look a request up, then store it: returns its hit blocks (the resident prefix)."""
        resident = self._blocks
        hits = 0
        for block in blocks:
            if block not in resident:
                break
            hits += 1
        move = resident.move_to_end
        for index in range(len(blocks) - 1, hits - 1, -1):
            block = blocks[index]
            if block in resident:
                move(block)
            else:
                resident[block] = None
        for index in range(hits - 1, -1, -1):
            move(blocks[index])
        if len(resident) > self._capacity:
            self._evict()
        return hits

    def _evict(self) -> int:
        resident = self._blocks
        excess = len(resident) - self._capacity
        if excess <= 0:
            return 0
        if self._capacity == 0:
            resident.clear()
        else:
            pop = resident.popitem
            for _ in range(excess):
                pop(last=False)
        self.evicted += excess
        return excess


class IsolatedLRU:
    """Per-salt LRU lists with per-salt quotas, like LMCache's ``IsolatedLRU`` eviction policy.

    Each salt (one tenant, LMCache's ``cache_salt``) owns an :class:`LRUCache` whose capacity is
    its quota in blocks; a salt without a quota has a limit of 0 and retains nothing. Salts never
    evict each other's blocks.

    Quotas are enforced immediately, not per eviction cycle: a request never leaves its salt over
    quota, and :meth:`set_quota` evicts a shrinking salt's LRU tail at once. LMCache's controller
    does the same about once a second (and, with its trigger watermark, evicts a little earlier);
    at trace time scales the difference is negligible, and immediate enforcement makes a
    partition behave exactly like an LRU of its quota. A growing salt gains empty space.
    The sum of quotas is not checked against any capacity: dividing a pool is the caller's job.
    """

    __slots__ = ("_partitions", "_quotas")

    def __init__(self, quotas: Mapping[str, int] | None = None) -> None:
        self._partitions: dict[str, LRUCache] = {}
        self._quotas: dict[str, int] = {}
        for salt, blocks in (quotas or {}).items():
            self.set_quota(salt, blocks)

    def partition(self, salt: str) -> LRUCache:
        """The salt's LRU (created empty with capacity = its quota); the same object for the salt's life."""
        cache = self._partitions.get(salt)
        if cache is None:
            cache = self._partitions[salt] = LRUCache(self._quotas.get(salt, 0))
        return cache

    def set_quota(self, salt: str, blocks: int) -> int:
        """Set a salt's quota in blocks; returns the blocks evicted by a shrink."""
        if blocks < 0:
            raise ValueError(f"quota must be >= 0 blocks, got {blocks}")
        self._quotas[salt] = blocks
        return self.partition(salt).resize(blocks)

    def delete_quota(self, salt: str) -> int:
        """Remove a salt's quota: its limit becomes 0 and its blocks are evicted."""
        self._quotas.pop(salt, None)
        return self.partition(salt).resize(0)

    def quota(self, salt: str) -> int | None:
        """The salt's quota in blocks, or None when it has none (an effective limit of 0)."""
        return self._quotas.get(salt)

    def quotas(self) -> dict[str, int]:
        return dict(self._quotas)

    def usage(self, salt: str) -> int:
        """Blocks the salt holds."""
        cache = self._partitions.get(salt)
        return len(cache) if cache is not None else 0

    def salts(self) -> list[str]:
        """Every salt given a quota or a partition so far, in first-seen order."""
        return list(self._partitions)

    @property
    def used(self) -> int:
        """Blocks held by all salts."""
        return sum(len(cache) for cache in self._partitions.values())
