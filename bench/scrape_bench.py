"""Cost of one telemetry cycle over many scrape targets: CPU, wall time and memory of the operator side.

A server process serves realistic pages (rendered by a kvsim engine after a Mooncake-like load,
the probe's stack-distance histograms from its lookup-hash log, the quota API) on 127.77.x.y
addresses, one address per simulated replica with its four endpoints (vLLM /metrics, LMCache
/metrics, probe /metrics, LMCache /quota); each endpoint is one scrape target, as in Prometheus.
Pages alternate between two moments of the engine so counters move. This process runs the
operator's real cycle (:meth:`kvtier.controllers.telemetry.TelemetryLoop.cycle`: the scraper,
the parser, replica snapshots, deployment windows, summaries, status patches to a stub API)
and prints CPU seconds per cycle against the goal (25% of one core per 15 s cycle = 3.75 s).

    .venv/bin/python bench/scrape_bench.py [--targets 2000] [--cycles 4] [--replicas-per-deployment 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import resource
import tempfile
import time
from pathlib import Path

ENDPOINTS = (
    ("vllm", 8000, "/metrics"),
    ("lmcache", 9090, "/metrics"),
    ("probe", 9400, "/metrics"),
    ("quota", 8080, "/quota"),
)
GOAL_SECONDS = 0.25 * 15


def address(index: int) -> str:
    return f"127.77.{index // 250}.{index % 250 + 2}"


def render_pages() -> list[dict[str, bytes]]:
    """Two moments of one simulated replica: each endpoint's body."""
    from prometheus_client.exposition import generate_latest

    from kvtier.probe.demand import DemandProbe
    from kvtier.sim.engine import EngineParams
    from kvtier.sim.server import SimServer, open_lookup_log

    params = EngineParams(block_tokens=256, kv_bytes_per_token=253_952, hbm_blocks=1024, cpu_blocks=2048)
    with tempfile.TemporaryDirectory() as directory:
        log = open_lookup_log(directory, params)
        server = SimServer(params, model="coder", lookup_log=log)
        server.set_quota("", 4096)
        probe = DemandProbe(chunk_bytes=params.block_bytes)
        moments = []
        for moment in range(2):
            for request in range(300):
                prefix = request % 40  # shared system prompts and conversation prefixes
                blocks = (
                    [prefix] * 0
                    + [1000 * prefix + k for k in range(8)]
                    + [10**6 * moment + request * 10 + k for k in range(4)]
                )
                server.serve(blocks, len(blocks) * 256, 200)
            log.close()
            for file in sorted(Path(directory).iterdir()):
                for line in file.read_bytes().splitlines():
                    probe.feed(line)
            log = open_lookup_log(directory, params)
            server.lookup_log = log
            from prometheus_client import CollectorRegistry

            registry = CollectorRegistry()
            registry.register(probe)
            quota = {"quotas": [server.quota_entry(salt) for salt in server.quota_salts()]}
            moments.append(
                {
                    "vllm": generate_latest(server.vllm_registry),
                    "lmcache": generate_latest(server.mp_registry),
                    "probe": generate_latest(registry),
                    "quota": json.dumps(quota).encode(),
                }
            )
        log.close()
    return moments


