"""What the telemetry loop writes and remembers: a deployment's first `status.kv` once it carries rates and
hit ratios, later ones on material change only; the quota each replica's server reported, while fresh."""

import time

from kvtier.controllers.runtime import OperatorConfig
from kvtier.controllers.telemetry import TelemetryLoop
from kvtier.telemetry.metrics import OperatorMetrics
from kvtier.telemetry.report import metrics_condition
from kvtier.telemetry.scraper import Scrape
from kvtier.telemetry.stats import HitRatio, Summary
from kvtier.telemetry.targets import target_of
from tests.unit.test_telemetry_prometheus_source import DEPLOYMENT, KEY, FakeKube
from tests.unit.test_telemetry_targets import replica

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


def test_a_replicas_served_quota_is_known_only_while_its_last_read_is_fresh():
    loop = TelemetryLoop(
        OperatorConfig(scrape_interval_seconds=8, scrape_timeout_seconds=6), FakeKube(), OperatorMetrics()
    )
    assert loop.config.stale_seconds == 30
    loop.observe("ADDED", DEPLOYMENT)
    target = target_of(replica("chat-0"))
    assert loop.scraped_quota_bytes("ns", "chat", "chat-0", now=100.0) is None  # never read
    loop._served(Scrape(target, "quota", 100.0, 0.01, data={"limit_gb": 4.0, "current_usage_gb": 1.0}))
    assert loop.scraped_quota_bytes("ns", "chat", "chat-0", now=120.0) == 4 * 2**30
    assert loop.scraped_quota_bytes("ns", "chat", "chat-0", now=131.0) is None  # the server may have lost it since
    # A server that lost its quota (a restarted container) reports none.
    loop._served(Scrape(target, "quota", 140.0, 0.01, data={"limit_gb": 0, "current_usage_gb": 0, "exists": False}))
    assert loop.scraped_quota_bytes("ns", "chat", "chat-0", now=141.0) is None
    loop.observe("DELETED", DEPLOYMENT)
    assert loop.served_quotas == {}


async def test_a_restarted_operator_writes_only_what_moved_since_the_status_it_finds():
    from kvtier.telemetry.report import kv_status

    condition = metrics_condition(SECOND, 1)
    found = {
        "kv": kv_status(SECOND),
        "conditions": [
            {"type": "MetricsAvailable", "status": condition[0], "reason": condition[1], "message": condition[2]}
        ],
    }
    loop = TelemetryLoop(OperatorConfig(status_interval_seconds=30), FakeKube(), OperatorMetrics())
    loop.observe("ADDED", {**DEPLOYMENT, "status": found})
    await write(loop, FIRST, now=85.0)
    assert loop.kube.patches == [], "its first scrape has no rates yet: not compared with the rates written"
    await write(loop, SECOND, now=100.0)
    assert loop.kube.patches == [], "the object already says this"
    moved = Summary(**{**SECOND.__dict__, "prompt_tokens_per_second": 2400.0})
    await write(loop, moved, now=115.0)
    (patch,) = [patch for *_, patch in loop.kube.patches]
    assert patch["status"]["kv"]["promptTokensPerSecond"] == 2400.0


def test_the_numbers_a_status_kv_says_read_back_within_its_rounding():
    from kvtier.telemetry.report import kv_status, written_summary
    from kvtier.telemetry.stats import materially_changed

    summary = Summary(**{**SECOND.__dict__, "ttft_p50_seconds": 0.123456, "storage_used_bytes": 3.5 * 2**30})
    read = written_summary(kv_status(summary), like=summary)
    assert read is not None and not materially_changed(read, summary)
    assert read.storage_used_bytes == 3.5 * 2**30 and read.ttft_p50_seconds == 0.1235
    assert written_summary({"hitRatio": {"total": 0.3}}, like=summary) is None  # no telemetry wrote it
    assert written_summary({"sampledAt": "2026-12-07T00:00:00Z", "hitRatio": {"total": "high"}}, like=summary) is None


async def test_a_cycle_writes_the_deployments_statuses_concurrently_within_a_bound():
    import asyncio

    from kvtier.controllers import telemetry
    from kvtier.telemetry.scraper import Scraper

    class SlowKube(FakeKube):
        in_flight = most = 0

        async def patch(self, *args, **kwargs):
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            await asyncio.sleep(0.05)  # a loaded apiserver
            self.in_flight -= 1
            return await super().patch(*args, **kwargs)

    loop = TelemetryLoop(OperatorConfig(status_interval_seconds=30), SlowKube(), OperatorMetrics())
    count = telemetry.STATUS_WRITES_IN_FLIGHT + 8
    for index in range(count):
        metadata = {**DEPLOYMENT["metadata"], "name": f"chat-{index}", "uid": f"u-{index}"}
        loop.observe("ADDED", {**DEPLOYMENT, "metadata": metadata})
    async with Scraper(timeout=1) as scraper:
        await loop.cycle(scraper)  # nothing to scrape yet: every deployment gets MetricsAvailable Unknown
    assert len(loop.kube.patches) == count
    assert loop.kube.most == telemetry.STATUS_WRITES_IN_FLIGHT


