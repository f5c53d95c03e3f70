"""Scale benchmark (issue 22): N KVPools, D InferenceDeployments with R replicas each, one operator process.

    .venv/bin/python bench/scale.py --ground real --pools 10 --deployments 1000 --replicas 4 --steady 600
    .venv/bin/python bench/scale.py --ground embedded --pools 2 --sizes 20,100 --replicas 2 --steady 60

For every size it starts a fresh test ground (``embedded``: the API emulator; ``real``: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler built by hack/control-plane.sh) with the pod simulator in this
process (its kubelets serve kvsim engines on 127.0.0.0/8, idle: no trace load), runs ``kvtier run`` as its
own process, creates the pools (CSI, the simulator provisions) and the deployments, and measures:

- converge: seconds from the first create until every deployment is Ready with ``status.kv`` filled by a scrape
  (``sampledAt``); and, the goal's own measure, the seconds from the moment every pod was first Ready (as the
  simulated kubelets set it, read from the simulator's informer: no API request) to that point;
- over the steady window (``--steady`` s, sampled every scrape interval): the operator's RSS (from
  /proc/<pid>/status) and CPU as a share of one core per sample interval (from /proc/<pid>/stat);
- the operator's API requests per second, by verb and resource. Embedded ground: the emulator's request
  log, every client but the pod simulator and this script. Real ground: kube-apiserver's
  ``apiserver_request_total`` has no user label, so the others' rate is measured right after the window
  with the operator stopped (SIGSTOP) for ``--pause`` seconds and subtracted;
- status writes per minute (patch/update of kvpools and inferencedeployments ``/status``; only the
  operator writes those);
- scrape latency p50/p99: the operator's own ``kvtier_scrape_duration_seconds`` histogram (increments over
  the window, linear within a bucket);
- one rebalance round of a 100-deployment pool: the pure planner
  (:func:`kvtier.rebalance.round.plan_round`) on synthetic input with an empty demand book;
- a restart (``--restart`` s, after the window): the operator killed (SIGKILL) and started again; its API
  requests on the way back (per second, and by verb and resource) and the quotas as recorded (status, the
  pools' ledgers) and as the engines serve them, compared before and after, beside the new process's
  rebalance moves.

Prints each phase's wall time, a table, writes ``<out>/scale-<ground>.json`` and a plot against size.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kvtier.controllers.children import CHILD_RESOURCES
from kvtier.controllers.conditions import find
from kvtier.controllers.events import COMPONENT
from kvtier.kube import (
    EVENTS,
    INFERENCEDEPLOYMENTS,
    KVPOOLS,
    NAMESPACES,
    PERSISTENT_VOLUME_CLAIMS,
    PODS,
    STORAGECLASSES,
    APIError,
    KubeClient,
)
from kvtier.sim.pods import KvsimEngines
from kvtier.telemetry.exposition import parse_exposition
from kvtier.testing.cluster import EmbeddedCluster, SimulatedCluster
from kvtier.testing.engines import stub_engine
from kvtier.testing.podsim import NodeSpec

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "scale"
STORAGE_CLASS = "scale-sim"
PODS_PER_NODE = 110
BENCH_AGENT = "kvtier-bench"
#: Writes as the emulator's request log (Kubernetes verbs) and kube-apiserver's metrics (HTTP methods) name them.
WRITE_VERBS = {"create", "update", "patch", "apply", "delete", "post", "put"}
SIMULATOR_AGENT = "kvtier-podsim"


def log(message: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {message}", flush=True)


# -- objects --------------------------------------------------------------------------------------


def pool(name: str, capacity: str) -> dict[str, Any]:
    return {
        "apiVersion": "kvtier.io/v1alpha1",
        "kind": "KVPool",
        "metadata": {"name": name},
        "spec": {"capacity": capacity, "storage": {"csi": {"storageClassName": STORAGE_CLASS}}},
    }


def deployment(name: str, pool_name: str, replicas: int) -> dict[str, Any]:
    """A small deployment (TP 1, 8Gi CPU tier) taking 1Ti per replica (min 256Gi, max 2Ti) from the pool."""
    return {
        "apiVersion": "kvtier.io/v1alpha1",
        "kind": "InferenceDeployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "model": {
                "name": "Qwen/Qwen3-8B",
                "servedName": name,
                "architecture": {"layers": 36, "kvHeads": 8, "headDim": 128, "dtype": "bfloat16"},
            },
            "engine": {
                "image": "vllm/vllm-openai:v0.33.0",
                "tensorParallelSize": 1,
                "resources": {"requests": {"cpu": "1", "memory": "4Gi"}},
            },
            "kvCache": {
                "mode": "LMCacheMP",
                "chunkSize": 256,
                "cpu": {"size": "8Gi"},
                "storage": {"poolRef": pool_name, "request": "1Ti", "min": "256Gi", "max": "2Ti"},
            },
        },
    }


def nodes_for(pods: int) -> list[NodeSpec]:
    count = max(1, math.ceil(pods / (PODS_PER_NODE - 10)))
    return [NodeSpec(f"scale-node-{i}", cpu="2000", memory="64Ti", gpus=PODS_PER_NODE) for i in range(count)]


def make_ground(kind: str, pods: int, engines: KvsimEngines) -> SimulatedCluster:
    if kind == "real":
        from kvtier.testing.realcluster import ControlPlaneCluster

        return ControlPlaneCluster(nodes_for(pods), engine_factory=engines)
    return EmbeddedCluster(nodes_for(pods), engine_factory=engines, validate_builtins=True)


# -- the operator process -------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ProcessSample:
    at: float
    cpu_seconds: float
    rss_bytes: int


def sample(pid: int) -> ProcessSample:
    ticks = os.sysconf("SC_CLK_TCK")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (fields 14 and 15 of proc(5))
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    return ProcessSample(time.monotonic(), cpu, rss)


async def start_operator(
    kubeconfig: Path, metrics_port: int, args: argparse.Namespace, logfile: Path
) -> subprocess.Popen[bytes]:
    """``kvtier run`` as its own process, once its metrics port answers."""
    command = [
        sys.executable,
        "-m",
        "kvtier",
        "run",
        "--kubeconfig",
        str(kubeconfig),
        "--metrics-port",
        str(metrics_port),
        "--resync-seconds",
        str(args.resync),
        "--scrape-interval",
        str(args.scrape_interval),
        "--status-interval",
        str(args.status_interval),
    ]
    with logfile.open("wb") as out:
        operator = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT)
    deadline = time.monotonic() + 120
    while True:
        with contextlib.suppress(OSError, Exception):
            await operator_metrics(metrics_port)
            return operator
        if operator.poll() is not None or time.monotonic() > deadline:
            operator.kill()
            raise RuntimeError(f"the operator did not start; see {logfile}")
        await asyncio.sleep(0.2)


async def operator_metrics(port: int) -> str:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as reply:
        return await reply.text()


# -- Prometheus text ------------------------------------------------------------------------------


def parse_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples of one metric family (`name` exactly) as (labels, value), read by the operator's own parser."""
    page = parse_exposition(text, max_bytes=len(text.encode()) + 1, max_series=10**7, names={name})
    return [(sample.labels, sample.value) for sample in page.samples_of(name)]


