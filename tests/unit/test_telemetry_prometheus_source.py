"""`--metrics-source prometheus`: the telemetry loop asks Prometheus the PromQL queries, reads the quota
API and the probe pages from the pods, writes `status.kv` and `MetricsAvailable`, feeds the DemandBook."""

import time

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from kvtier.api.units import format_quantity
from kvtier.controllers.runtime import OperatorConfig
from kvtier.controllers.telemetry import TelemetryLoop
from kvtier.kube import INFERENCEDEPLOYMENTS
from kvtier.probe.demand import DemandProbe
from kvtier.rebalance.demand import DemandBook, Geometry
from kvtier.telemetry.metrics import OperatorMetrics
from kvtier.telemetry.promql import deployment_queries
from kvtier.telemetry.scraper import PrometheusClient, Scraper
from tests.unit.test_telemetry_scraper import address
from tests.unit.test_telemetry_targets import replica

GiB = 1 << 30
KEY = ("ns", "chat")
SELECTOR = 'namespace="ns",pod=~"chat-[0-9]+"'  # what the loop must ask for deployment ns/chat
GEOMETRY = Geometry(unit_bytes=2 * 4096, chunk_bytes=4096, chunk_tokens=3, front_chunks=0)
DEPLOYMENT = {
    "apiVersion": "kvtier.io/v1alpha1",
    "kind": "InferenceDeployment",
    "metadata": {"name": "chat", "namespace": "ns", "uid": "u-1", "resourceVersion": "7", "generation": 2},
    "spec": {"kvCache": {"mode": "LMCacheMP", "storage": {"poolRef": "pool", "request": "4Gi"}}},
}
# What each replica's engines did over the window (Prometheus' increase()), and their gauges.
SERVED = {
    "chat-0": {
        "prompt_tokens": 1000,
        "prefix_cache_hits": 200,
        "external_hits": 300,
        "lmcache_hit_l1": 100,
        "lmcache_hit_l2": 300,
        "preemptions": 30,
        "hbm_watermark": 0.5,
        "hbm_watermark_mean": 0.4,
        "hbm_watermark_max": 0.9,
        "storage_used_bytes": 123,
    },
    "chat-1": {
        "prompt_tokens": 600,
        "prefix_cache_hits": 60,
        "external_hits": 120,
        "lmcache_hit_l1": 40,
        "lmcache_hit_l2": 80,
        "preemptions": 0,
        "hbm_watermark": 0.7,
        "hbm_watermark_mean": 0.6,
        "hbm_watermark_max": 0.8,
        "storage_used_bytes": 456,
    },
}
QUOTAS = {"chat-0": (4.0, 1.0), "chat-1": (4.0, 1.5)}  # limit_gb, current_usage_gb
DEMAND = {"1": 2, "4": 6, "+Inf": 10}  # each pod's probe histogram, as Prometheus last scraped it


def vector(*samples):
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": labels, "value": [time.time(), str(value)]} for labels, value in samples],
        },
    }


def answers():
    """Query name -> (HTTP status, body) for every query of `deployment_queries`."""
    names = deployment_queries(SELECTOR, 300)
    result = {name: (200, vector()) for name in names}
    for name in {name for values in SERVED.values() for name in values}:
        result[name] = (200, vector(*(({"pod": pod}, values[name]) for pod, values in SERVED.items())))
    result["ttft_p50_seconds"] = (200, vector(({}, 0.25)))
    result["ttft_p99_seconds"] = (200, vector(({}, 2)))
    result["demand_chunks"] = (
        200,
        vector(*(({"pod": pod, "le": le}, count) for pod in SERVED for le, count in DEMAND.items())),
    )
    return result


async def serve(app, host, *ports):
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    for port in ports:
        await web.TCPSite(runner, host, port).start()
    return runner


