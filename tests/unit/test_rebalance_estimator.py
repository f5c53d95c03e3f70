"""The rebalancer's estimator: probe histograms and engine counters -> demand curves with a confidence."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.probe.demand import DemandProbe
from kvtier.rebalance.estimator import (
    CounterReading,
    DemandEstimator,
    concave_fit,
    confidence,
    deployment_curve,
    interpolate,
    probe_increment,
)
from kvtier.sim.cache import LRUCache
from kvtier.sim.engine import Engine, EngineParams
from kvtier.sim.policies import probe_reading


def _requests(seed, count=300, universe=80):
    """Prompts with shared prefixes (conversations growing turn by turn) over a small universe of blocks."""
    rng = random.Random(seed)
    roots = [[rng.randrange(universe)] for _ in range(12)]
    requests = []
    for _ in range(count):
        prompt = rng.choice(roots)
        if rng.random() < 0.5:
            prompt.append(rng.randrange(universe, 10 * universe))
        requests.append(list(dict.fromkeys(prompt + [rng.randrange(universe) for _ in range(rng.randint(0, 3))])))
    return requests


def _feed(probe, requests, start, step):
    for index, blocks in enumerate(requests):
        probe.record(start + index * step, blocks)


def _lru_hits(requests, capacity):
    cache = LRUCache(capacity)
    return sum(cache.access(blocks) for blocks in requests)


@pytest.mark.parametrize("seed", range(3))
def test_the_probe_curve_is_exactly_a_brute_force_lru_at_every_capacity(seed):
    requests = _requests(seed)
    probe = DemandProbe(64, buckets_per_octave=64)  # a bound at every capacity 1..64
    assert probe.bounds == list(range(1, 65))
    estimator = DemandEstimator(half_life_seconds=1e9, stale_seconds=10)
    estimator.observe_probe(probe_reading(probe, 0.0))
    _feed(probe, requests, 0.0, 0.01)
    estimator.observe_probe(probe_reading(probe, 10.0))
    estimate = estimator.estimate(10.0, 70, unit_chunks=1, chunk_tokens=1)
    assert estimate.source == "probe" and not estimate.stale
    for capacity in range(71):
        # Hits per second x the 10 observed seconds; flat beyond the tracked 64 chunks.
        assert estimate.curve[capacity] * 10 == pytest.approx(_lru_hits(requests, min(capacity, 64)), abs=1e-6)
    assert estimate.access_tokens_per_second * 10 == pytest.approx(sum(map(len, requests)))
    assert estimate.mean_prompt_tokens == pytest.approx(sum(map(len, requests)) / len(requests))


@pytest.mark.parametrize("front", [0, 4, 16])
def test_storage_behind_faster_tiers_adds_only_what_they_miss(front):
    """Exact at the bucket bounds (powers of 2; the faster tier too): the engine's hits with storage c minus without."""
    requests = _requests(7)
    probe = DemandProbe(128)
    estimator = DemandEstimator(half_life_seconds=1e9, stale_seconds=10)
    estimator.observe_probe(probe_reading(probe, 0.0))
    _feed(probe, requests, 0.0, 0.01)
    estimator.observe_probe(probe_reading(probe, 5.0))
    # One unit is 2 chunks of 3 tokens.
    estimate = estimator.estimate(5.0, 64, unit_chunks=2, chunk_tokens=3, front_chunks=front)

    def engine_hits(storage):
        engine = Engine(EngineParams(block_tokens=3, cpu_blocks=front), LRUCache(storage))
        for blocks in requests:
            engine.submit(0.0, blocks, 3 * len(blocks), 1)
        return engine.stats.total_hit_tokens

    without = engine_hits(0)
    for units in (1, 2, 4, 8, 16, 32, 64):
        expected = engine_hits(2 * units) - without
        assert estimate.curve[units] * 5 == pytest.approx(expected, abs=1e-6), units
        if 2 * units <= front:
            assert expected == 0