def request_counts(text: str) -> Counter[tuple[str, str]]:
    """apiserver_request_total by (verb, resource[/subresource])."""
    counts: Counter[tuple[str, str]] = Counter()
    for labels, value in parse_samples(text, "apiserver_request_total"):
        resource = labels.get("resource", "") + (f"/{labels['subresource']}" if labels.get("subresource") else "")
        counts[(labels.get("verb", "").lower(), resource)] += value
    return counts


def histogram_quantiles(before: str, after: str, name: str, quantiles: tuple[float, ...]) -> list[float | None]:
    """Quantiles of a histogram's increments between two scrapes (all label sets summed)."""

    def buckets(text: str) -> dict[float, float]:
        totals: dict[float, float] = {}
        for labels, value in parse_samples(text, name + "_bucket"):
            bound = float(labels["le"])
            totals[bound] = totals.get(bound, 0.0) + value
        return totals

    start, end = buckets(before), buckets(after)
    bounds = sorted(end)
    cumulative = [end[b] - start.get(b, 0.0) for b in bounds]
    total = cumulative[-1] if cumulative else 0.0
    result: list[float | None] = []
    for q in quantiles:
        if total <= 0:
            result.append(None)
            continue
        rank = q * total
        previous_bound, previous_count = 0.0, 0.0
        for bound, count in zip(bounds, cumulative, strict=True):
            if count >= rank:
                if math.isinf(bound):
                    result.append(previous_bound)
                else:
                    share = (rank - previous_count) / (count - previous_count) if count > previous_count else 1.0
                    result.append(previous_bound + (bound - previous_bound) * share)
                break
            previous_bound, previous_count = bound, count
    return result


# -- one size -------------------------------------------------------------------------------------


@dataclass
class Result:
    ground: str
    pools: int
    deployments: int
    replicas: int
    phases: dict[str, float] = field(default_factory=dict)
    converged: bool = False
    converge_seconds: float | None = None
    pods_ready_seconds: float | None = None
    """Seconds from the first create until every pod was Ready for the first time."""
    converge_after_pods_seconds: float | None = None
    ready_at_end: int = 0
    timeline: list[tuple[float, int, int, int]] = field(default_factory=list)
    """(seconds since the first create, pods Ready, deployments Ready, deployments Ready with status.kv) per poll."""
    cpu_share_mean: float | None = None
    cpu_share_max: float | None = None
    rss_start_mib: float | None = None
    rss_end_mib: float | None = None
    rss_max_mib: float | None = None
    api_rps: float | None = None
    api_rps_by_verb_resource: dict[str, float] = field(default_factory=dict)
    lists_in_steady_state: float | None = None
    status_writes_per_minute: float | None = None
    scrape_p50_ms: float | None = None
    scrape_p99_ms: float | None = None
    rebalance_round_ms: float | None = None
    attribution: str = ""
    restart: dict[str, Any] = field(default_factory=dict)
    """The operator killed (SIGKILL) after the steady window and started again (``--restart`` s watched)."""