@pytest.fixture
async def prometheus():
    """A fake Prometheus answering `state["answers"]` (by query name) for the exact PromQL text."""
    host, state = address(), {"answers": answers(), "asked": []}
    by_text = {text: name for name, text in deployment_queries(SELECTOR, 300).items()}

    async def query(request):
        text = request.query.get("query", "")
        state["asked"].append(text)
        if text not in by_text:
            return web.json_response(
                {"status": "error", "errorType": "bad_data", "error": f"unexpected: {text}"}, status=400
            )
        status, body = state["answers"][by_text[text]]
        return web.json_response(body, status=status)

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    runner = await serve(app, host, 9090)
    yield f"http://{host}:9090/", state
    await runner.cleanup()


@pytest.fixture
async def pods():
    """Two replicas serving `/quota` (port lmcache-api 8080) and a real probe page (port probe-metrics 9400);
    nothing listens on their vLLM or LMCache metrics ports: Prometheus holds those."""
    runners, probes, bodies = [], {}, []
    for pod, (limit, used) in QUOTAS.items():
        host, probe = address(), DemandProbe(64)
        registry = CollectorRegistry()
        registry.register(probe)

        async def quota(_, limit=limit, used=used):
            return web.json_response({"users": {"_default": {"limit_gb": limit, "current_usage_gb": used}}})

        async def metrics(_, registry=registry):
            return web.Response(body=generate_latest(registry), content_type="text/plain")

        app = web.Application()
        app.router.add_get("/quota", quota)
        app.router.add_get("/metrics", metrics)
        runners.append(await serve(app, host, 8080, 9400))
        probes[pod] = probe
        bodies.append(replica(pod, ip=host))
    yield probes, bodies
    for runner in runners:
        await runner.cleanup()


class FakeKube:
    """What the loop calls: `patch` (status) and `create` (Events)."""

    def __init__(self):
        self.patches, self.events = [], []

    async def patch(self, resource, namespace, name, patch, *, subresource=None, **_):
        self.patches.append((resource, namespace, name, subresource, patch))
        return patch

    async def create(self, resource, body, namespace=None):
        self.events.append(body)
        return body


def make_loop(url, bodies):
    config = OperatorConfig(
        metrics_source="prometheus", prometheus_url=url, status_interval_seconds=0, scrape_timeout_seconds=1
    )
    loop = TelemetryLoop(config, FakeKube(), OperatorMetrics(), DemandBook(config.stale_seconds))
    loop.observe("ADDED", DEPLOYMENT)
    for body in bodies:
        loop.targets.apply("ADDED", body)
    return loop


def condition(patch):
    (found,) = [c for c in patch["status"]["conditions"] if c["type"] == "MetricsAvailable"]
    return found


def feed(probe, start):
    for index in range(40):
        probe.record(start + index, [index % 7, index % 5 + 10, index % 3 + 20])


