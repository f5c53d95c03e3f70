"""Exact LRU stack distances with prefix semantics against brute-force LRU simulation,
and the trace facts of ``shared/traces/README.md`` reproduced from them."""

import pathlib
import random
from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.probe.stackdist import (
    INFINITE,
    DistanceHistogram,
    StackDistanceTracker,
    WindowedStackDistance,
    epoch_histograms,
    stream_histogram,
)
from kvtier.sim.cache import LRUCache
from kvtier.sim.trace import load_trace
from tests.conftest import SHARED

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRACES = SHARED / "traces" / "mooncake"


def brute_force_hits(requests, capacity):
    """An LRU kept as a plain list (most recent first), evicting after every single touch."""
    stack: list[int] = []
    hits = 0
    for blocks in requests:
        resident = set(stack)
        for block in blocks:
            if block not in resident:
                break
            hits += 1
        for block in reversed(blocks):
            if block in stack:
                stack.remove(block)
            stack.insert(0, block)
            del stack[capacity:]
    return hits


requests_strategy = st.lists(st.lists(st.integers(0, 12), max_size=6), max_size=40)


@settings(max_examples=300, deadline=None)
@given(requests_strategy)
def test_stack_distance_curve_equals_brute_force_lru_at_every_capacity(requests):
    histogram = stream_histogram(requests)
    distinct = len({block for blocks in requests for block in blocks})
    assert histogram.total == sum(len(blocks) for blocks in requests)
    curve = histogram.hit_curve(distinct + 1)
    for capacity in range(distinct + 2):
        expected = brute_force_hits(requests, capacity)
        assert histogram.hits(capacity) == expected == curve[capacity]
        cache = LRUCache(capacity)
        assert sum(cache.access(blocks) for blocks in requests) == expected
    assert histogram.reused == brute_force_hits(requests, distinct + 1)


@settings(max_examples=200, deadline=None)
@given(requests_strategy, st.integers(1, 8))
def test_a_bounded_tracker_is_exact_up_to_its_bound(requests, max_blocks):
    histogram = stream_histogram(requests, max_blocks=max_blocks)
    for capacity in range(max_blocks + 1):
        assert histogram.hits(capacity) == brute_force_hits(requests, capacity)


@settings(max_examples=200, deadline=None)
@given(requests_strategy)
def test_effective_distance_is_the_running_max_of_raw_positions(requests):
    """Effective distance of block k = max over j <= k of block j's position in the stack before the request."""
    tracker = StackDistanceTracker()
    stack: list[int] = []  # most recent first
    for blocks in requests:
        raw = [stack.index(b) + 1 if b in stack else INFINITE for b in blocks]
        expected = [max(raw[: k + 1]) for k in range(len(raw))]
        assert tracker.access(blocks) == expected
        for block in reversed(blocks):
            if block in stack:
                stack.remove(block)
            stack.insert(0, block)


def _random_stream(seed, requests=4000, universe=300):
    rng = random.Random(seed)
    stream = []
    for _ in range(requests):
        start = rng.randrange(universe)
        stream.append([(start + step * rng.choice((1, 7))) % universe for step in range(rng.randrange(1, 9))])
    return stream


@pytest.mark.parametrize("max_blocks", [None, 40])
def test_long_streams_that_renumber_the_timeline_stay_exact(max_blocks):
    stream = _random_stream(seed=7)
    histogram = stream_histogram(stream, max_blocks=max_blocks)
    for capacity in (1, 5, 17, 40, 120, 300):
        if max_blocks is not None and capacity > max_blocks:
            continue
        cache = LRUCache(capacity)
        assert histogram.hits(capacity) == sum(cache.access(blocks) for blocks in stream)
    if max_blocks is not None:
        tracker = StackDistanceTracker(max_blocks)
        for blocks in stream:
            tracker.access(blocks)
        assert len(tracker) == max_blocks


def test_epoch_histograms_split_a_whole_stream_computation():
    stream = _random_stream(seed=3, requests=500)
    timed = [(index * 0.5, blocks) for index, blocks in enumerate(stream)]
    epochs = epoch_histograms(timed, epoch_seconds=60)
    assert len(epochs) == 5  # arrivals 0 .. 249.5 s
    whole = stream_histogram(stream)
    merged = DistanceHistogram()
    for histogram in epochs:
        merged.merge(histogram)
    assert merged.counts == whole.counts and merged.cold == whole.cold
    # Epoch 1 continues the stack of epoch 0: its distances equal the whole stream's for its requests.
    tracker = StackDistanceTracker()
    second = DistanceHistogram()
    for arrival, blocks in timed:
        distances = tracker.access(blocks)
        if 60 <= arrival < 120:
            second.add(distances)
    assert epochs[1].counts == second.counts
    with pytest.raises(ValueError):
        epoch_histograms(timed, 0)


