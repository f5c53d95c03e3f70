"""Sweep the rebalance settings over every scenario and print how close ``kvtier`` gets to the best.

For each scenario (the public ``three-phased`` and ``bench/scenarios/*.yaml``) the baselines run
once: ``shared`` (one LRU, no quotas), ``equal`` and ``oracle-dynamic`` (the hindsight per-epoch
split, a grown partition getting its blocks back at once), and for reference the same splits on
real LRU partitions (a grown partition starts empty, as kvtier's do): what foresight alone buys, and
the previous epoch's best split on real partitions (``PreviousEpochOracle``): what a causal rebalancer
with perfect knowledge of the past gets. Then ``kvtier`` runs with every setting of the grid, a KVPool's ``spec.rebalance``
(``interval``, ``cooldown``, ``maxStep``, ``minGain``) plus the estimator's window (its half-life
in intervals). The table gives, per setting and scenario, kvtier's block hit ratio as a share of
max(shared, oracle-dynamic), then the worst and the mean over the scenarios; the best setting is
the one with the highest worst case (ties: the mean). ``--grid around`` varies one knob at a time
from the shipped defaults; ``--grid full`` tries every combination of the values below.

    .venv/bin/python bench/rebalance_sweep.py [--grid around|full] [--scenario FILE ...]
"""

from __future__ import annotations

import argparse
import itertools
import pathlib
import time
from dataclasses import dataclass

from kvtier.api.kvpool import RebalanceSpec
from kvtier.api.units import parse_duration
from kvtier.rebalance.demand import HALF_LIFE_INTERVALS
from kvtier.sim.cache import IsolatedLRU
from kvtier.sim.hindsight import Hindsight
from kvtier.sim.policies import KvtierPolicy, OracleDynamicPolicy, PreviousEpochOracle, build_policies, run_policy
from kvtier.sim.scenario import Scenario, load_scenario

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = next(
    (parent / "shared" for parent in ROOT.parents if (parent / "shared" / "scenarios").is_dir()), ROOT.parent / "shared"
)
PUBLIC = SHARED / "scenarios" / "three-phased.yaml"
OWN = sorted((ROOT / "bench" / "scenarios").glob("*.yaml"))

#: Values tried per knob (durations in seconds, as a KVPool may spell them).
GRID = {
    "interval": ["15s", "30s", "60s", "120s"],
    "cooldown": ["0s", "60s", "300s"],
    "maxStep": [0.1, 0.25, 0.5, 1.0],
    "minGain": [0.0, 0.01, 0.05],
    "halfLife": [0.25, 0.5, 1.0, 2.0],
}


@dataclass(frozen=True)
class Setting:
    spec: dict
    half_life: float

    @property
    def label(self) -> str:
        parts = [f"{key}={value}" for key, value in self.spec.items()]
        return " ".join(parts + [f"halfLife={self.half_life:g}"])


def defaults() -> Setting:
    spec = RebalanceSpec()
    return Setting(
        {
            "interval": f"{spec.interval:g}s",
            "cooldown": f"{spec.cooldown:g}s",
            "maxStep": spec.max_step,
            "minGain": spec.min_gain,
        },
        HALF_LIFE_INTERVALS,
    )


def grid(kind: str, overrides: dict, knobs: list[str]) -> list[Setting]:
    base = defaults()
    half_life = float(overrides.pop("halfLife", base.half_life))
    base = Setting({**base.spec, **overrides}, half_life)
    if kind == "full":
        keys = [key for key in GRID if key != "halfLife"]
        return [
            Setting(dict(zip(keys, values)), half_life)
            for values in itertools.product(*(GRID[key] for key in keys))
            for half_life in GRID["halfLife"]
        ]
    settings = [base]
    for key, values in GRID.items():
        if knobs and key not in knobs:
            continue
        for value in values:
            if key == "halfLife":
                setting = Setting(base.spec, value)
            else:
                setting = Setting({**base.spec, key: value}, base.half_life)
            if setting not in settings:
                settings.append(setting)
    return settings


class RefillingOracle(OracleDynamicPolicy):
    """``oracle-dynamic``'s splits on real partitions: a grown one fills with misses."""

    def pool(self, scenario: Scenario) -> IsolatedLRU:
        return IsolatedLRU(self.initial_quotas(scenario))


def with_spec(scenario: Scenario, spec: dict) -> Scenario:
    return scenario.model_copy(update={"rebalance": RebalanceSpec.model_validate(spec)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", choices=["around", "full"], default="around")
    parser.add_argument("--scenario", type=pathlib.Path, action="append", help="instead of the default set")
    parser.add_argument(
        "--base",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="start --grid around from this instead of the shipped default",
    )
    parser.add_argument("--knob", action="append", default=[], help="vary only these knobs")
    args = parser.parse_args()
    paths = args.scenario or [PUBLIC, *OWN]
    scenarios = [load_scenario(path) for path in paths]
    loaded = {}
    best: dict[str, float] = {}
    print(
        "| scenario | tenants | pool blocks | equal | shared | oracle-dynamic | its splits, real refill | previous epoch's best split |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for scenario in scenarios:
        workloads = scenario.workloads()
        loaded[scenario.name] = workloads
        hindsight = Hindsight(workloads, scenario.epoch_seconds)
        policies = {
            **build_policies(["equal", "shared"], scenario, workloads),
            "oracle-dynamic": OracleDynamicPolicy(scenario, hindsight),
            "real refill": RefillingOracle(scenario, hindsight),
            "previous": PreviousEpochOracle(scenario, hindsight),
        }
        ratios = {
            name: run_policy(policy, scenario, workloads).overall.block_hit_ratio for name, policy in policies.items()
        }
        best[scenario.name] = max(ratios["shared"], ratios["oracle-dynamic"])
        print(
            f"| {scenario.name} | {len(scenario.tenants)} | {scenario.capacity_blocks:,} | {ratios['equal']:.4f} | "
            f"{ratios['shared']:.4f} | {ratios['oracle-dynamic']:.4f} | {ratios['real refill']:.4f} | {ratios['previous']:.4f} |"
        )
    print()
    names = [scenario.name for scenario in scenarios]
    print("kvtier block hit ratio / max(shared, oracle-dynamic):")
    print("| setting | " + " | ".join(names) + " | worst | mean | s |")
    print("|---|" + "---:|" * (len(names) + 3))
    rows = []
    overrides = {}
    for item in args.base:
        key, value = item.split("=", 1)
        overrides[key] = float(value) if key in ("maxStep", "minGain", "halfLife") else f"{parse_duration(value):g}s"
    for setting in grid(args.grid, overrides, args.knob):
        started = time.perf_counter()
        shares = []
        for scenario in scenarios:
            adjusted = with_spec(scenario, setting.spec)
            result = run_policy(
                KvtierPolicy(adjusted, half_life_intervals=setting.half_life), adjusted, loaded[scenario.name]
            )
            shares.append(result.overall.block_hit_ratio / best[scenario.name])
        worst, mean = min(shares), sum(shares) / len(shares)
        rows.append((worst, mean, setting))
        print(
            f"| {setting.label} | "
            + " | ".join(f"{share:.3f}" for share in shares)
            + f" | {worst:.3f} | {mean:.3f} | {time.perf_counter() - started:.0f} |",
            flush=True,
        )
    worst, mean, setting = max(rows, key=lambda row: (row[0], row[1]))
    print(f"\nbest: {setting.label} (worst {worst:.3f}, mean {mean:.3f}); shipped: {defaults().label}")


if __name__ == "__main__":
    main()