async def test_status_kv_comes_from_prometheus_and_probes_feed_the_demand_book(prometheus, pods):
    url, state = prometheus
    probes, bodies = pods
    loop = make_loop(url, bodies)

    def estimate():  # 16 units (32 chunks) per replica: every re-access of `feed` hits
        return loop.demand.estimate(KEY, time.time(), replicas=2, units=32, geometry=GEOMETRY, half_life_seconds=60)

    async with Scraper(timeout=1) as scraper:
        prom = PrometheusClient(url, scraper)
        for probe in probes.values():
            feed(probe, 1000.0)
        await loop.cycle(scraper, prom)
        assert estimate().stale  # one probe reading per replica: no increment yet
        for probe in probes.values():
            feed(probe, 1100.0)
        await loop.cycle(scraper, prom)
    assert sorted(set(state["asked"])) == sorted(deployment_queries(SELECTOR, 300).values())
    assert len(state["asked"]) == 2 * len(deployment_queries(SELECTOR, 300))

    resource, namespace, name, subresource, patch = loop.kube.patches[0]
    assert (resource, namespace, name, subresource) == (INFERENCEDEPLOYMENTS, "ns", "chat", "status")
    assert patch["metadata"] == {"resourceVersion": "7"}
    ok = condition(patch)
    assert (ok["status"], ok["reason"], ok["observedGeneration"]) == ("True", "MetricsFresh", 2), ok
    # Independently: tokens summed over replicas, LMCache's hits split L1:L2 per replica.
    prompt = sum(v["prompt_tokens"] for v in SERVED.values())
    hbm = sum(v["prefix_cache_hits"] for v in SERVED.values())
    external = sum(v["external_hits"] for v in SERVED.values())
    storage = sum(
        v["external_hits"] * v["lmcache_hit_l2"] / (v["lmcache_hit_l1"] + v["lmcache_hit_l2"]) for v in SERVED.values()
    )
    kv = patch["status"]["kv"]
    assert kv["hitRatio"] == {
        "hbm": round(hbm / prompt, 4),
        "cpu": round((external - storage) / prompt, 4),
        "storage": round(storage / prompt, 4),
        "total": round((hbm + external) / prompt, 4),
    }
    assert kv["hbmWatermark"] == round((0.4 + 0.6) / 2, 4) and kv["hbmWatermarkMax"] == 0.9
    assert (kv["ttftP50Seconds"], kv["ttftP99Seconds"]) == (0.25, 2.0)
    assert kv["preemptionsPerSecond"] == round(30 / 300, 4)
    assert kv["storage"] == {"used": format_quantity(int((1.0 + 1.5) * GiB))}  # the quota API, not the gauge
    assert kv["demand"] == {
        "unit": "chunks",
        "points": [{"capacity": 1.0, "hitRatio": 0.2}, {"capacity": 4.0, "hitRatio": 0.6}],
    }
    sample = loop.metrics.registry.get_sample_value
    labels = {"namespace": "ns", "deployment": "chat"}
    assert sample("kvtier_deployment_storage_quota_bytes", labels) == 4 * GiB
    assert sample("kvtier_deployment_metrics_stale", labels) == 0
    assert loop.kube.events == []
    # The quota each server reported is known to the deployment pass here too (a resync then calls
    # only replicas whose quota is not in place).
    assert loop.scraped_quota_bytes("ns", "chat", "chat-0") == 4 * GiB
    assert loop.scraped_quota_bytes("ns", "chat", "chat-0", now=time.time() + loop.config.stale_seconds + 1) is None

    fresh = estimate()
    assert not fresh.stale and fresh.source == "probe" and fresh.curve[-1] > 0


@pytest.mark.parametrize("failure", ["error-answer", "http-error", "unreachable"])
async def test_a_failing_prometheus_makes_metrics_unavailable_and_says_why(prometheus, pods, failure):
    url, state = prometheus
    _, bodies = pods
    error = {"status": "error", "errorType": "timeout", "error": "query timed out in expression evaluation"}
    if failure == "error-answer":  # a 200 carrying an error (some proxies), for one query
        state["answers"]["ttft_p99_seconds"] = (200, error)
    elif failure == "http-error":  # what Prometheus itself does: a 4xx/5xx with the error in the body
        state["answers"]["prefix_cache_hits"] = (503, error)
    else:
        url = f"http://{address()}:9090"  # nothing listens there
    loop = make_loop(url, bodies)
    async with Scraper(timeout=1) as scraper:
        await loop.cycle(scraper, PrometheusClient(url, scraper))
    ((_, _, _, _, patch),) = loop.kube.patches
    found = condition(patch)
    assert (found["status"], found["reason"]) == ("False", "ScrapeFailed"), found
    if failure == "unreachable":
        assert "query " in found["message"] and url.split("//")[1] in found["message"], found
    else:
        name = "ttft_p99_seconds" if failure == "error-answer" else "prefix_cache_hits"
        assert f"query {name}: " in found["message"] and "query timed out" in found["message"], found
        assert ("HTTP 503" in found["message"]) == (failure == "http-error")
    # Numbers from part of the series (or none) are not written: status.kv keeps its last ones.
    assert "kv" not in patch["status"], patch
    assert [e["reason"] for e in loop.kube.events] == ["ScrapeFailed"]
    assert (
        loop.metrics.registry.get_sample_value(
            "kvtier_deployment_metrics_stale", {"namespace": "ns", "deployment": "chat"}
        )
        == 1
    )
