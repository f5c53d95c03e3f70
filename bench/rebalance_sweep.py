"""Sweep the rebalance settings over every scenario and print how close ``kvtier`` gets to the best.

For each scenario (the public ``three-phased`` and ``bench/scenarios/*.yaml``) the baselines run
once: ``shared`` (one LRU, no quotas), ``equal`` and ``oracle-dynamic`` (the hindsight per-epoch
split, a grown partition getting its blocks back at once), and for reference the same splits on
real LRU partitions (a grown partition starts empty, as kvtier's do): what foresight alone buys, and
the previous epoch's best split on real partitions (``PreviousEpochOracle``): what a causal rebalancer
with perfect knowledge of the past gets. Then ``kvtier`` runs with every setting of the grid, a KVPool's ``spec.rebalance``
(``interval``, ``cooldown``, ``maxStep``, ``minGain``) plus the estimator's window (its half-life
in intervals). The table gives, per setting and scenario, kvtier's block hit ratio as a share of
max(shared, oracle-dynamic), then the worst and the mean over the scenarios, the quota changes an
hour (mean over the scenarios) and the seconds the replays took.

The pick (:func:`pick`): settings within one point (:data:`TIED`) of the best worst case and of
the best mean are tied on hit ratio; of those, the one with the fewest rounds (the longest
``interval``), then the fewest quota changes, then the best worst case and mean wins, compared as
the table prints them (then the longer ``cooldown``, which changes nothing where it is at most
the interval). Every round costs the operator a scrape of every replica and the replay its
allocation (sweeps and capacity plans replay many times), and every quota change evicts from a
partition, calls every replica's quota API and posts Events; a point of hit ratio is worth them,
a fraction of one is not.

``--grid around`` varies one knob at a time from the shipped defaults; ``--grid full`` tries every
combination of the values below (576 settings: 1h55m of CPU on a 2-core machine; ``--jobs 2``
replays two at once, 59 minutes); ``--setting`` replays the settings named (as the table labels
them). ``--pool-scale 0.5,1,2`` replays each scenario with its pool that many times its size
instead (a pick should not hang on one size). ``--variants`` instead runs changes of the
algorithm (:data:`VARIANTS`) with the shipped settings (or ``--base`` ones), then the loop on
exact curves instead of estimates (:data:`REFERENCES`), which the best pick leaves out.

    .venv/bin/python bench/rebalance_sweep.py [--grid around|full | --setting LABEL ...] [--jobs N] [--scenario FILE ...] [--pool-scale F,...]
    .venv/bin/python bench/rebalance_sweep.py --variants [--scenario FILE ...] [--base KNOB=VALUE ...]
"""

from __future__ import annotations

import argparse
import itertools
import math
import multiprocessing
import pathlib
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

from kvtier.api.kvpool import RebalanceSpec
from kvtier.api.units import parse_duration
from kvtier.probe.demand import HitCurve
from kvtier.probe.options import ProbeOptions
from kvtier.rebalance.allocator import predict
from kvtier.rebalance.demand import HALF_LIFE_INTERVALS
from kvtier.rebalance.estimator import (
    CounterReading,
    DemandEstimator,
    Estimate,
    ProbeReading,
    probe_increment,
    storage_curve,
)
from kvtier.rebalance.loop import WARMUP_HORIZON_INTERVALS, DeploymentState
from kvtier.rebalance.loop import _demands as loop_demands  # the loop's own valuation of a split
from kvtier.sim.cache import IsolatedLRU
from kvtier.sim.hindsight import Hindsight
from kvtier.sim.policies import (
    STALE_SCRAPES,
    KvtierPolicy,
    OracleDynamicPolicy,
    Timeline,
    build_policies,
    run_policy,
)
from kvtier.sim.references import (
    CAUSAL_REFERENCES,
    FORESIGHT_SECONDS,
    PreviousEpochOracle,
    extrapolated,
    foresight_reference,
    intervals,
)
from kvtier.sim.replay import Replay, TenantWorkload
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

