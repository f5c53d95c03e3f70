"""kvsim replay speed on the Mooncake traces (one core, pure Python).

Prints block accesses per second for: the bare LRU cache model, the full replay core (engine
tiers, latency model, merged tenants, hooks) and the exact stack-distance computation, then every
policy of the public scenario (``three-phased``, with its shipped rebalance defaults).
Goals: >= 200,000 block accesses per second through the replay core (issue 6); >= 500,000 for
the ``kvtier`` policy (issue 18). Run it on one core: ``taskset -c 0``.

    taskset -c 0 .venv/bin/python bench/sim_replay_bench.py [--traces DIR] [--repeat N] [--scenario FILE]
"""

from __future__ import annotations

import argparse
import pathlib
import time
from collections.abc import Callable

from kvtier.probe.stackdist import stream_histogram
from kvtier.sim.cache import IsolatedLRU, LRUCache
from kvtier.sim.engine import EngineParams
from kvtier.sim.policies import build_policies, run_policy
from kvtier.sim.replay import Replay, TenantWorkload
from kvtier.sim.scenario import load_scenario
from kvtier.sim.trace import Request, load_trace

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_TRACES = ROOT.parent / "shared" / "traces" / "mooncake"
DEFAULT_SCENARIO = ROOT.parent / "shared" / "scenarios" / "three-phased.yaml"
NAMES = ("conversation", "synthetic")


def best_of(repeat: int, run: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=pathlib.Path, default=DEFAULT_TRACES)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scenario", type=pathlib.Path, default=DEFAULT_SCENARIO)
    args = parser.parse_args()

    traces: dict[str, list[Request]] = {}
    start = time.perf_counter()
    for index, name in enumerate(NAMES):
        traces[name] = load_trace(args.traces / f"mooncake_{name}_trace.jsonl", namespace=index)
    load_seconds = time.perf_counter() - start
    requests = sum(len(t) for t in traces.values())
    accesses = sum(len(r.blocks) for t in traces.values() for r in t)
    unique = {name: len({b for r in t for b in r.blocks}) for name, t in traces.items()}
    print(f"traces: {requests:,} requests, {accesses:,} block accesses, loaded in {load_seconds:.2f} s")

    def cache_model() -> None:
        for name, trace in traces.items():
            cache = LRUCache(unique[name] // 10)
            for request in trace:
                cache.access(request.blocks)

    def replay_core() -> None:
        workloads = [
            TenantWorkload(name, trace, EngineParams(), replicas=3 if name == "conversation" else 1)
            for name, trace in traces.items()
        ]
        quotas = {name: unique[name] // 10 for name in traces}
        replay = Replay(workloads, IsolatedLRU(quotas))
        replay.every(15, lambda now: None)
        replay.run()

    def tiered_replay() -> None:
        params = EngineParams(hbm_blocks=2_000, cpu_blocks=8_000)
        workloads = [TenantWorkload(name, trace, params) for name, trace in traces.items()]
        Replay(workloads, IsolatedLRU({name: unique[name] // 10 for name in traces})).run()

    def stack_distances() -> None:
        for trace in traces.values():
            stream_histogram(request.blocks for request in trace)

    for label, run in (
        ("LRU cache model (10% of unique blocks)", cache_model),
        ("replay core: engines + pool + latency + hooks", replay_core),
        ("replay core with HBM and CPU tiers", tiered_replay),
        ("exact stack distances (whole streams)", stack_distances),
    ):
        seconds = best_of(args.repeat, run)
        print(f"{label:48s} {accesses / seconds:>12,.0f} block accesses/s  ({seconds:.3f} s)")

    scenario = load_scenario(args.scenario)
    workloads = scenario.workloads()
    accesses = sum(len(r.blocks) for w in workloads for r in w.requests)
    print(
        f"\n{scenario.name}: {accesses:,} block accesses; kvtier rebalance "
        f"{scenario.rebalance.model_dump(mode='json', by_alias=True)}"
    )
    for name in scenario.policies:
        seconds = best_of(
            args.repeat, lambda: run_policy(build_policies([name], scenario, workloads)[name], scenario, workloads)
        )
        print(f"policy {name:41s} {accesses / seconds:>12,.0f} block accesses/s  ({seconds:.3f} s)")


if __name__ == "__main__":
    main()
