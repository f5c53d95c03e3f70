"""The whole replay of a one-hour, three-tenant scenario, every policy, on one core (issue 7: < 2 min).

Prints the wall time of each step (loading the traces, the oracles' hindsight, every policy's
replay) and the total, the block hit ratio of every policy, and, for comparison, the ``kvtier``
policy with the KVPool's default safety settings (``maxStep: 0.25``, ``cooldown: 5m``) instead of
the scenario's.

    .venv/bin/python bench/rebalance_bench.py [--scenario FILE]
"""

from __future__ import annotations

import argparse
import pathlib
import time

from kvtier.api.kvpool import RebalanceSpec
from kvtier.sim.policies import KvtierPolicy, run_policy
from kvtier.sim.report import replay_scenario
from kvtier.sim.scenario import load_scenario

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = next((parent / "shared" for parent in ROOT.parents if (parent / "shared" / "scenarios").is_dir()),
              ROOT.parent / "shared")
DEFAULT_SCENARIO = SHARED / "scenarios" / "three-phased.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", type=pathlib.Path, default=DEFAULT_SCENARIO)
    args = parser.parse_args()
    scenario = load_scenario(args.scenario)
    started = time.perf_counter()
    runs = replay_scenario(scenario, progress=lambda line: print(f"  {line}"))
    total = time.perf_counter() - started
    print(f"{scenario.name}: {len(scenario.tenants)} tenants, every policy replayed in {total:.1f} s (goal: < 120 s)")
    for run in runs:
        print(f"  {run.name:16s} block hit ratio {run.result.overall.block_hit_ratio:.4f}")

    spec = RebalanceSpec()
    safe = scenario.model_copy(update={"rebalance": scenario.rebalance.model_copy(
        update={"max_step": spec.max_step, "cooldown_seconds": spec.cooldown})})
    started = time.perf_counter()
    result = run_policy(KvtierPolicy(safe), safe)
    print(f"  kvtier with maxStep {spec.max_step:g}, cooldown {spec.cooldown:g} s: block hit ratio "
          f"{result.overall.block_hit_ratio:.4f} ({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