class _SlowScraper:
    """Scrapes the first target at once and each next one `seconds` later, then calls `meanwhile`."""

    PAGE = (
        "# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens_total 10\n"
        "# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total 1\nvllm:kv_cache_usage_perc 0.4\n"
    )

    def __init__(self, seconds=0.0, meanwhile=None):
        self.seconds, self.meanwhile = seconds, meanwhile

    async def scrape_all(self, targets):
        import asyncio

        from kvtier.telemetry.exposition import parse_exposition

        scrapes = []
        for index, target in enumerate(targets):
            if index:
                await asyncio.sleep(self.seconds)
            scrapes.append(Scrape(target, "vllm", time.time(), 0.0, page=parse_exposition(self.PAGE)))
        if self.meanwhile is not None:
            self.meanwhile()
        return scrapes


def _with_replicas(loop, name="chat", uid="u-1", replicas=2):
    """An InferenceDeployment that needs only vLLM's numbers (no LMCache), and its Ready replicas."""
    metadata = {**DEPLOYMENT["metadata"], "name": name, "uid": uid}
    body = {**DEPLOYMENT, "metadata": metadata, "spec": {"kvCache": {"mode": "None"}}}
    loop.observe("ADDED", body)
    for index in range(replicas):
        loop.targets.apply("ADDED", replica(f"{name}-{index}", deployment=name, ip=f"127.1.{uid[-1]}.{index + 1}"))
    return body


def _condition(loop, name):
    """The MetricsAvailable condition of the last status patch of deployment `name`."""
    patch = [patch for _, _, patched, _, patch in loop.kube.patches if patched == name][-1]
    return next(c for c in patch["status"]["conditions"] if c["type"] == "MetricsAvailable")


async def test_a_replica_scraped_early_in_a_cycle_that_overran_is_not_stale_at_its_end():
    """The loop's own slowness is not the replicas': 1,000 replicas on a saturated machine took 83 s a cycle,
    longer than the 50 s after which a replica counts as stale, and MetricsAvailable flapped for all of them."""
    config = OperatorConfig(scrape_interval_seconds=0.1, scrape_timeout_seconds=0.1, status_interval_seconds=0)
    assert config.stale_seconds == 0.4
    loop = TelemetryLoop(config, FakeKube(), OperatorMetrics())
    _with_replicas(loop)
    for _ in range(2):  # the first status.kv waits for the second sample
        await loop.cycle(_SlowScraper(seconds=0.6))
    assert _condition(loop, "chat")["status"] == "True", _condition(loop, "chat")
    assert 0.4 < loop.lag_seconds < 1.0  # the cycle took 0.6 s and more, against an interval of 0.1 s
    # A replica whose newest sample is older than the staleness time plus the overrun is stale.
    window, later = loop.deployments[KEY].window, time.time() + 1.2
    stale = window.summary(later, lag_seconds=0.6).stale
    assert stale is not None and "no sample in the last 0.4 s" in stale
    # The reason does not move with the lag: if it did, every cycle would be a material change, a status write.
    assert window.summary(later, lag_seconds=0.7).stale == stale


async def test_a_deployment_deleted_while_its_replicas_are_scraped_does_not_fail_the_cycle():
    loop = TelemetryLoop(OperatorConfig(status_interval_seconds=0), FakeKube(), OperatorMetrics())
    deleted = _with_replicas(loop, "chat", "u-1")
    _with_replicas(loop, "other", "u-2")
    await loop.cycle(_SlowScraper())
    assert loop.kube.patches == []  # the first status.kv waits for the second sample
    await loop.cycle(_SlowScraper(meanwhile=lambda: loop.observe("DELETED", deleted)))
    assert [name for _, _, name, _, _ in loop.kube.patches] == ["other"]
    assert _condition(loop, "other")["reason"] != "MetricsStale"


def test_every_handler_on_the_watch_streams_runs_on_the_event_loop():
    """Handlers that share state with the telemetry loop and the rebalance rounds are coroutines: kopf runs a
    plain function on its thread pool, where it once changed the telemetry's deployments while a cycle
    iterated them."""
    import inspect

    from kvtier.controllers import build_registry

    registry = build_registry(OperatorConfig())
    handlers = [
        handler
        for kind in (registry._indexing, registry._watching, registry._spawning, registry._changing)
        for handler in kind.get_all_handlers()
    ]
    assert len(handlers) > 20
    assert [handler.id for handler in handlers if not inspect.iscoroutinefunction(handler.fn)] == []