def test_histogram_queries_and_decay():
    histogram = DistanceHistogram()
    histogram.add([1, 1, 3, INFINITE])
    assert histogram.total == 4 and histogram.reused == 3 and histogram.cold == 1
    assert [histogram.hits(c) for c in range(5)] == [0, 2, 2, 3, 3]
    assert histogram.hit_curve(3) == [0, 2, 2, 3]
    assert histogram.hit_ratio(3) == 0.75
    copy = histogram.copy()
    histogram.scale(0.5)
    assert histogram.hits(3) == 1.5 and histogram.cold == 0.5
    assert copy.hits(3) == 3
    assert DistanceHistogram().hit_ratio(10) == 0.0


def test_a_decaying_window_follows_a_phase_change():
    def replay(decay):
        window = WindowedStackDistance(max_blocks=100, decay=decay)
        for _ in range(10):  # phase 1: a loop over 20 blocks (each reuse at distance 20)
            for block in range(20):
                window.access([block])
        for _ in range(10):  # phase 2: a loop over 5 other blocks, one interval per pass
            window.tick()
            for block in range(1000, 1005):
                window.access([block])
        return window

    window = replay(decay=0.5)
    histogram = window.histogram
    # Phase 1's 180 reuses at distance 20 now weigh 2**-10 each: growing from 5 to 20 blocks gains ~nothing.
    assert histogram.hits(20) - histogram.hits(5) == 180 * 0.5**10
    assert histogram.hits(5) > 0.95 * histogram.total
    assert len(window.tracker) == 25
    remembered = replay(decay=1.0).histogram
    assert remembered.hits(20) - remembered.hits(5) == 180
    with pytest.raises(ValueError):
        WindowedStackDistance(10, decay=0)
    with pytest.raises(ValueError):
        StackDistanceTracker(0)


# The trace facts (shared/traces/README.md): unique blocks, accesses, infinite-cache hit ratio,
# and the LRU hit ratio at 1/5/10/25/50% of the unique blocks.
FACTS = {
    "conversation": (182_790, 288_500, 0.366, [0.053, 0.196, 0.279, 0.354, 0.363]),
    "synthetic": (43_924, 121_877, 0.640, [0.038, 0.157, 0.262, 0.444, 0.589]),
}
FRACTIONS = [0.01, 0.05, 0.10, 0.25, 0.50]


@pytest.fixture(scope="module", params=sorted(FACTS))
def trace(request):
    path = TRACES / f"mooncake_{request.param}_trace.jsonl"
    if not path.exists():
        pytest.skip(f"trace fixture {path} is absent (expected beside the repository in shared/traces)")
    requests = load_trace(path)
    return request.param, requests, stream_histogram(r.blocks for r in requests)


def test_trace_facts_from_one_stack_distance_pass(trace):
    name, requests, histogram = trace
    unique, accesses, infinite, points = FACTS[name]
    assert len({block for r in requests for block in r.blocks}) == unique
    assert histogram.total == accesses
    assert histogram.reused / histogram.total == pytest.approx(infinite, abs=0.002)
    for fraction, expected in zip(FRACTIONS, points):
        assert histogram.hit_ratio(int(unique * fraction)) == pytest.approx(expected, abs=0.002)


def test_trace_facts_by_replaying_the_cache_model(trace):
    name, requests, histogram = trace
    unique = FACTS[name][0]
    for fraction in FRACTIONS:
        cache = LRUCache(int(unique * fraction))
        assert sum(cache.access(r.blocks) for r in requests) == histogram.hits(int(unique * fraction))


def _ordered_dict_lru_hits(requests, capacity):
    """Another independent LRU: eviction after every touch, on an OrderedDict."""
    resident: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for blocks in requests:
        for block in blocks:
            if block not in resident:
                break
            hits += 1
        for block in reversed(blocks):
            resident.pop(block, None)
            resident[block] = None
            if len(resident) > capacity:
                resident.popitem(last=False)
    return hits


def test_stack_distances_match_brute_force_on_a_trace_prefix(trace):
    _, requests, _ = trace
    prefix = [r.blocks for r in requests[:1500]]
    histogram = stream_histogram(prefix)
    for capacity in (10, 100, 500, 2000, 8000):
        assert histogram.hits(capacity) == _ordered_dict_lru_hits(prefix, capacity)
    bounded = stream_histogram(prefix, max_blocks=2000)
    for capacity in (100, 2000):
        assert bounded.hits(capacity) == histogram.hits(capacity)
