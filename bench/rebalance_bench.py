"""The whole replay of a one-hour, three-tenant scenario, every policy, on one core (issue 7: < 2 min).

Prints the wall time of each step (loading the traces, the oracles' hindsight, every policy's
replay) and the total, and the block hit ratio and GPU prefill seconds saved of every policy
(``kvtier`` with the scenario's ``rebalance``, the KVPool defaults when it has none).

    .venv/bin/python bench/rebalance_bench.py [--scenario FILE]
"""

from __future__ import annotations

import argparse
import pathlib
import time

from kvtier.sim.report import replay_scenario
from kvtier.sim.scenario import load_scenario

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = next(
    (parent / "shared" for parent in ROOT.parents if (parent / "shared" / "scenarios").is_dir()), ROOT.parent / "shared"
)
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
        overall = run.result.overall
        print(
            f"  {run.name:16s} block hit ratio {overall.block_hit_ratio:.4f}, GPU prefill s saved "
            f"{overall.gpu_prefill_seconds_saved:,.0f}, TTFT p50 {overall.ttft_p50_seconds:.3f} s"
        )


if __name__ == "__main__":
    main()
