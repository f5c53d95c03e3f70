"""status.kv, MetricsAvailable and alert Events from deployment summaries."""

from datetime import UTC, datetime

import pytest

from kvtier.api.inferencedeployment import KVStatus
from kvtier.probe.demand import HitCurve
from kvtier.telemetry.report import AlertRules, Alerts, kv_status, metrics_condition, percent, seconds
from kvtier.telemetry.stats import HitRatio, Summary

SUMMARY = Summary(
    replicas=2,
    hbm_watermark_mean=0.4567891,
    hbm_watermark_max=0.9,
    prompt_tokens_per_second=100.0,
    hit_ratio=HitRatio(hbm=0.5, cpu=0.1, storage=0.2, total=0.8),
    ttft_p50_seconds=0.123456,
    ttft_p99_seconds=1.5,
    preemptions_per_second=0.0,
    storage_quota_bytes=2**40,
    storage_used_bytes=3 * 2**30,
    demand=HitCurve(capacities=tuple(float(2**k) for k in range(20)), hits=tuple(range(20)), total=20),
    demand_unit="bytes",
)


def test_kv_status_is_rounded_valid_and_leaves_the_quota_to_the_reconcile():
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    kv = kv_status(SUMMARY, at)
    assert kv["hbmWatermark"] == 0.4568 and kv["hbmWatermarkMax"] == 0.9
    assert kv["hitRatio"] == {"hbm": 0.5, "cpu": 0.1, "storage": 0.2, "total": 0.8}
    assert kv["ttftP50Seconds"] == 0.1235 and kv["preemptionsPerSecond"] == 0.0
    assert kv["storage"] == {"used": "3Gi"} and kv["sampledAt"] == "2026-01-02T03:04:05Z"
    points = kv["demand"]["points"]
    assert kv["demand"]["unit"] == "bytes" and 1 < len(points) <= 8
    assert points[-1] == {"capacity": 2**19, "hitRatio": 0.95}
    assert [p["capacity"] for p in points] == sorted(p["capacity"] for p in points)
    assert all(type(p["capacity"]) is int for p in points)  # `kubectl describe` prints 524288, not 5.24288e+05
    assert kv["promptTokensPerSecond"] == 100.0
    assert kv["shown"] == {"hbmWatermark": "46%", "hitRatio": "80%", "storageHitRatio": "20%", "ttftP50": "123ms"}
    KVStatus.model_validate(kv)  # the CRD's schema accepts it


@pytest.mark.parametrize(("ratio", "text"), [(0.923, "92%"), (1.0, "100%"), (0.045, "4.5%"), (0.0, "0%"), (None, None)])
def test_percentages_for_people(ratio, text):
    assert percent(ratio) == text


@pytest.mark.parametrize(
    ("value", "text"), [(0.85, "850ms"), (1.5, "1.5s"), (15.24, "15.2s"), (152.3, "152s"), (0.0, "0ms"), (None, None)]
)
def test_seconds_for_people(value, text):
    assert seconds(value) == text


def test_numbers_that_are_not_known_are_left_out():
    kv = kv_status(
        Summary(replicas=1, hbm_watermark_mean=0.2, hit_ratio=HitRatio(hbm=0.1), storage_used_bytes=float("nan"))
    )
    assert set(kv) == {"hbmWatermark", "hitRatio", "sampledAt", "shown"} and kv["hitRatio"] == {"hbm": 0.1}
    assert kv["shown"] == {"hbmWatermark": "20%"}


@pytest.mark.parametrize(
    "summary, ready, failures, expected",
    [
        (SUMMARY, 2, [], ("True", "MetricsFresh")),
        (None, 0, [], ("Unknown", "NoReadyReplicas")),
        (None, 2, [], ("Unknown", "NotScrapedYet")),
        (Summary(replicas=1, stale="replica chat-1: no sample in the window"), 2, [], ("False", "MetricsStale")),
        (SUMMARY, 2, ["chat-0: vllm: timeout: no answer within 2s"], ("False", "ScrapeFailed")),
    ],
)
def test_metrics_available_says_why(summary, ready, failures, expected):
    status, reason, message = metrics_condition(summary, ready, failures)
    assert (status, reason) == expected and message
    if failures:
        assert failures[0] in message
    if summary is not None and summary.stale:
        assert summary.stale in message


def test_a_watermark_that_stays_high_is_reported_once_and_its_end_too():
    alerts = Alerts(AlertRules(watermark_threshold=0.9, watermark_seconds=10))
    high, low = Summary(replicas=1, hbm_watermark_mean=0.95), Summary(replicas=1, hbm_watermark_mean=0.5)
    assert alerts.observe(0, high) == [] and alerts.observe(9, high) == []
    [(kind, reason, _)] = alerts.observe(10, high)
    assert (kind, reason) == ("Warning", "HBMWatermarkHigh")
    assert alerts.observe(20, high) == []
    assert [e[1] for e in alerts.observe(21, low)] == ["HBMWatermarkNormal"]
    assert alerts.observe(22, low) == []
    assert alerts.observe(23, high) == [] and alerts.observe(30, high) == []  # the clock starts again


def test_a_falling_hit_ratio_is_reported_against_its_peak():
    alerts = Alerts(AlertRules(hit_ratio_drop=0.2))
    at = lambda total, stale=None: Summary(replicas=1, hit_ratio=HitRatio(total=total), stale=stale)  # noqa: E731 - a one-line factory reads best as a lambda
    assert alerts.observe(0, at(0.5)) == [] and alerts.observe(1, at(0.7)) == []
    assert alerts.observe(2, at(0.55)) == []
    assert alerts.observe(3, at(0.1, stale="replica x: no sample")) == []  # stale numbers say nothing
    [(kind, reason, message)] = alerts.observe(4, at(0.45))
    assert (kind, reason) == ("Warning", "HitRatioFell") and "70%" in message and "45%" in message
    assert alerts.observe(5, at(0.4)) == []  # measured from the new level now