def condition_true(body: dict[str, Any], kind: str) -> bool:
    return (find((body.get("status") or {}).get("conditions") or [], kind) or {}).get("status") == "True"


def kv_ready(body: dict[str, Any]) -> bool:
    """Ready, and `status.kv` carries the telemetry's numbers (`sampledAt`), not only the pass's storage quota:
    counting the latter made the first telemetry writes fall into the steady window (543 status writes a minute
    at 1,000 x 1, most of them the first fill)."""
    return condition_true(body, "Ready") and bool(((body.get("status") or {}).get("kv") or {}).get("sampledAt"))


async def create_all(kube: KubeClient, bodies: list[tuple[Any, dict[str, Any]]], concurrency: int = 16) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(resource: Any, body: dict[str, Any]) -> None:
        async with gate:
            for attempt in range(20):
                try:
                    await kube.create(resource, body)
                    return
                except APIError as error:
                    if error.status == 409:
                        return
                    if error.status < 500 and error.status != 429:
                        raise
                await asyncio.sleep(0.5 * (attempt + 1))

    await asyncio.gather(*(one(resource, body) for resource, body in bodies))


async def count_ready(kube: KubeClient) -> tuple[int, int]:
    """Deployments Ready, and those of them whose ``status.kv`` carries the telemetry's numbers."""
    items = (await kube.list(INFERENCEDEPLOYMENTS, NAMESPACE))["items"]
    return sum(condition_true(item, "Ready") for item in items), sum(kv_ready(item) for item in items)


async def count_pods_ready(cluster: SimulatedCluster) -> int:
    """Pods Ready as the simulated kubelets last wrote them, from the simulator's pod informer (no request)."""
    assert cluster.simulator is not None
    items = (await cluster.simulator.kube.list(PODS, NAMESPACE))["items"]
    return sum(condition_true(item, "Ready") for item in items)