def _cycle(prompts, base, count):
    """``count`` requests cycling over ``prompts`` prompts of 3 blocks: every reuse distance is 3 x prompts."""
    return [[base + 3 * (index % prompts) + k for k in range(3)] for index in range(count)]


def test_the_window_follows_a_phase_change_within_an_interval_whatever_the_probe_decay():
    """Ten intervals of a small working set (30 chunks), then one of a large one (300 chunks)."""
    interval = 60.0
    old, new = _cycle(10, 0, 4 * 15 * 44), _cycle(100, 10_000, 4 * 15 * 44)
    estimates = {}
    for window in (0.0, 1800.0):  # the probe's own half-life must not matter
        probe = DemandProbe(4096, window_seconds=window, tick_seconds=15)
        estimator = DemandEstimator(half_life_seconds=interval / 4, stale_seconds=45)
        for tick in range(11 * 4):
            now = tick * 15.0
            phase = old if now < 10 * interval else new
            _feed(probe, phase[60 * tick : 60 * (tick + 1)], now, 0.25)
            probe.advance(now + 15)
            estimator.observe_probe(probe_reading(probe, now + 15))
            if now + 15 in (10 * interval, 11 * interval):
                estimates[window, now + 15] = estimator.estimate(now + 15, 512, unit_chunks=1, chunk_tokens=1).curve
    before, after = estimates[0.0, 10 * interval], estimates[0.0, 11 * interval]
    assert before[32] == pytest.approx(before[512]) and before[32] > 0.9 * 4 * 3  # 4 lookups of 3 chunks a second
    assert after[32] < 0.1 * after[512]  # one interval later, the old working set weighs little
    # Within 1%: lookups the probe decayed once between two scrapes weigh 0.994 x.
    assert estimates[1800.0, 11 * interval] == pytest.approx(after, rel=0.01)


def test_a_restarted_probe_starts_the_window_over():
    probe = DemandProbe(64)
    first = probe_reading(probe, 0.0)
    _feed(probe, _requests(3, 50), 0.0, 0.1)
    second = probe_reading(probe, 10.0)
    assert probe_increment(first, second) is not None
    restarted = probe_reading(DemandProbe(64), 20.0)
    assert probe_increment(second, restarted) is None
    estimator = DemandEstimator(30, 60)
    for reading in (first, second, restarted):
        estimator.observe_probe(reading)
    # Nothing observed since the restart: no probe curve; no counters either: stale.
    assert estimator.estimate(20.0, 8, unit_chunks=1, chunk_tokens=1).stale


def _true_ratio(quota):
    return 0.6 * (1 - math.exp(-quota / 40))


def _counter_estimator(quotas, requested_per_scrape=5000.0, lookups_per_scrape=20, noise=0.02, seed=0):
    rng = random.Random(seed)
    estimator = DemandEstimator(half_life_seconds=600, stale_seconds=45)
    requested = hits = lookups = 0.0
    time = 0.0
    estimator.observe_counters(CounterReading(time, quotas[0], 0, 0, 0))
    for quota in quotas:
        time += 15
        requested += requested_per_scrape
        hits += requested_per_scrape * max(0.0, _true_ratio(quota) + rng.uniform(-noise, noise))
        lookups += lookups_per_scrape
        estimator.observe_counters(CounterReading(time, quota, requested, hits, lookups))
    return estimator, time


def test_the_counters_fallback_is_concave_monotone_and_close_to_the_truth():
    quotas = [q for q in (10, 30, 60, 100, 150) for _ in range(8)]
    estimator, now = _counter_estimator(quotas)
    estimate = estimator.estimate(now, 200, unit_chunks=1, chunk_tokens=1)
    assert estimate.source == "counters" and not estimate.stale
    curve = estimate.curve
    assert curve[0] == 0
    assert all(b >= a - 1e-9 for a, b in zip(curve, curve[1:]))
    assert all(curve[i - 1] + curve[i + 1] <= 2 * curve[i] + 1e-6 for i in range(1, len(curve) - 1))
    rate = 5000 / 15
    for quota in (10, 30, 60, 100, 150):
        assert curve[quota] == pytest.approx(rate * _true_ratio(quota), rel=0.1)
    assert curve[200] == curve[150]  # nothing is known beyond the largest quota held