#: Shares of the best this close are a tie on hit ratio (see the module's docstring).
TIED = 0.01


@dataclass(frozen=True)
class Setting:
    spec: dict
    half_life: float

    @property
    def label(self) -> str:
        parts = [f"{key}={value}" for key, value in self.spec.items()]
        return " ".join(parts + [f"halfLife={self.half_life:g}"])

    @classmethod
    def from_label(cls, label: str) -> Setting:
        """The setting a table row names (``interval=60s cooldown=60s ... halfLife=0.25``)."""
        knobs = dict(item.split("=", 1) for item in label.split())
        if set(knobs) != set(GRID):
            raise SystemExit(f"--setting needs exactly {', '.join(GRID)}; got {label!r}")
        half_life = float(knobs.pop("halfLife"))
        return cls({key: _knob(key, value) for key, value in knobs.items()}, half_life)


def _knob(key: str, value: str) -> float | str:
    """A knob's value as the grid spells it: a number, or a duration in seconds."""
    return float(value) if key in ("maxStep", "minGain", "halfLife") else f"{parse_duration(value):g}s"


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


class TeeEstimator(DemandEstimator):
    """An estimator that feeds every reading to a second one as well (a longer window, say)."""

    def __init__(self, half_life_seconds: float, stale_seconds: float, also: DemandEstimator) -> None:
        super().__init__(half_life_seconds, stale_seconds)
        self.also = also

    def observe_probe(self, reading: ProbeReading) -> None:
        super().observe_probe(reading)
        self.also.observe_probe(reading)

    def observe_counters(self, reading: CounterReading) -> None:
        super().observe_counters(reading)
        self.also.observe_counters(reading)


class TwoWindowPolicy(KvtierPolicy):
    """kvtier with a second estimator per tenant over a window of ``long_intervals`` intervals."""

    def __init__(self, scenario: Scenario, long_intervals: float) -> None:
        super().__init__(scenario)
        interval, stale = self.settings.interval_seconds, STALE_SCRAPES * scenario.scrape_seconds
        self.long = {name: DemandEstimator(long_intervals * interval, stale) for name in self.estimators}
        self.estimators = {
            name: TeeEstimator(estimator.half_life, stale, self.long[name])
            for name, estimator in self.estimators.items()
        }

    def long_estimate(
        self, tenant: str, now: float, units: int, *, unit_chunks: float, front_chunks: float
    ) -> Estimate:
        return self.long[tenant].estimate(
            now, units, unit_chunks=unit_chunks, chunk_tokens=self.scenario.block_tokens, front_chunks=front_chunks
        )


class TrendPolicy(TwoWindowPolicy):
    """Extrapolates each curve along its trend: short + ``k`` x (short - long), kept non-decreasing
    (growing reuse shows in the short window before the long one)."""

    def __init__(self, scenario: Scenario, long_intervals: float, k: float) -> None:
        super().__init__(scenario, long_intervals)
        self.k = k

    def estimate(self, tenant: str, now: float, units: int, *, unit_chunks: float, front_chunks: float) -> Estimate:
        short = super().estimate(tenant, now, units, unit_chunks=unit_chunks, front_chunks=front_chunks)
        long = self.long_estimate(tenant, now, units, unit_chunks=unit_chunks, front_chunks=front_chunks)
        if short.stale or long.stale:
            return short
        curve = [0.0]
        for recent, older in zip(short.curve[1:], long.curve[1:]):
            curve.append(max(curve[-1], recent + self.k * (recent - older)))
        return replace(short, curve=tuple(curve))