async def run_size(args: argparse.Namespace, deployments: int, out: Path) -> Result:
    result = Result(args.ground, min(args.pools, deployments), deployments, args.replicas)
    pods = deployments * args.replicas
    started = time.monotonic()
    engines = KvsimEngines(None, fallback=stub_engine, trace_dir=None, default_load=None)
    cluster = make_ground(args.ground, pods, engines)
    operator: subprocess.Popen[bytes] | None = None
    paused = False
    try:
        await cluster.start()
        assert cluster.kube is not None and cluster.simulator is not None
        cluster.simulator.resync = args.sim_resync
        cluster.simulator.probe_periods = True  # readiness probed once per periodSeconds, as kubelets do
        result.phases["ground up"] = time.monotonic() - started
        connection_kube = cluster.kube
        kube = await KubeClient(connection_kube.connection, user_agent=BENCH_AGENT).open()
        try:
            await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
            await kube.create(
                NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kvtier-system"}}
            )
            await kube.create(
                STORAGECLASSES,
                {
                    "apiVersion": "storage.k8s.io/v1",
                    "kind": "StorageClass",
                    "metadata": {"name": STORAGE_CLASS},
                    "provisioner": "csi.example.com",
                    "reclaimPolicy": "Delete",
                    "allowVolumeExpansion": True,
                },
            )
            phase = time.monotonic()
            metrics_port = free_port()
            operator = await start_operator(
                cluster.kubeconfig, metrics_port, args, out / "work" / f"operator-{deployments}.log"
            )
            result.phases["operator up"] = time.monotonic() - phase
            log(f"operator pid {operator.pid}, metrics on :{metrics_port}")

            phase = time.monotonic()
            capacity_ti = math.ceil(deployments / result.pools) * args.replicas * 2  # room for every max
            pools = [pool(f"pool-{i}", f"{capacity_ti}Ti") for i in range(result.pools)]
            bodies: list[tuple[Any, dict[str, Any]]] = [(KVPOOLS, body) for body in pools]
            bodies += [
                (INFERENCEDEPLOYMENTS, deployment(f"m-{i:04d}", f"pool-{i % result.pools}", args.replicas))
                for i in range(deployments)
            ]
            await create_all(kube, bodies)
            result.phases["create"] = time.monotonic() - phase
            log(f"created {result.pools} pools and {deployments} deployments in {result.phases['create']:.1f} s")

            ready = with_kv = 0
            while time.monotonic() - phase < args.timeout:
                try:
                    ready, with_kv = await count_ready(kube)
                except APIError as error:
                    log(f"poll failed: {error}")
                pods_ready, at = await count_pods_ready(cluster), time.monotonic() - phase
                result.timeline.append((round(at, 1), pods_ready, ready, with_kv))
                if pods_ready == pods and result.pods_ready_seconds is None:
                    result.pods_ready_seconds = at
                if with_kv == deployments:
                    result.converged = True
                    break
                simulator = cluster._simulator_task
                if simulator is not None and simulator.done():
                    raise RuntimeError(f"the pod simulator stopped: {simulator.exception()!r}")
                log(
                    f"  {at:.0f} s: pods Ready {pods_ready}/{pods}, deployments Ready {ready}, "
                    f"with status.kv {with_kv}/{deployments}"
                )
                await asyncio.sleep(args.poll)
            result.ready_at_end = with_kv
            result.converge_seconds = time.monotonic() - phase
            result.phases["converge"] = result.converge_seconds
            if result.converged and result.pods_ready_seconds is not None:
                result.converge_after_pods_seconds = result.converge_seconds - result.pods_ready_seconds
            log(
                f"{'converged' if result.converged else 'NOT converged'}: {with_kv}/{deployments} in "
                f"{result.converge_seconds:.1f} s (every pod Ready first at {fmt(result.pods_ready_seconds)} s)"
            )

            # Steady state: nothing from this script while the window runs.
            phase = time.monotonic()
            server = cluster.server
            events_before = await event_counts(kube) if server is None else Counter()
            api_before = await kube.request("GET", "/metrics") if server is None else ""
            ops_before = await operator_metrics(metrics_port)
            window_start_wall = time.time()
            samples = [sample(operator.pid)]
            while time.monotonic() - phase < args.steady:
                await asyncio.sleep(min(args.scrape_interval, max(0.1, args.steady - (time.monotonic() - phase))))
                samples.append(sample(operator.pid))
            window = samples[-1].at - samples[0].at
            window_end_wall = time.time()
            ops_after = await operator_metrics(metrics_port)
            api_after = await kube.request("GET", "/metrics") if server is None else ""
            events = await event_counts(kube) if server is None else Counter()
            events.subtract(events_before)
            result.phases["steady window"] = time.monotonic() - phase

            shares = [
                (b.cpu_seconds - a.cpu_seconds) / (b.at - a.at) for a, b in zip(samples, samples[1:], strict=False)
            ]
            result.cpu_share_mean = (samples[-1].cpu_seconds - samples[0].cpu_seconds) / window
            result.cpu_share_max = max(shares) if shares else None
            rss = [s.rss_bytes / 2**20 for s in samples]
            result.rss_start_mib, result.rss_end_mib, result.rss_max_mib = rss[0], rss[-1], max(rss)
            p50, p99 = histogram_quantiles(ops_before, ops_after, "kvtier_scrape_duration_seconds", (0.5, 0.99))
            result.scrape_p50_ms = p50 * 1000 if p50 is not None else None
            result.scrape_p99_ms = p99 * 1000 if p99 is not None else None

            by: Counter[tuple[str, str]] = Counter()
            if server is not None:
                for record in server.requests.records:
                    if not window_start_wall <= record.time <= window_end_wall:
                        continue
                    if record.user_agent in (BENCH_AGENT, SIMULATOR_AGENT):
                        continue
                    resource = (record.resource or record.path) + (
                        f"/{record.subresource}" if record.subresource else ""
                    )
                    by[(record.verb, resource)] += 1
                result.attribution = "request log, every client but the pod simulator and the bench"
                rates = {key: count / window for key, count in by.items()}
            else:
                total = request_counts(api_after)
                total.subtract(request_counts(api_before))
                phase = time.monotonic()
                os.kill(operator.pid, signal.SIGSTOP)
                paused = True
                others_before = await kube.request("GET", "/metrics")
                pause_start = time.monotonic()
                await asyncio.sleep(args.pause)
                others_after = await kube.request("GET", "/metrics")
                pause = time.monotonic() - pause_start
                os.kill(operator.pid, signal.SIGCONT)
                paused = False
                others = request_counts(others_after)
                others.subtract(request_counts(others_before))
                result.phases["others' baseline"] = time.monotonic() - phase
                keys = (set(total) | set(others)) - NOT_THE_OPERATORS
                rates = {
                    key: total[key] / window - max(others[key], 0) / pause
                    for key in keys
                    if total[key] / window - max(others[key], 0) / pause > 0.005
                }
                rates[EVENT_POSTS] = kvtier_events(events) / window
                result.attribution = (
                    f"apiserver_request_total over the window minus the rate of the {pause:.0f} s after it "
                    "with the operator stopped (SIGSTOP): the pod simulator, controllers, scheduler, the bench; "
                    "without the controllers' requests the operator never makes (NOT_THE_OPERATORS)"
                )
            result.api_rps_by_verb_resource = {
                f"{verb} {resource}": round(rate, 3)
                for (verb, resource), rate in sorted(rates.items(), key=lambda kv: -kv[1])
                if rate > 0
            }
            result.api_rps = sum(rate for rate in rates.values() if rate > 0)
            result.lists_in_steady_state = sum(rate for (verb, _), rate in rates.items() if verb == "list")
            writes = sum(
                rate
                for (verb, resource), rate in rates.items()
                if verb in WRITE_VERBS and resource in ("kvpools/status", "inferencedeployments/status")
            )
            result.status_writes_per_minute = writes * 60
            if args.restart > 0:
                others_rate = {key: max(count, 0) / pause for key, count in others.items()} if server is None else {}
                operator = await restart(args, kube, cluster, engines, operator, metrics_port, out, result, others_rate)
        finally:
            await kube.close()
    finally:
        if operator is not None:
            if paused:
                os.kill(operator.pid, signal.SIGCONT)
            operator.terminate()
            try:
                operator.wait(30)
            except subprocess.TimeoutExpired:
                operator.kill()
                operator.wait(10)
        phase = time.monotonic()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(cluster.stop(), 120)
        plane = getattr(cluster, "control_plane", None)
        if plane is not None:  # stopped already unless the teardown ran out of time
            await asyncio.to_thread(plane.stop)
        result.phases["teardown"] = time.monotonic() - phase
    return result


