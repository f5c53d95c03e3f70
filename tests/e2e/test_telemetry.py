"""Telemetry end to end: the example deployment's engines are scraped into `status.kv`, which `kubectl get
infd` shows, whose numbers match what the engines' own pages say, and a broken endpoint makes
MetricsAvailable False with a reason (and True again once it is back) instead of crashing anything.

The load is the test's own: it sends completions to each replica, so it knows when the counters move.
The expectations are computed here from the pages the test scrapes itself, not by kvtier's aggregation.
Runs on the embedded cluster only (its pods run kvsim engines; the broken endpoint is injected there).
"""

from __future__ import annotations

import copy
import json
import time
import urllib.request

import aiohttp
import pytest
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from kvtier.api.units import parse_quantity
from kvtier.contract import quota_path
from kvtier.kube import INFERENCEDEPLOYMENTS, KVPOOLS, PODS
from kvtier.sim.server import lmcache_app, start_site
from tests.conftest import wait_for
from tests.e2e.helpers import condition, example, get, items, kubectl, posted

NAME = "coder-480b"
SELECTOR = f"app.kubernetes.io/instance={NAME}"
GIB = 2**30
# Every prompt is 8 chunks of the example's 256 tokens. Sizes make each tier serve one request.
CHUNKS = 8
ENGINE_ENV = {
    "KVSIM_TRACE": "",  # no trace: the test is the only load
    "KVSIM_HBM_BLOCKS": "16",  # 2 prompts
    "KVSIM_CPU_BLOCKS": "32",  # 4 prompts
    "KVSIM_PREFILL_TOKENS_PER_SECOND": "1000000000000",  # instant prefill and loads: only
    "KVSIM_CPU_READ_BYTES_PER_SECOND": "1000000000000000000",  # the long request holds HBM
    "KVSIM_STORAGE_READ_BYTES_PER_SECOND": "1000000000000000000",
}


@pytest.fixture(scope="module")
def interval(cluster):
    if not cluster.in_process:
        pytest.skip("drives kvsim engines and injects faults into the simulated pods")
    return cluster.cluster.operator.scrape_interval_seconds


@pytest.fixture(scope="module")
def deployed(cluster, interval, tmp_path_factory):
    """The example KVPool and InferenceDeployment (engine env added); its two Ready replicas' pods."""
    namespace = "telemetry-e2e"
    body = copy.deepcopy(example("inferencedeployment.yaml"))
    body["metadata"]["namespace"] = namespace
    body["spec"]["engine"]["env"] = [{"name": key, "value": value} for key, value in ENGINE_ENV.items()]
    manifest = tmp_path_factory.mktemp("telemetry") / "example.yaml"
    manifest.write_text(
        yaml.safe_dump_all(
            [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}, example("kvpool.yaml"), body]
        )
    )
    kubectl(cluster, "apply", "-f", str(manifest))
    pods = wait_for(
        lambda: (
            len(
                ready := [
                    p
                    for p in items(cluster, PODS, namespace, SELECTOR)
                    if condition(p, "Ready").get("status") == "True"
                ]
            )
            == 2
            and ready
        ),
        timeout=60,
        message="2 ready replicas",
    )
    yield namespace, sorted(pods, key=lambda p: p["metadata"]["name"])
    kubectl(cluster, "delete", "-f", str(manifest), "--wait=false", check=False)
    wait_for(lambda: get(cluster, KVPOOLS, None, "fx100-a") is None, timeout=60, message="the example pool gone")


def infd(cluster, namespace):
    return get(cluster, INFERENCEDEPLOYMENTS, namespace, NAME) or {}


def prompt(tag: str) -> str:
    return " ".join(f"{tag}{index}" for index in range(CHUNKS * 256))


async def complete(http, pod, text, max_tokens=0):
    async with http.post(
        f"http://{pod['status']['podIP']}:8000/v1/completions", json={"prompt": text, "max_tokens": max_tokens}
    ) as reply:
        assert reply.status == 200, await reply.text()