def serve(replicas: int, ready, stop) -> None:
    """The server process: every replica's endpoints on its own address."""
    from aiohttp import web

    moments = render_pages()

    async def main() -> None:
        served = {"count": 0}

        def handler(kind: str):
            async def answer(_: web.Request) -> web.Response:
                served["count"] += 1
                body = moments[(served["count"] // (replicas * len(ENDPOINTS))) % 2][kind]
                return web.Response(body=body, content_type="application/json" if kind == "quota" else "text/plain")

            return answer

        runners = []
        for kind, port, path in ENDPOINTS:
            app = web.Application()
            app.router.add_get(path, handler(kind))
            runner = web.AppRunner(app, access_log=None, handle_signals=False)
            await runner.setup()
            runners.append(runner)
            for index in range(replicas):
                await web.TCPSite(runner, address(index), port, backlog=1024).start()
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.2)
        for runner in runners:
            await runner.cleanup()

    asyncio.run(main())


class StubKube:
    """Accepts status patches and Events (the API server is not what this measures)."""

    def __init__(self) -> None:
        self.patches = 0

    async def patch(self, *args, **kwargs):
        self.patches += 1
        return {}

    async def create(self, *args, **kwargs):
        return {}


async def measure(replicas: int, per_deployment: int, cycles: int, concurrency: int) -> list[tuple[float, float, int]]:
    from kvtier.controllers.runtime import OperatorConfig
    from kvtier.controllers.telemetry import TelemetryLoop
    from kvtier.telemetry.metrics import OperatorMetrics
    from kvtier.telemetry.scraper import Scraper
    from kvtier.telemetry.targets import Target

    config = OperatorConfig(scrape_interval_seconds=15, scrape_concurrency=concurrency, status_interval_seconds=0.1)
    kube = StubKube()
    loop = TelemetryLoop(config, kube, OperatorMetrics())  # type: ignore[arg-type]  # a stand-in client
    for index in range(replicas):
        deployment = f"d{index // per_deployment}"
        pod = {
            "metadata": {
                "namespace": "bench",
                "name": f"{deployment}-{index % per_deployment}",
                "uid": str(index),
                "labels": {"kvtier.io/deployment": deployment},
            },
            "spec": {
                "containers": [
                    {"name": "vllm", "ports": [{"name": "http", "containerPort": 8000}]},
                    {
                        "name": "lmcache",
                        "ports": [
                            {"name": "lmcache-api", "containerPort": 8080},
                            {"name": "lmcache-metrics", "containerPort": 9090},
                        ],
                    },
                    {"name": "kvtier-probe", "ports": [{"name": "probe-metrics", "containerPort": 9400}]},
                ]
            },
            "status": {"podIP": address(index), "conditions": [{"type": "Ready", "status": "True"}]},
        }
        loop.targets.apply("ADDED", pod)
        if index % per_deployment == 0:
            loop.observe(
                "ADDED",
                {
                    "apiVersion": "kvtier.io/v1alpha1",
                    "kind": "InferenceDeployment",
                    "metadata": {
                        "namespace": "bench",
                        "name": deployment,
                        "uid": deployment,
                        "resourceVersion": "1",
                        "generation": 1,
                    },
                    "status": {},
                },
            )
    assert all(isinstance(t, Target) for t in loop.targets.targets())
    results = []
    async with Scraper(metrics=loop.metrics, concurrency=concurrency, timeout=10) as scraper:
        for _ in range(cycles):
            cpu, wall = time.process_time(), time.perf_counter()
            await loop.cycle(scraper)
            errors = sum(len(d.failures) for d in loop.deployments.values())
            results.append((time.process_time() - cpu, time.perf_counter() - wall, errors))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=2000, help="Scrape targets (endpoints), four per replica.")
    parser.add_argument("--cycles", type=int, default=4, help="Cycles measured (the first opens the connections).")
    parser.add_argument("--replicas-per-deployment", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    replicas = max(1, args.targets // len(ENDPOINTS))
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Event(), context.Event()
    server = context.Process(target=serve, args=(replicas, ready, stop), daemon=True)
    server.start()
    try:
        if not ready.wait(120):
            raise SystemExit("the page server did not start")
        results = asyncio.run(measure(replicas, args.replicas_per_deployment, args.cycles, args.concurrency))
    finally:
        stop.set()
        server.join(10)
    print(
        f"{replicas * len(ENDPOINTS)} targets ({replicas} replicas x {len(ENDPOINTS)} endpoints, "
        f"{-(-replicas // args.replicas_per_deployment)} deployments), concurrency {args.concurrency}"
    )
    for number, (cpu, wall, errors) in enumerate(results, 1):
        print(f"  cycle {number}: {cpu:.2f} s CPU, {wall:.2f} s wall, {errors} failed scrapes")
    steady = results[1:] or results
    cpu = sum(r[0] for r in steady) / len(steady)
    wall = sum(r[1] for r in steady) / len(steady)
    print(
        f"steady cycle: {cpu:.2f} s CPU = {cpu / 15:.1%} of one core per 15 s cycle "
        f"(goal < {GOAL_SECONDS:.2f} s, 25%): {'met' if cpu < GOAL_SECONDS else 'NOT met'}; wall {wall:.2f} s"
    )
    print(f"peak RSS of the operator side: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