# -- a restart in steady state --------------------------------------------------------------------

#: The operator's children and their claims, by resource as the request counts name them.
CHILD_PLURALS = {resource.plural for resource in CHILD_RESOURCES.values()} | {PERSISTENT_VOLUME_CLAIMS.plural}
#: Requests other clients make and kvtier never does (it creates Events and never patches one; it writes no
#: Endpoints, EndpointSlices or Node, and sets a pod's readiness gate with PUT, never PATCH):
#: kube-controller-manager's endpoint controllers, which also repeat their Events (FailedToUpdateEndpoint(Slices),
#: a PATCH each) at a rate that differs between windows, and the simulated kubelets' node and pod status. On the
#: real ground they are left out of the operator's share, which is otherwise what the others' baseline rate does
#: not explain.
EVENT_POSTS = ("post", "events")
NOT_THE_OPERATORS = {
    ("patch", "events"),
    EVENT_POSTS,  # kvtier's own are counted from the Events it reported (`kvtier_events`)
    ("put", "endpoints"),
    ("put", "endpointslices"),
    ("patch", "nodes/status"),
    ("patch", "pods/status"),
}


async def fleet_state(kube: KubeClient, cluster: SimulatedCluster, engines: KvsimEngines) -> dict[str, Any]:
    """Quotas as recorded (deployments' status, the pools' ledgers) and as the simulated engines serve them."""
    recorded = {
        item["metadata"]["name"]: ((item.get("status") or {}).get("kv") or {}).get("storage", {}).get("quota")
        for item in (await kube.list(INFERENCEDEPLOYMENTS, NAMESPACE))["items"]
    }
    ledger = {
        (pool["metadata"]["name"], entry.get("name")): (entry.get("quota"), entry.get("replicas"))
        for pool in (await kube.list(KVPOOLS))["items"]
        for entry in (pool.get("status") or {}).get("allocations") or []
    }
    assert cluster.simulator is not None
    served = {}
    for pod in (await cluster.simulator.kube.list(PODS, NAMESPACE))["items"]:
        server = engines.server(pod["metadata"]["uid"])
        if server is not None:
            served[pod["metadata"]["name"]] = {
                salt: server.quota_entry(salt).get("limit_gb") for salt in server.quota_salts()
            }
    return {"recorded": recorded, "ledger": ledger, "served": served}


async def event_counts(kube: KubeClient) -> Counter[str]:
    """Events by who reported them, why and about which kind, their repeats counted (a repeat is a PATCH)."""
    counts: Counter[str] = Counter()
    for event in (await kube.list(EVENTS))["items"]:
        source = event.get("reportingComponent") or (event.get("source") or {}).get("component") or "?"
        kind = (event.get("involvedObject") or {}).get("kind", "?")
        counts[f"{source} {event.get('reason')} ({kind})"] += int(event.get("count") or 1)
    return counts


def kvtier_events(counts: Counter[str]) -> int:
    """The Events kvtier reported (each one a POST: it never repeats one as a PATCH), from `event_counts`."""
    return sum(count for key, count in counts.items() if key.startswith(f"{COMPONENT} ") and count > 0)


async def passes_done(metrics_port: int) -> float:
    """The InferenceDeployment passes the operator process has finished (any result)."""
    text = await operator_metrics(metrics_port)
    return sum(
        value
        for labels, value in parse_samples(text, "kvtier_reconcile_total")
        if labels.get("kind") == "InferenceDeployment"
    )