async def drive(pods):
    """A warm-up request per replica (LMCache's series appear, with no hits)."""
    async with aiohttp.ClientSession() as http:
        for pod in pods:
            await complete(http, pod, prompt("warm"))


async def load(pods):
    """Per replica: five prompts, then A from storage, C from CPU, C again from HBM (held for 25s)."""
    async with aiohttp.ClientSession() as http:
        for pod in pods:
            for tag in "ABCDEAC":
                await complete(http, pod, prompt(tag))
            await complete(http, pod, prompt("C"), max_tokens=1280)


async def fetch(pods):
    """Each replica's vLLM and LMCache samples (by name, and by (name, le) for buckets) and quota answer."""
    pages = []
    async with aiohttp.ClientSession() as http:
        for pod in pods:
            ip = pod["status"]["podIP"]
            page = {}
            for face, port in (("vllm", 8000), ("lmcache", 8080)):  # LMCache: /metrics on its HTTP port
                async with http.get(f"http://{ip}:{port}/metrics") as reply:
                    samples = [s for f in text_string_to_metric_families(await reply.text()) for s in f.samples]
                page[face] = {(s.name, s.labels.get("le")): s for s in samples}
            async with http.get(f"http://{ip}:8080/quota") as reply:
                page["quota"] = await reply.json()
            pages.append(page)
    return pages


def quantile(q, buckets):
    """Prometheus' histogram_quantile over cumulative (le, count) pairs."""
    buckets = sorted(buckets)
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below) if count > below else lower
        lower, below = bound, count
    return lower


def expected(pages):
    """status.kv as the pages say it should be: token-weighted tiers, watermark, TTFT, storage."""

    def total(name, face="vllm"):
        return sum(page[face][name, None].value for page in pages)

    prompt_tokens = total("vllm:prompt_tokens_total")
    l1, l2 = (
        total("lmcache_mp_lookup_hit_l1_tokens_total", "lmcache"),
        total("lmcache_mp_lookup_hit_l2_tokens_total", "lmcache"),
    )
    external = total("vllm:external_prefix_cache_hits_total")
    hbm = total("vllm:prefix_cache_hits_total")
    ttft = {}
    for page in pages:
        for (name, le), sample in page["vllm"].items():
            if name == "vllm:time_to_first_token_seconds_bucket":
                ttft[float(le)] = ttft.get(float(le), 0) + sample.value
    used = sum(entry["current_usage_gb"] for page in pages for entry in page["quota"]["users"].values()) * GIB
    return {
        "hitRatio": {
            "hbm": hbm / prompt_tokens,
            "cpu": external * l1 / (l1 + l2) / prompt_tokens,
            "storage": external * l2 / (l1 + l2) / prompt_tokens,
            "total": (hbm + external) / prompt_tokens,
        },
        "hbmWatermarkMax": max(page["vllm"]["vllm:kv_cache_usage_perc", None].value for page in pages),
        "ttftP50Seconds": quantile(0.5, list(ttft.items())),
        "ttftP99Seconds": quantile(0.99, list(ttft.items())),
        "storageUsed": used,
    }


def differences(kv, want):
    found = []
    for tier, value in want["hitRatio"].items():
        if abs((kv.get("hitRatio") or {}).get(tier, -1) - value) > 1e-3:
            found.append(f"hitRatio.{tier}: {kv.get('hitRatio', {}).get(tier)} != {value:.4f}")
    for name in ("hbmWatermarkMax", "ttftP50Seconds", "ttftP99Seconds"):
        if kv.get(name) is None or abs(kv[name] - want[name]) > 1e-3 * max(1.0, abs(want[name])):
            found.append(f"{name}: {kv.get(name)} != {want[name]:.6g}")
    used = (kv.get("storage") or {}).get("used")
    if used is None or abs(parse_quantity(used) - want["storageUsed"]) > 1:
        found.append(f"storage.used: {used} != {want['storageUsed']:.0f}")
    return found


