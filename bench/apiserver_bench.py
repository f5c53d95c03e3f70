"""Benchmark of the embedded Kubernetes API server (kvtier.testing.apiserver).

    .venv/bin/python bench/apiserver_bench.py [--watchers 50] [--objects 5000] [--changes 300]

1. List latency: 1,000 ConfigMaps listed over HTTP (response received, and response + JSON decode).
2. Watch fan-out: `--watchers` concurrent watch streams on a namespace holding `--objects`
   ConfigMaps; `--changes` patches are sent one at a time (paced) and then as a burst; for each
   change, the delay until *all* watchers have received it.

The server runs on its own thread (ThreadedAPIServer, as tests use it); clients run on the main
thread's event loop.  Goals: list < 100 ms, watch delay < 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from kvtier.testing.apiserver import ThreadedAPIServer


def seed(server: ThreadedAPIServer, namespace: str, count: int) -> None:
    def create_all() -> None:
        cluster = server.cluster
        rt = cluster.resource("", "v1", "namespaces")
        if cluster.find(rt, None, namespace) is None:
            cluster.create(rt, None, {"metadata": {"name": namespace}})
        cm = cluster.resource("", "v1", "configmaps")
        for i in range(count):
            cluster.create(
                cm,
                namespace,
                {
                    "metadata": {"name": f"cm-{i:05d}", "labels": {"app": "bench", "shard": str(i % 10)}},
                    "data": {"model": "llama-3-70b", "quota": f"{i}Gi", "note": "x" * 200},
                },
            )

    server.call(create_all)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def summary(label: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (
        f"{label}: n={len(ms)} median={statistics.median(ms):.1f} ms p95={pct(ms, 95):.1f} ms "
        f"p99={pct(ms, 99):.1f} ms max={max(ms):.1f} ms"
    )


async def bench_list(url: str, repeats: int) -> None:
    path = "/api/v1/namespaces/list-bench/configmaps"
    raw, decoded = [], []
    async with aiohttp.ClientSession(url) as http:
        for _ in range(3):  # warm-up
            async with http.get(path) as r:
                await r.read()
        for _ in range(repeats):
            start = time.perf_counter()
            async with http.get(path) as r:
                body = await r.read()
            raw.append(time.perf_counter() - start)
            items = json.loads(body)["items"]
            decoded.append(time.perf_counter() - start)
    assert len(items) == 1000, len(items)
    print(summary("list 1,000 objects (HTTP)", raw))
    print(summary("list 1,000 objects (HTTP + JSON decode)", decoded))


async def bench_watch(url: str, watchers: int, changes: int) -> None:
    ns = "watch-bench"
    base = f"/api/v1/namespaces/{ns}/configmaps"
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=watchers + 10)) as http:
        async with http.get(base + "?limit=1") as r:
            rv = (await r.json())["metadata"]["resourceVersion"]
        seen: list[dict[str, float]] = [dict() for _ in range(watchers)]
        ready = asyncio.Event()
        connected = 0

        async def watch(index: int) -> None:
            nonlocal connected
            async with http.get(f"{base}?watch=true&resourceVersion={rv}&timeoutSeconds=600") as r:
                connected += 1
                if connected == watchers:
                    ready.set()
                buffer = b""
                async for chunk in r.content.iter_any():
                    now = time.perf_counter()
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line:
                            event = json.loads(line)
                            seen[index][event["object"]["metadata"]["resourceVersion"]] = now

        tasks = [asyncio.create_task(watch(i)) for i in range(watchers)]
        await asyncio.wait_for(ready.wait(), 30)

        async def change(i: int) -> tuple[str, float]:
            start = time.perf_counter()
            async with http.patch(
                f"{base}/cm-{i % 5000:05d}",
                json={"data": {"quota": f"{i}Mi"}},
                headers={"Content-Type": "application/merge-patch+json"},
            ) as r:
                result = await r.json()
            return result["metadata"]["resourceVersion"], start

        async def delays(sent: list[tuple[str, float]]) -> list[float]:
            deadline = time.perf_counter() + 30
            while time.perf_counter() < deadline and not all(all(rv in s for rv, _ in sent) for s in seen):
                await asyncio.sleep(0.01)
            return [max(s[rv] for s in seen) - start for rv, start in sent]

        paced = []
        for i in range(changes):
            paced.append(await change(i))
            await asyncio.sleep(0.01)
        print(summary(f"watch delay, paced changes ({watchers} watchers)", await delays(paced)))
        burst = await asyncio.gather(*(change(changes + i) for i in range(changes)))
        print(
            summary(
                f"watch delay, burst of {changes} concurrent changes ({watchers} watchers)", await delays(list(burst))
            )
        )
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watchers", type=int, default=50)
    parser.add_argument("--objects", type=int, default=5000)
    parser.add_argument("--changes", type=int, default=300)
    parser.add_argument("--list-repeats", type=int, default=50)
    args = parser.parse_args()
    with ThreadedAPIServer() as server:
        start = time.perf_counter()
        seed(server, "list-bench", 1000)
        seed(server, "watch-bench", args.objects)
        print(f"seeded {1000 + args.objects} objects in {time.perf_counter() - start:.2f} s")
        asyncio.run(bench_list(server.url, args.list_repeats))
        asyncio.run(bench_watch(server.url, args.watchers, args.changes))


if __name__ == "__main__":
    main()
