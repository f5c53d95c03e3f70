"""Live demand: scraped probe pages and engine counters -> a deployment's curve in pool units."""

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kvtier.probe.demand import DemandProbe
from kvtier.rebalance.demand import DemandBook, Geometry, counter_reading_of, probe_reading_of
from kvtier.rebalance.estimator import DemandEstimator
from kvtier.sim.policies import probe_reading
from kvtier.telemetry.engines import Snapshot, replica_snapshot
from kvtier.telemetry.exposition import parse_exposition
from tests.unit.test_rebalance_estimator import _feed, _requests


def _scraped(probe: DemandProbe) -> Snapshot:
    """The probe's /metrics page as telemetry sees it: rendered by prometheus-client, parsed, read."""
    registry = CollectorRegistry()
    registry.register(probe)
    return replica_snapshot(probe=parse_exposition(generate_latest(registry)))


@pytest.mark.parametrize("window", [0.0, 1800.0])
def test_a_scraped_probe_page_is_the_reading_of_the_probe_itself(window):
    probe = DemandProbe(64, window_seconds=window, tick_seconds=1)
    _feed(probe, _requests(5, 120), 0.0, 0.1)
    probe.advance(12.0)
    scraped, direct = probe_reading_of(_scraped(probe), 12.0), probe_reading(probe, 12.0)
    assert scraped is not None and direct.decay_ticks > 0
    assert scraped.bounds == pytest.approx(direct.bounds) and scraped.cumulative == pytest.approx(direct.cumulative)
    assert (scraped.total, scraped.lookups, scraped.decay_ticks) == pytest.approx(
        (direct.total, direct.lookups, direct.decay_ticks)
    )
    assert scraped.decay_per_tick == pytest.approx(direct.decay_per_tick)


def test_a_page_without_the_probe_or_counters_gives_no_reading():
    assert probe_reading_of(Snapshot(), 1.0) is None
    assert counter_reading_of(Snapshot(lmcache_requested=10.0, lmcache_hit_l2=2.0), 1.0, 4096) is None
    reading = counter_reading_of(
        Snapshot(lmcache_requested=10.0, lmcache_hit_l2=2.0, storage_quota_bytes=3 * 4096.0, lmcache_lookups=4.0),
        1.0,
        4096,
    )
    assert (reading.quota_units, reading.requested_tokens, reading.storage_hit_tokens, reading.lookups) == (3, 10, 2, 4)


GEOMETRY = Geometry(unit_bytes=2 * 4096, chunk_bytes=4096, chunk_tokens=3, front_chunks=0)


def test_the_book_gives_the_estimators_curve_summed_over_replicas():
    """Two replicas with the same load: the deployment's curve at 2c units is twice one replica's at c."""
    requests = _requests(11)
    book = DemandBook(stale_seconds=30)
    reference = DemandEstimator(half_life_seconds=1e9, stale_seconds=30)
    for pod in ("d-0", "d-1"):
        probe = DemandProbe(128)
        book.observe(("ns", "d"), pod, 0.0, _scraped(probe))
        if pod == "d-0":
            reference.observe_probe(probe_reading(probe, 0.0))
        _feed(probe, requests, 0.0, 0.01)
        book.observe(("ns", "d"), pod, 5.0, _scraped(probe))
        if pod == "d-0":
            reference.observe_probe(probe_reading(probe, 5.0))
    estimate = book.estimate(("ns", "d"), 5.0, replicas=2, units=64, geometry=GEOMETRY, half_life_seconds=1e9)
    one = reference.estimate(5.0, 64, unit_chunks=2, chunk_tokens=3)
    assert estimate.source == "probe" and not estimate.stale
    for units in (2, 8, 32, 64):
        assert estimate.curve[units] == pytest.approx(2 * one.curve[units // 2])
    assert estimate.access_tokens_per_second == pytest.approx(2 * one.access_tokens_per_second)
    assert one.mean_prompt_tokens > 0 and estimate.mean_prompt_tokens == pytest.approx(one.mean_prompt_tokens)


def test_unknown_silent_or_forgotten_deployments_are_stale():
    book = DemandBook(stale_seconds=10)
    assert book.estimate(("ns", "none"), 0.0, replicas=1, units=8, geometry=GEOMETRY, half_life_seconds=5).stale
    probe = DemandProbe(64)
    book.observe(("ns", "d"), "d-0", 0.0, _scraped(probe))
    _feed(probe, _requests(2, 40), 0.0, 0.1)
    book.observe(("ns", "d"), "d-0", 4.0, _scraped(probe))
    assert not book.estimate(("ns", "d"), 4.0, replicas=1, units=8, geometry=GEOMETRY, half_life_seconds=5).stale
    # No scrape for longer than stale_seconds: frozen, not guessed.
    assert book.estimate(("ns", "d"), 30.0, replicas=1, units=8, geometry=GEOMETRY, half_life_seconds=5).stale
    book.forget(("ns", "d"), pods=[])
    assert book.estimate(("ns", "d"), 4.0, replicas=1, units=8, geometry=GEOMETRY, half_life_seconds=5).stale


def test_the_storage_hit_rate_is_measured_over_the_window():
    book = DemandBook(stale_seconds=10)
    for pod, rate in (("d-0", 100.0), ("d-1", 50.0)):
        for second in range(0, 21, 5):
            book.observe(("ns", "d"), pod, float(second), Snapshot(lmcache_hit_l2=rate * second))
    assert book.storage_hit_rate([("ns", "d")], 20.0, 10.0) == pytest.approx(150.0)
    assert book.storage_hit_rate([("ns", "other")], 20.0, 10.0) is None