def test_kubectl_shows_live_watermark_and_hit_ratio_within_two_scrape_intervals(cluster, deployed, interval):
    namespace, pods = deployed
    names = [pod["metadata"]["name"] for pod in pods]

    def both_sampled():  # before any request: LMCache's series do not exist yet, vLLM's are 0
        available = condition(infd(cluster, namespace), "MetricsAvailable")
        message = available.get("message", "")
        return (available.get("reason") == "MetricsStale" and all(f"replica {n}:" in message for n in names)) or (
            available.get("reason") == "MetricsFresh" and message.startswith("2 replica")
        )

    wait_for(both_sampled, timeout=10 * interval, message="the operator's first samples of both replicas")
    cluster.run(drive(pods))
    # Fresh once LMCache's series exist: from here on the operator's windows hold every counter from 0.
    wait_for(
        lambda: condition(infd(cluster, namespace), "MetricsAvailable").get("status") == "True",
        timeout=10 * interval,
        message="MetricsAvailable=True after the warm-up",
    )
    cluster.run(load(pods))
    loaded = time.monotonic()
    columns = None
    while time.monotonic() - loaded < 4 * interval:
        started = time.monotonic()
        out = kubectl(
            cluster,
            "get",
            "infd",
            NAME,
            "-n",
            namespace,
            "--no-headers",
            "-o",
            "custom-columns=W:.status.kv.hbmWatermark,HIT:.status.kv.hitRatio.total,S:.status.kv.hitRatio.storage",
        ).stdout.split()
        if out[1] != "<none>" and float(out[1]) > 0 and float(out[2]) > 0:
            columns = out
            break
    assert columns is not None, f"kubectl never showed the hit ratio: {out}"
    assert started - loaded <= 2 * interval, f"took {started - loaded:.2f}s, scrape interval {interval}s"
    assert 0 < float(columns[0]) <= 1
    header, row = kubectl(cluster, "get", "infd", NAME, "-n", namespace).stdout.splitlines()
    cells = dict(zip(header.split(), row.split()))
    for column in ("WATERMARK", "HIT"):  # percentages, as people read them
        assert cells[column].endswith("%") and 0 < float(cells[column].removesuffix("%")) <= 100, cells


def test_status_kv_matches_what_the_engines_metrics_say(cluster, deployed, interval):
    namespace, pods = deployed
    want = expected(cluster.run(fetch(pods)))
    # Independently of kvtier: every tier served one of the eight prompts after the warm-up.
    assert want["hitRatio"]["storage"] == pytest.approx(1 / 9) and want["hitRatio"]["cpu"] == pytest.approx(1 / 9)
    assert want["hitRatio"]["hbm"] == pytest.approx(1 / 9) and 0 < want["hbmWatermarkMax"] < 1
    deadline, found = time.monotonic() + 3 * interval, ["no status yet"]
    while found and time.monotonic() < deadline:
        body = infd(cluster, namespace)
        found = differences((body.get("status") or {}).get("kv") or {}, want)
        time.sleep(0.1)
    assert not found, found
    kv = body["status"]["kv"]
    assert 0 < kv["hbmWatermark"] <= kv["hbmWatermarkMax"]
    assert kv["storage"]["quota"] == "4Ti" and kv["preemptionsPerSecond"] == 0
    assert condition(body, "MetricsAvailable")["reason"] == "MetricsFresh"