class VetoPolicy(TwoWindowPolicy):
    """Hysteresis: a move is made only when the long window predicts it gains too (noise in the short
    window then cannot move quota back and forth)."""

    def decide(self, now: float, current: Mapping[str, int]) -> Mapping[str, int] | None:
        last_move = self.last_move
        target = super().decide(now, current)
        if target is None:
            return None
        scenario, unit, settings = self.scenario, self.unit_blocks, self.settings
        capacity = scenario.capacity_blocks // unit
        states = {
            tenant.name: DeploymentState(
                current[tenant.name] // unit,
                self.long_estimate(
                    tenant.name, now, capacity, unit_chunks=unit, front_chunks=max(tenant.hbm_blocks, tenant.cpu_blocks)
                ),
                unit_tokens=unit * scenario.block_tokens,
            )
            for tenant in scenario.tenants
        }
        active = {name: state for name, state in states.items() if not state.frozen}
        demands = loop_demands(
            active,
            math.floor(settings.max_step * capacity),
            settings.interval_seconds * settings.warmup_horizon_intervals,
        )
        before = predict(demands, {name: state.current for name, state in active.items()})
        if predict(demands, {name: target[name] // unit for name in active}) < before:
            self.last_move = last_move  # vetoed: the pool did not move
            return None
        return target


class QueueReliefPolicy(KvtierPolicy):
    """Values a tenant's hits by the GPU queue they relieve: the cost model's GPU seconds x 1 / (1 - u),
    u the share of the last round its replicas' GPUs were busy (capped at 0.95; a pod would read it from
    ``vllm:request_prefill_time_seconds``): a hit on a busy replica shortens every wait behind it, one on
    an idle replica only its own prefill."""

    def attach(self, replay: Replay, scenario: Scenario) -> None:
        self.replay = replay
        self.busy: dict[str, tuple[float, float]] = {}
        super().attach(replay, scenario)

    def states(self, now: float, current: Mapping[str, int]) -> dict[str, DeploymentState]:
        states = super().states(now, current)
        for name, state in states.items():
            queues = self.replay.queues[name]
            busy = sum(queue.gpu_seconds for queue in queues)
            since, busy_then = self.busy.get(name, (0.0, 0.0))
            self.busy[name] = (now, busy)
            utilization = min(0.95, (busy - busy_then) / max(now - since, 1e-9) / len(queues))
            states[name] = replace(state, hit_value=state.hit_value / (1 - utilization))
        return states


class WaitingPolicy(KvtierPolicy):
    """Blends the GPU seconds a split saves with the waiting it saves: per tenant, M/M/1 waits on its
    replicas' GPUs and storage paths, ``R (u / (1 - u) + r / (1 - r))`` with u the GPUs' share busy
    computing misses and r the storage paths' share busy loading hits (each capped at 0.98), both
    read off the curve at every quota with the tenant's cost model. ``weight`` is the waits' share
    of the value (1: first tokens only, 0: shipped)."""

    def __init__(self, scenario: Scenario, weight: float) -> None:
        super().__init__(scenario)
        self.weight = weight

    def attach(self, replay: Replay, scenario: Scenario) -> None:
        self.replicas = {name: len(engines) for name, engines in replay.replicas.items()}
        super().attach(replay, scenario)

    def states(self, now: float, current: Mapping[str, int]) -> dict[str, DeploymentState]:
        states = super().states(now, current)
        for (name, state), cost in zip(list(states.items()), self.costs):
            estimate = state.estimate
            if estimate is None or estimate.stale or state.hit_value <= 0:
                continue
            replicas, gpu, load = self.replicas[name], state.hit_value, cost.load_seconds(1)
            asked = estimate.access_tokens_per_second

            def waits(hits: float) -> float:
                busy = [min(0.98, max(0.0, asked - hits) * gpu / replicas), min(0.98, hits * load / replicas)]
                return replicas * sum(share / (1 - share) for share in busy)

            idle = waits(estimate.curve[0])
            curve = tuple(
                self.weight * max(0.0, idle - waits(hits)) / gpu + (1 - self.weight) * hits for hits in estimate.curve
            )
            states[name] = replace(state, estimate=replace(estimate, curve=curve))
        return states


class IntervalsEstimator(DemandEstimator):
    """The shipped estimator, also keeping what the probe added in each interval (its bounds' weights)."""

    def __init__(self, half_life_seconds: float, stale_seconds: float, interval: float) -> None:
        super().__init__(half_life_seconds, stale_seconds)
        self.interval = interval
        self.bounds: tuple[float, ...] = ()
        #: Interval index -> [total, lookups, cumulative weight at each bound] added in it.
        self.added: dict[int, list[float]] = {}
        self._last: ProbeReading | None = None

    def observe_probe(self, reading: ProbeReading) -> None:
        super().observe_probe(reading)
        previous, self._last = self._last, reading
        increment = None if previous is None else probe_increment(previous, reading)
        if increment is None:
            return
        buckets, total, lookups = increment
        self.bounds = reading.bounds
        index = math.ceil(reading.time / self.interval) - 1  # a reading at the end of an interval counts in it
        into = self.added.setdefault(index, [0.0] * (2 + len(buckets)))
        for position, weight in enumerate([total, lookups, *buckets]):
            into[position] += weight


class ProbeTrendPolicy(KvtierPolicy):
    """The least-squares trend of the probe's per-interval curves over the last ``window`` seconds,
    read at the next interval (what ``CAUSAL_REFERENCES`` extrapolates from exact curves, here from
    the probe's binned histograms); the shipped estimate until half the window is seen."""

    def __init__(self, scenario: Scenario, window: float) -> None:
        super().__init__(scenario)
        self.window = max(2, intervals(scenario, window))
        interval, stale = self.settings.interval_seconds, STALE_SCRAPES * scenario.scrape_seconds
        self.estimators = {
            name: IntervalsEstimator(estimator.half_life, stale, interval)
            for name, estimator in self.estimators.items()
        }

    def estimate(self, tenant: str, now: float, units: int, *, unit_chunks: float, front_chunks: float) -> Estimate:
        shipped = super().estimate(tenant, now, units, unit_chunks=unit_chunks, front_chunks=front_chunks)
        estimator = self.estimators[tenant]
        assert isinstance(estimator, IntervalsEstimator)
        at = round(now / estimator.interval)
        seen = [index for index in range(at - self.window, at) if index in estimator.added]
        if shipped.stale or len(seen) < max(2, self.window // 2) or seen != list(range(seen[0], at)):
            return shipped
        curves = [
            storage_curve(
                HitCurve(estimator.bounds, tuple(estimator.added[index][2:]), estimator.added[index][0]),
                units,
                unit_chunks,
                front_chunks,
            )
            for index in seen
        ]
        per_second = self.scenario.block_tokens / estimator.interval
        return replace(shipped, curve=tuple(value * per_second for value in extrapolated(curves, at - seen[0])))


class HorizonPolicy(KvtierPolicy):
    """Values a move over ``horizon`` intervals ahead instead of the shipped
    :data:`~kvtier.rebalance.loop.WARMUP_HORIZON_INTERVALS`: longer pays slow refills, shorter reacts faster."""

    def __init__(self, scenario: Scenario, horizon: float) -> None:
        super().__init__(scenario)
        self.settings = replace(self.settings, warmup_horizon_intervals=horizon)


class DampedReversalPolicy(KvtierPolicy):
    """Hysteresis without a freeze: a move that reverses the last one (a deployment that grew now
    shrinks, or the other way) within ``rounds`` rounds of it is cut to ``factor`` of its size
    (grows rounded down, shrinks up, so the quotas never exceed the pool)."""

    def __init__(self, scenario: Scenario, rounds: int, factor: float) -> None:
        super().__init__(scenario)
        self.rounds, self.factor = rounds, factor
        self.last_deltas: tuple[float, dict[str, int]] | None = None

    def decide(self, now: float, current: Mapping[str, int]) -> Mapping[str, int] | None:
        last_move = self.last_move
        target = super().decide(now, current)
        if target is None:
            return None
        unit = self.unit_blocks
        deltas = {name: (target[name] - current[name]) // unit for name in target}
        if self.last_deltas is not None and now - self.last_deltas[0] <= self.rounds * self.settings.interval_seconds:
            last = self.last_deltas[1]
            if any(delta * last.get(name, 0) < 0 for name, delta in deltas.items()):
                deltas = {
                    name: math.floor(delta * self.factor) if delta > 0 else -math.ceil(-delta * self.factor)
                    for name, delta in deltas.items()
                }
                target = {name: current[name] + delta * unit for name, delta in deltas.items()}
        if not any(deltas.values()):
            self.last_move = last_move  # cut to nothing: the pool did not move
            return None
        self.last_deltas = (now, deltas)
        return target


#: Changes of the algorithm tried against the shipped one (all with the shipped settings).
VARIANTS: dict[str, Callable[[Scenario], KvtierPolicy]] = {
    "shipped": KvtierPolicy,
    "probe: 4 buckets an octave (shipped: 2)": lambda s: KvtierPolicy(
        s, probe=ProbeOptions(log_dir="", buckets_per_octave=4)
    ),
    "probe: 8 buckets an octave": lambda s: KvtierPolicy(s, probe=ProbeOptions(log_dir="", buckets_per_octave=8)),
    "trend: k 0.5 against a 1-interval window": lambda s: TrendPolicy(s, 1.0, 0.5),
    "trend: k 0.5 against a 4-interval window": lambda s: TrendPolicy(s, 4.0, 0.5),
    "trend: k 1 against a 1-interval window": lambda s: TrendPolicy(s, 1.0, 1.0),
    "veto unless a 2-interval window gains too": lambda s: VetoPolicy(s, 2.0),
    "veto unless a 4-interval window gains too": lambda s: VetoPolicy(s, 4.0),
    **{
        f"trend: least squares over the probe's curves of the last {window} s": (
            lambda s, window=window: ProbeTrendPolicy(s, window)
        )
        for window in (600, 1200)
    },
    "hits valued by the GPU queue they relieve": QueueReliefPolicy,
    **{
        f"waits on GPUs and storage paths weighed {weight:g} against GPU seconds": (
            lambda s, weight=weight: WaitingPolicy(s, weight)
        )
        for weight in (1.0, 0.25, 0.1, 0.05)
    },
    "a reversal within 1 round not made": lambda s: DampedReversalPolicy(s, 1, 0.0),
    "a reversal within 2 rounds halved": lambda s: DampedReversalPolicy(s, 2, 0.5),
    **{
        f"a move valued over {horizon:g} intervals (shipped: {WARMUP_HORIZON_INTERVALS:g})": (
            lambda s, horizon=horizon: HorizonPolicy(s, horizon)
        )
        for horizon in (1.0, 1.5, 3.0, 4.0, 8.0)
    },
}

#: What the loop reaches on exact curves (not estimates): bounds that tell the estimator's share of a
#: miss from the loop's. Not candidates for the shipped algorithm (the next interval's is foresight).
REFERENCES: dict[str, Callable[[Scenario], KvtierPolicy]] = {
    **{f"reference: {label}": policy_of for label, policy_of in CAUSAL_REFERENCES.items()},
    f"reference: the loop on the next {FORESIGHT_SECONDS} s of exact curves (foresight)": foresight_reference,
}


#: The scenarios a grid replays and their loaded workloads, set before the worker processes fork.
_SWEPT: list[tuple[Scenario, list[TenantWorkload]]] = []


@dataclass(frozen=True)
class Replayed:
    """kvtier under one setting or variant on every swept scenario."""

    ratios: list[float]
    ttfts: list[float]
    changes_per_hour: list[float]
    seconds: float


def replay_all(
    scenarios: list[tuple[Scenario, list[TenantWorkload]]], policy_of: Callable[[Scenario], KvtierPolicy]
) -> Replayed:
    started = time.perf_counter()
    ratios, ttfts, changes = [], [], []
    for scenario, workloads in scenarios:
        timeline = Timeline()
        result = run_policy(policy_of(scenario), scenario, workloads, timeline)
        ratios.append(result.overall.block_hit_ratio)
        ttfts.append(result.overall.ttft_p50_seconds)
        changes.append(timeline.moves * 3600 / timeline.times[-1])
    return Replayed(ratios, ttfts, changes, time.perf_counter() - started)


def replay_setting(setting: Setting) -> Replayed:
    """kvtier under one grid setting on every swept scenario."""
    return replay_all(
        [(with_spec(scenario, setting.spec), workloads) for scenario, workloads in _SWEPT],
        lambda scenario: KvtierPolicy(scenario, half_life_intervals=setting.half_life),
    )


def with_pool_scaled(scenario: Scenario, factor: float) -> Scenario:
    """The scenario with its pool ``factor`` times its size (named ``<name>-x<factor>``)."""
    pool = scenario.pool.model_copy(
        update={"capacity_blocks": int(scenario.capacity_blocks * factor), "capacity": None}
    )
    return scenario.model_copy(update={"name": f"{scenario.name}-x{factor:g}", "pool": pool})


def with_spec(scenario: Scenario, spec: dict) -> Scenario:
    return scenario.model_copy(update={"rebalance": RebalanceSpec.model_validate(spec)})


@dataclass(frozen=True)
class Row:
    label: str
    worst: float
    mean: float
    changes_per_hour: float
    interval: float = 0.0
    """Seconds between rounds (0 for a variant: not a setting)."""
    cooldown: float = 0.0


def pick(rows: list[Row]) -> tuple[Row, list[Row]]:
    """The winner and the rows tied with it on hit ratio (module docstring)."""
    best_worst = max(row.worst for row in rows)
    best_mean = max(row.mean for row in rows)
    tied = [row for row in rows if row.worst >= best_worst - TIED and row.mean >= best_mean - TIED]
    winner = max(
        tied,
        key=lambda row: (
            row.interval,
            -round(row.changes_per_hour),
            round(row.worst, 3),
            round(row.mean, 3),
            row.cooldown,
        ),
    )
    return winner, tied


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", choices=["around", "full"], default="around")
    parser.add_argument(
        "--setting", action="append", default=[], metavar="LABEL", help="replay these settings instead of a grid"
    )
    parser.add_argument("--scenario", type=pathlib.Path, action="append", help="instead of the default set")
    parser.add_argument(
        "--base",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="start --grid around (or run --variants) from this instead of the shipped default",
    )
    parser.add_argument("--knob", action="append", default=[], help="vary only these knobs")
    parser.add_argument(
        "--variants", action="store_true", help="run the changes of the algorithm (VARIANTS) instead of a grid"
    )
    parser.add_argument("--jobs", type=int, default=1, help="grid settings replayed at once, one process each")
    parser.add_argument(
        "--pool-scale", default="", metavar="F,...", help="replay each scenario with its pool scaled by these instead"
    )
    args = parser.parse_args()
    paths = args.scenario or [PUBLIC, *OWN]
    scenarios = [load_scenario(path) for path in paths]
    if args.pool_scale:
        factors = [float(factor) for factor in args.pool_scale.split(",")]
        scenarios = [with_pool_scaled(scenario, factor) for scenario in scenarios for factor in factors]
    loaded = {}
    best: dict[str, float] = {}
    equal_ttft: dict[str, float] = {}
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
        results = {name: run_policy(policy, scenario, workloads).overall for name, policy in policies.items()}
        ratios = {name: result.block_hit_ratio for name, result in results.items()}
        equal_ttft[scenario.name] = results["equal"].ttft_p50_seconds
        best[scenario.name] = max(ratios["shared"], ratios["oracle-dynamic"])
        print(
            f"| {scenario.name} | {len(scenario.tenants)} | {scenario.capacity_blocks:,} | {ratios['equal']:.4f} | "
            f"{ratios['shared']:.4f} | {ratios['oracle-dynamic']:.4f} | {ratios['real refill']:.4f} | {ratios['previous']:.4f} |"
        )
    print()
    names = [scenario.name for scenario in scenarios]
    print("kvtier block hit ratio / max(shared, oracle-dynamic):")
    print(
        f"| {'variant' if args.variants else 'setting'} | "
        + " | ".join(names)
        + " | worst | mean | quota changes/h | s |"
    )
    print("|---|" + "---:|" * (len(names) + 4))
    rows: list[Row] = []
    ttfts: dict[str, list[float]] = {}

    def report(label: str, replayed: Replayed, setting: Setting | None = None) -> None:
        shares = [ratio / best[scenario.name] for ratio, scenario in zip(replayed.ratios, scenarios)]
        ttfts[label] = replayed.ttfts
        changes = sum(replayed.changes_per_hour) / len(replayed.changes_per_hour)
        row = Row(label, min(shares), sum(shares) / len(shares), changes)
        if setting is not None:
            row = replace(
                row,
                interval=parse_duration(setting.spec["interval"]),
                cooldown=parse_duration(setting.spec["cooldown"]),
            )
        rows.append(row)
        print(
            f"| {label} | "
            + " | ".join(f"{share:.3f}" for share in shares)
            + f" | {row.worst:.3f} | {row.mean:.3f} | {changes:.0f} | {replayed.seconds:.0f} |",
            flush=True,
        )

    def describe(winner: Row, tied: list[Row]) -> str:
        return (
            f"{winner.label} (worst {winner.worst:.3f}, mean {winner.mean:.3f}, {winner.changes_per_hour:.0f} quota "
            f"changes/h; {len(tied)} tied within {TIED:g} of the best worst case {max(r.worst for r in rows):.3f} "
            f"and mean {max(r.mean for r in rows):.3f})"
        )

    overrides = {}
    for item in args.base:
        key, value = item.split("=", 1)
        overrides[key] = _knob(key, value)
    if args.variants:
        if "halfLife" in overrides:
            raise SystemExit("--variants takes the estimator's half-life of each variant; --base it for a grid only")
        spec = {**defaults().spec, **overrides}
        swept = [(with_spec(scenario, spec), loaded[scenario.name]) for scenario in scenarios]
        for label, policy_of in VARIANTS.items():
            report(label, replay_all(swept, policy_of))
        variants = list(rows)
        for reference, policy_of in REFERENCES.items():
            report(reference, replay_all(swept, policy_of))
        winner = max(variants, key=lambda row: (row.worst, row.mean))
        print(f"\nbest: {winner.label} (worst {winner.worst:.3f}, mean {winner.mean:.3f})")
        print("\nkvtier TTFT p50 (s), and the equal split's:")
        print("| variant | " + " | ".join(names) + " |")
        print("|---|" + "---:|" * len(names))
        print("| equal split | " + " | ".join(f"{equal_ttft[name]:.3f}" for name in names) + " |")
        for label, values in ttfts.items():
            print(f"| {label} | " + " | ".join(f"{value:.3f}" for value in values) + " |")
        return
    if args.setting:
        settings = [Setting.from_label(label) for label in args.setting]
    else:
        settings = grid(args.grid, overrides, args.knob)
    _SWEPT[:] = [(scenario, loaded[scenario.name]) for scenario in scenarios]
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            for setting, replayed in zip(settings, pool.map(replay_setting, settings)):
                report(setting.label, replayed, setting)
    else:
        for setting in settings:
            report(setting.label, replay_setting(setting), setting)
    by_worst = max(rows, key=lambda row: (row.worst, row.mean))
    print(f"\nthe best worst case: {by_worst.label} (worst {by_worst.worst:.3f}, mean {by_worst.mean:.3f})")
    print(f"pick: {describe(*pick(rows))}; shipped: {defaults().label}")


if __name__ == "__main__":
    main()