async def restart(
    args: argparse.Namespace,
    kube: KubeClient,
    cluster: SimulatedCluster,
    engines: KvsimEngines,
    operator: subprocess.Popen[bytes],
    metrics_port: int,
    out: Path,
    result: Result,
    others_rate: dict[tuple[str, str], float],
) -> subprocess.Popen[bytes]:
    """Kill the operator (SIGKILL) in steady state, start it again, and watch ``--restart`` seconds: the API
    requests on the way back (per second: all clients, and the operator's by verb and resource) and whether any
    quota changed that the new process's rebalance rounds did not move. Returns the new process."""
    server = cluster.server
    before = await fleet_state(kube, cluster, engines)
    events_before = await event_counts(kube)
    counts: list[tuple[float, Counter[tuple[str, str]]]] = []
    if server is None:
        counts.append((time.monotonic(), request_counts(await kube.request("GET", "/metrics"))))
    window_start_wall = time.time()
    killed = time.monotonic()
    operator.kill()
    operator.wait(30)
    operator = await start_operator(
        cluster.kubeconfig, metrics_port, args, out / "work" / f"operator-{result.deployments}-restart.log"
    )
    up = time.monotonic() - killed
    log(f"operator killed and started again (pid {operator.pid}), metrics up after {up:.1f} s")
    first_pass = all_passed = None
    next_read = 0.0
    while time.monotonic() - killed < args.restart:
        if server is None:
            counts.append((time.monotonic(), request_counts(await kube.request("GET", "/metrics"))))
        if all_passed is None and time.monotonic() >= next_read:
            # The operator's own page costs it a sizeable share of a core at 1,000 deployments: every 2 s, and
            # no more once every deployment has had its pass.
            next_read = time.monotonic() + 2
            done = await passes_done(metrics_port)
            if done and first_pass is None:
                first_pass = time.monotonic() - killed
            if done >= result.deployments:
                all_passed = time.monotonic() - killed
        await asyncio.sleep(0.5 if server is None else 1)
    window_end_wall = time.time()
    after = await fleet_state(kube, cluster, engines)
    events = await event_counts(kube)
    events.subtract(events_before)
    moves = sum(
        value for _, value in parse_samples(await operator_metrics(metrics_port), "kvtier_rebalance_moves_total")
    )

    by: Counter[tuple[str, str]] = Counter()
    per_second: list[tuple[float, float]] = []  # (seconds since the kill, the operator's requests per second)
    if server is not None:
        seconds: Counter[int] = Counter()
        for record in server.requests.records:
            if not window_start_wall <= record.time <= window_end_wall:
                continue
            if record.user_agent in (BENCH_AGENT, SIMULATOR_AGENT):
                continue
            resource = (record.resource or record.path) + (f"/{record.subresource}" if record.subresource else "")
            by[(record.verb, resource)] += 1
            seconds[int(record.time - window_start_wall)] += 1
        per_second = [(float(second), float(seconds[second])) for second in range(int(args.restart) + 1)]
        attribution = "the emulator's request log, every client but the pod simulator and the bench"
    else:
        # Per interval: every client's requests but the ones the operator never makes, not net of the others'
        # (their rate comes in bursts a subtraction per interval only turns into noise): an upper bound.
        for (start, first), (end, last) in zip(counts, counts[1:], strict=False):
            total = sum(count for key, count in last.items() if key not in NOT_THE_OPERATORS)
            total -= sum(count for key, count in first.items() if key not in NOT_THE_OPERATORS)
            per_second.append((round(end - killed, 1), total / (end - start)))
        whole = counts[-1][1]
        whole.subtract(counts[0][1])
        span = counts[-1][0] - counts[0][0]
        by = Counter(
            {
                key: round(count - others_rate.get(key, 0.0) * span)
                for key, count in whole.items()
                if key not in NOT_THE_OPERATORS
            }
        )
        by[EVENT_POSTS] = kvtier_events(events)
        attribution = (
            f"apiserver_request_total read every {span / max(1, len(counts) - 1):.1f} s, minus the others' rate of "
            "the steady window's pause (SIGSTOP) and the requests the operator never makes (NOT_THE_OPERATORS); "
            f"per second: every client's but those, the others' steady rate of "
            f"{sum(rate for key, rate in others_rate.items() if key not in NOT_THE_OPERATORS):.1f}/s included"
        )
    changed = {
        what: sorted(
            str(key)
            for key in before[what].keys() | after[what].keys()
            if before[what].get(key) != after[what].get(key)
        )
        for what in ("recorded", "ledger", "served")
    }
    result.restart = {
        "watched_seconds": args.restart,
        "metrics_up_seconds": round(up, 1),
        "first_pass_seconds": None if first_pass is None else round(first_pass, 1),
        "every_deployment_passed_seconds": None if all_passed is None else round(all_passed, 1),
        "events_reported": {key: count for key, count in events.most_common() if count > 0},
        "peak_rps": round(max((rate for _, rate in per_second), default=0.0), 1),
        "operator_requests": sum(count for count in by.values() if count > 0),
        "operator_requests_by_verb_resource": {
            f"{verb} {resource}": count for (verb, resource), count in by.most_common() if count > 0
        },
        "child_writes": sum(
            count for (verb, resource), count in by.items() if verb in WRITE_VERBS and resource in CHILD_PLURALS
        ),
        "status_writes": sum(
            count
            for (verb, resource), count in by.items()
            if verb in WRITE_VERBS and resource in ("kvpools/status", "inferencedeployments/status")
        ),
        "rebalance_moves": moves,
        "changed": {what: len(keys) for what, keys in changed.items()},
        "changed_examples": {what: keys[:5] for what, keys in changed.items() if keys},
        "compared": {what: len(before[what]) for what in ("recorded", "ledger", "served")},
        "per_second": per_second,
        "attribution": attribution,
    }
    return operator