def test_an_interval_whose_quota_changed_is_no_point_of_the_curve():
    estimator, now = _counter_estimator([50, 50, 100, 100])
    points = [(quota, ratio) for _, quota, ratio, _ in estimator._points]
    assert [quota for quota, _ in points] == [50, 50, 100]


def test_confidence_is_low_on_thin_data_and_high_on_plenty():
    thin, now = _counter_estimator([40] * 40, lookups_per_scrape=0.2)
    plenty, later = _counter_estimator([40] * 200, lookups_per_scrape=50)  # five half-lives
    brief, brief_now = _counter_estimator([40] * 2, lookups_per_scrape=50)
    assert thin.estimate(now, 50, unit_chunks=1, chunk_tokens=1).confidence < 0.3
    assert plenty.estimate(later, 50, unit_chunks=1, chunk_tokens=1).confidence > 0.9
    assert brief.estimate(brief_now, 50, unit_chunks=1, chunk_tokens=1).confidence < 0.2  # 30 s of a 600 s window
    assert confidence(1.0, 0, 32) == 0 and confidence(2.0, 1e9, 32) == pytest.approx(1.0)


def test_a_deployment_without_fresh_readings_is_stale_and_counters_stand_in_for_a_silent_probe():
    estimator, now = _counter_estimator([40] * 10)
    probe = DemandProbe(64)
    estimator.observe_probe(probe_reading(probe, 0.0))
    estimator.observe_probe(probe_reading(probe, 15.0))
    assert estimator.estimate(now, 50, unit_chunks=1, chunk_tokens=1).source == "counters"  # the probe went quiet
    assert estimator.estimate(now + 46, 50, unit_chunks=1, chunk_tokens=1).stale
    assert DemandEstimator(30, 45).estimate(0.0, 5, unit_chunks=1, chunk_tokens=1).curve == (0.0,) * 6


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.floats(0, 1), st.floats(0, 10)), max_size=12))
def test_concave_fit_is_a_non_decreasing_concave_majorant(points):
    hull = concave_fit(points)
    assert hull[0] == (0.0, 0.0)
    slopes = [(y1 - y0) / (x1 - x0) for (x0, y0), (x1, y1) in zip(hull, hull[1:])]
    assert all(slope >= 0 for slope in slopes)
    assert all(b <= a + 1e-9 for a, b in zip(slopes, slopes[1:]))
    pooled = {}
    for x, y, weight in points:
        if x > 0 and weight > 0:
            pooled.setdefault(x, []).append((y, weight))
    for x, values in pooled.items():
        mean = sum(y * w for y, w in values) / sum(w for _, w in values)
        assert interpolate(hull, x) >= mean - 1e-9


def test_a_deployment_curve_splits_its_units_between_replicas():
    replica = [0.0, 1.0, 1.5, 1.75]
    assert deployment_curve([replica, replica], 2, 7) == [0.0, 0.0, 2.0, 2.0, 3.0, 3.0, 3.5, 3.5]
    # An unscraped replica counts as the mean of the others.
    assert deployment_curve([replica], 2, 4) == [0.0, 0.0, 2.0, 2.0, 3.0]


def test_a_deployment_curve_is_the_scaled_sum_of_its_replicas_curves_at_each_ones_share():
    """The definition, point by point, for replica curves shorter and longer than the shares asked of them."""
    import random

    rng = random.Random(7)
    for _ in range(200):
        replicas, units = rng.randint(1, 6), rng.randint(0, 300)
        curves = [[rng.random() * k for k in range(rng.randint(1, 120))] for _ in range(rng.randint(1, replicas))]
        scale = replicas / len(curves)
        expected = [
            scale * sum(curve[min(total // replicas, len(curve) - 1)] for curve in curves) for total in range(units + 1)
        ]
        assert deployment_curve(curves, replicas, units) == expected