def test_a_replica_serving_its_quota_is_not_called_again_and_one_that_lost_it_is(cluster, deployed, interval):
    """Steady state makes no quota call (each resync used to GET every replica's quota to compare it); a
    server that lost its quota, as a restarted LMCache container does, reports none at the next scrape and
    is set again. Counted at the replicas: requests to `/quota/_default` (the scrape reads `/quota`)."""
    namespace, pods = deployed
    resync = cluster.cluster.operator.resync_seconds
    calls: list[tuple[str, str]] = []

    async def count_quota_calls(pod):
        """The MP server's HTTP port again, counting the calls to the replica's quota."""
        uid, name = pod["metadata"]["uid"], pod["metadata"]["name"]
        [running] = cluster.cluster.simulator.engines(uid)[1].parts  # containers: vllm, lmcache, kvtier-probe
        await running.runners[0].cleanup()

        @web.middleware
        async def counted(request, handler):
            if request.path == quota_path():
                calls.append((name, request.method))
            return await handler(request)

        app = lmcache_app(cluster.cluster.engine_factory.server(uid))
        app.middlewares.insert(0, counted)
        running.runners[0] = await start_site(app, pod["status"]["podIP"], 8080)

    for pod in pods:
        cluster.run(count_quota_calls(pod))
    time.sleep(3 * max(resync, interval))
    assert calls == [], f"quota calls to replicas already serving their quota: {calls}"
    lost = pods[0]
    request = urllib.request.Request(f"http://{lost['status']['podIP']}:8080{quota_path()}", method="DELETE")
    with urllib.request.urlopen(request, timeout=5) as reply:
        assert json.load(reply)["status"] == "removed"
    calls.clear()
    wait_for(
        lambda: (lost["metadata"]["name"], "PUT") in calls,
        timeout=4 * max(resync, interval),
        message="the quota set again on the replica that lost it",
    )
    assert {name for name, _ in calls} == {lost["metadata"]["name"]}, calls
    with urllib.request.urlopen(f"http://{lost['status']['podIP']}:8080{quota_path()}", timeout=5) as reply:
        assert json.load(reply)["limit_gb"] == 4096  # the example's 4Ti


def test_a_garbage_or_killed_endpoint_makes_metrics_unavailable_with_a_reason(cluster, deployed, interval):
    namespace, pods = deployed
    pod = pods[0]
    ip, uid = pod["status"]["podIP"], pod["metadata"]["uid"]
    simulator = cluster.cluster.simulator
    lmcache = simulator.engines(uid)[1]  # containers: vllm, lmcache, kvtier-probe
    [running] = lmcache.parts
    metrics_runner = running.runners[0]  # the MP server's HTTP port: its API and /metrics

    server = cluster.cluster.engine_factory.server(uid)

    async def serve_broken_metrics(answer):
        """The MP server's HTTP port with its API (health, quota) intact and `answer` on /metrics."""
        await metrics_runner.cleanup()

        @web.middleware
        async def broken_metrics(request, handler):
            return answer() if request.path == "/metrics" else await handler(request)

        app = lmcache_app(server)
        app.middlewares.insert(0, broken_metrics)
        return await start_site(app, ip, 8080)

    def metrics_available():
        return condition(infd(cluster, namespace), "MetricsAvailable")

    garbage = cluster.run(serve_broken_metrics(lambda: web.Response(body=b"\x00\xff<html>not metrics{{{\n" * 100)))
    broken = wait_for(
        lambda: (c := metrics_available()).get("reason") == "ScrapeFailed" and c,
        timeout=4 * interval,
        message="MetricsAvailable=False for garbage",
    )
    assert broken["status"] == "False" and f"{pod['metadata']['name']}: lmcache: parse" in broken["message"]
    # (A closed port would make the pod unready: its readiness probe is on the same port.)
    metrics_runner = garbage
    missing = cluster.run(serve_broken_metrics(lambda: web.Response(status=404)))
    wait_for(
        lambda: "lmcache: http_status" in metrics_available().get("message", ""),
        timeout=4 * interval,
        message="a failed scrape named in MetricsAvailable",
    )
    cluster.run(missing.cleanup())
    assert all(e["type"] == "Warning" for e in posted(cluster, namespace, NAME, "ScrapeFailed"))
    restored = cluster.run(start_site(lmcache_app(server), ip, 8080))
    try:
        wait_for(
            lambda: metrics_available().get("status") == "True",
            timeout=4 * interval,
            message="MetricsAvailable=True once the endpoint is back",
        )
    finally:
        running.runners[0] = restored  # stopped with the pod