# -- the rebalance round --------------------------------------------------------------------------


def rebalance_round_ms(members: int = 100, repeats: int = 5) -> float:
    """Median wall time of `plan_round` for one pool of `members` deployments (synthetic, empty demand book)."""
    from kvtier.api.kvpool import KVPool, KVPoolStatus
    from kvtier.rebalance.demand import DemandBook
    from kvtier.rebalance.round import plan_round

    body = pool("bench-pool", f"{members * 4}Ti")
    body["metadata"]["uid"] = str(uuid.uuid4())
    kvpool = KVPool.model_validate(body)
    bodies, allocations = [], []
    for i in range(members):
        deployment_body = deployment(f"m-{i:04d}", "bench-pool", 2)
        deployment_body["metadata"].update(uid=str(uuid.uuid4()), generation=1)
        bodies.append(deployment_body)
        allocations.append(
            {
                "namespace": NAMESPACE,
                "name": deployment_body["metadata"]["name"],
                "uid": deployment_body["metadata"]["uid"],
                "replicas": 2,
                "quota": "1Ti",
            }
        )
    status = KVPoolStatus.model_validate({"allocations": allocations})
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        plan_round(kvpool, status, bodies, DemandBook(stale_seconds=60), time.time(), None, datetime.now(UTC))
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


# -- report ---------------------------------------------------------------------------------------


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_table(results: list[Result]) -> None:
    header = (
        f"{'deploy':>6} {'pods':>6} {'converge s':>10} {'after pods':>10} {'ready':>9} {'cpu mean':>8} {'cpu max':>8} "
        f"{'rss MiB':>15} {'api rps':>8} {'LIST/s':>7} {'status w/min':>12} {'scrape p50/p99 ms':>17}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r.deployments:>6} {r.deployments * r.replicas:>6} {fmt(r.converge_seconds):>10} "
            f"{fmt(r.converge_after_pods_seconds):>10} "
            f"{f'{r.ready_at_end}/{r.deployments}':>9} {fmt((r.cpu_share_mean or 0) * 100):>7}% "
            f"{fmt((r.cpu_share_max or 0) * 100):>7}% "
            f"{f'{fmt(r.rss_start_mib, 0)}->{fmt(r.rss_end_mib, 0)}':>15} {fmt(r.api_rps, 2):>8} "
            f"{fmt(r.lists_in_steady_state, 2):>7} {fmt(r.status_writes_per_minute):>12} "
            f"{f'{fmt(r.scrape_p50_ms)}/{fmt(r.scrape_p99_ms)}':>17}"
        )
    for r in results:
        print(f"\n{r.deployments} deployments: phases " + ", ".join(f"{k} {v:.1f} s" for k, v in r.phases.items()))
        print(f"  API requests/s by verb and resource ({r.attribution}):")
        for key, rate in list(r.api_rps_by_verb_resource.items())[:15]:
            print(f"    {rate:8.3f}  {key}")
        if r.restart:
            x = r.restart
            print(
                f"  restart (SIGKILL, then {x['watched_seconds']:.0f} s watched): metrics up in "
                f"{x['metrics_up_seconds']} s; operator requests {x['operator_requests']}, peak "
                f"{x['peak_rps']}/s; child writes {x['child_writes']}, status writes {x['status_writes']}; "
                f"rebalance moves {x['rebalance_moves']:.0f}; changed (of compared) "
                + ", ".join(f"{what} {count}/{x['compared'][what]}" for what, count in x["changed"].items())
            )
            print(
                f"  first InferenceDeployment pass {fmt(x['first_pass_seconds'])} s after the kill, one pass each "
                f"done at {fmt(x['every_deployment_passed_seconds'])} s"
            )
            print(f"  its requests by verb and resource ({x['attribution']}):")
            for key, count in list(x["operator_requests_by_verb_resource"].items())[:15]:
                print(f"    {count:8d}  {key}")
            print("  Events reported meanwhile, repeats counted (every client's):")
            for key, count in list(x["events_reported"].items())[:10]:
                print(f"    {count:8d}  {key}")


