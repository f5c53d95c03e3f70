"""When the telemetry loop writes a deployment's status: its first `status.kv` once it carries rates and
hit ratios, later ones on material change only."""

from kvtier.controllers.runtime import OperatorConfig
from kvtier.controllers.telemetry import TelemetryLoop
from kvtier.telemetry.metrics import OperatorMetrics
from kvtier.telemetry.report import metrics_condition
from kvtier.telemetry.stats import HitRatio, Summary
from tests.unit.test_telemetry_prometheus_source import DEPLOYMENT, KEY, FakeKube

#: One replica seen once: nothing measured over time yet.
FIRST = Summary(replicas=1, hbm_watermark_mean=0.4, hbm_watermark_max=0.4, span_seconds=0.0)
#: The next scrape: rates and hit ratios over the 15 s between the two.
SECOND = Summary(
    replicas=1,
    hbm_watermark_mean=0.4,
    hbm_watermark_max=0.4,
    hit_ratio=HitRatio(0.1, 0.05, 0.2, 0.35),
    prompt_tokens_per_second=1200.0,
    preemptions_per_second=0.0,
    span_seconds=15.0,
)


async def write(loop, summary, now):
    deployment = loop.deployments[KEY]
    await loop._write(KEY, deployment, summary, metrics_condition(summary, 1), now)


async def test_the_first_status_kv_waits_for_the_scrape_that_brings_rates_and_hit_ratios():
    loop = TelemetryLoop(OperatorConfig(status_interval_seconds=30), FakeKube(), OperatorMetrics())
    loop.observe("ADDED", DEPLOYMENT)
    await write(loop, FIRST, now=100.0)
    assert loop.kube.patches == [], "a summary without rates is not written"
    await write(loop, SECOND, now=115.0)
    (patch,) = [patch for *_, patch in loop.kube.patches]
    kv = patch["status"]["kv"]
    assert kv["promptTokensPerSecond"] == 1200.0 and kv["hitRatio"]["total"] == 0.35 and "sampledAt" in kv
    # Unchanged numbers are not written again, even once the status interval has passed (the watch
    # brings the written status back).
    loop.observe("MODIFIED", {**DEPLOYMENT, "status": patch["status"]})
    await write(loop, SECOND, now=160.0)
    assert len(loop.kube.patches) == 1


async def test_a_stale_first_summary_is_written_at_once_to_say_why():
    loop = TelemetryLoop(OperatorConfig(status_interval_seconds=30), FakeKube(), OperatorMetrics())
    loop.observe("ADDED", DEPLOYMENT)
    stale = Summary(replicas=1, span_seconds=0.0, stale="replica chat-0: no sample in the window")
    await write(loop, stale, now=100.0)
    (patch,) = [patch for *_, patch in loop.kube.patches]
    condition = next(c for c in patch["status"]["conditions"] if c["type"] == "MetricsAvailable")
    assert condition["status"] == "False" and "no sample" in condition["message"]