def plot(results: list[Result], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r.deployments for r in results]
    series = [
        ("converge (s)", [r.converge_seconds for r in results]),
        ("operator CPU (% of a core)", [(r.cpu_share_mean or 0) * 100 for r in results]),
        ("operator RSS max (MiB)", [r.rss_max_mib for r in results]),
        ("operator API requests/s", [r.api_rps for r in results]),
        ("status writes/min", [r.status_writes_per_minute for r in results]),
        ("scrape p99 (ms)", [r.scrape_p99_ms for r in results]),
    ]
    figure, axes = plt.subplots(2, 4, figsize=(17, 7))
    for axis, (title, values) in zip(axes.flat, series, strict=False):
        axis.plot(
            sizes, [v if v is not None else float("nan") for v in values], marker="o", label="from the first create"
        )
        axis.set_title(title)
        axis.set_xlabel("InferenceDeployments")
        axis.grid(True, alpha=0.3)
    axes.flat[0].plot(
        sizes,
        [v if v is not None else float("nan") for v in (r.converge_after_pods_seconds for r in results)],
        marker="o",
        label="after every pod Ready",
    )
    axes.flat[0].legend()
    largest, axis = results[-1], axes.flat[len(series)]
    if largest.timeline:
        at = [point[0] for point in largest.timeline]
        for column, label in ((1, "pods Ready"), (2, "deployments Ready"), (3, "with status.kv")):
            axis.plot(at, [point[column] for point in largest.timeline], label=label)
        axis.legend()
    axis.set_title(f"convergence, {largest.deployments} deployments")
    axis.set_xlabel("seconds since the first create")
    axis.grid(True, alpha=0.3)
    axis = axes.flat[len(series) + 1]
    if largest.restart:
        points = largest.restart["per_second"]
        axis.plot([at for at, _ in points], [rate for _, rate in points])
        whose = "all clients" if largest.ground == "real" else "the operator"  # see NOT_THE_OPERATORS
        axis.set_title(f"API requests/s after a kill ({whose})")
        axis.set_xlabel("seconds since the kill")
        axis.grid(True, alpha=0.3)
    else:
        axis.axis("off")
    ground, replicas = results[0].ground, results[0].replicas
    figure.suptitle(f"kvtier at scale ({ground} ground, {replicas} replicas per deployment)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ground", choices=["real", "embedded"], default="real")
    parser.add_argument("--pools", type=int, default=10)
    parser.add_argument("--deployments", type=int, default=1000)
    parser.add_argument("--sizes", default=None, help="Comma-separated deployment counts (overrides --deployments).")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--steady", type=float, default=600.0, help="Seconds of steady state measured.")
    parser.add_argument("--timeout", type=float, default=1800.0, help="Most seconds to wait for convergence.")
    parser.add_argument("--pause", type=float, default=60.0, help="Real ground: seconds of others' baseline.")
    parser.add_argument("--poll", type=float, default=5.0, help="Seconds between convergence checks.")
    parser.add_argument("--scrape-interval", type=float, default=15.0)
    parser.add_argument("--resync", type=float, default=10.0)
    parser.add_argument("--status-interval", type=float, default=30.0)
    parser.add_argument(
        "--sim-resync", type=float, default=2.0, help="Seconds between the pod simulator's passes (readiness probes)."
    )
    parser.add_argument(
        "--restart",
        type=float,
        default=180.0,
        help="After the steady window: kill the operator, start it again, watch this many seconds (0: no restart).",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "scale")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else [args.deployments]
    (args.out / "work").mkdir(parents=True, exist_ok=True)

    total = time.monotonic()
    results = []
    for size in sizes:
        log(f"== {size} deployments x {args.replicas} replicas on the {args.ground} ground")
        result = asyncio.run(run_size(args, size, args.out))
        results.append(result)
        print_table([result])  # each size as it ends (a long series may be cut short)
        # A checkpoint of each size (a long series may be cut short), beside its operator log; the run's
        # results are the stamped files below.
        (args.out / "work" / f"scale-{args.ground}-{size}.json").write_text(json.dumps(asdict(result), indent=2))
    phase = time.monotonic()
    round_ms = rebalance_round_ms()
    for result in results:
        result.rebalance_round_ms = round_ms
    print()
    print_table(results)
    print(
        f"\nrebalance round, 100-deployment pool (plan_round, synthetic input): {round_ms:.1f} ms "
        f"(timed in {time.monotonic() - phase:.1f} s)"
    )
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    data = args.out / f"scale-{args.ground}-{stamp}.json"
    data.write_text(json.dumps([asdict(r) for r in results], indent=2))
    figure = args.out / f"scale-{args.ground}-{stamp}.png"
    plot(results, figure)
    print(f"results: {data}\nplot: {figure}\ntotal wall time {time.monotonic() - total:.0f} s")


if __name__ == "__main__":
    main()
