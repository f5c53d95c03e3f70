"""References for ``bench/`` and the tests, not scenario policies: what a causal rebalancer could
do with perfect knowledge of the past, and what kvtier's loop does on exact curves instead of its
estimates (the past's, or the next interval's: foresight). They tell a miss of the estimator from
one of the loop, and a margin of the hindsight split that only foresight reaches.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from kvtier.rebalance.estimator import Estimate, storage_curve
from kvtier.rebalance.loop import LoopSettings
from kvtier.sim.cache import IsolatedLRU
from kvtier.sim.hindsight import Hindsight
from kvtier.sim.policies import KvtierPolicy, OracleDynamicPolicy
from kvtier.sim.replay import Replay
from kvtier.sim.scenario import Scenario


class PreviousEpochOracle(OracleDynamicPolicy):
    """The best a causal rebalancer could do with perfect knowledge of the past: every epoch, the
    split that was best for the *previous* epoch's exact curves, on real partitions (a grown one
    fills with misses)."""

    name = "previous-epoch-oracle"

    def __init__(self, scenario: Scenario, hindsight: Hindsight) -> None:
        super().__init__(scenario, hindsight)
        self.splits = self.splits[:1] + self.splits[:-1]

    def pool(self, scenario: Scenario) -> IsolatedLRU:
        return IsolatedLRU(self.initial_quotas(scenario))


def extrapolated(curves: Sequence[Sequence[float]], at: float) -> list[float]:
    """The least-squares line through each point of ``curves`` (one per interval ``0, 1, ...``),
    read at interval ``at``: a curve growing linearly is predicted exactly. Clipped at 0 and made
    non-decreasing, as a hit curve is."""
    count = len(curves)
    if count < 2:
        raise ValueError("a trend needs at least two curves")
    mean = (count - 1) / 2
    spread = sum((index - mean) ** 2 for index in range(count))
    # The prediction is linear in the points: weight_i = 1/n + (at - mean) (i - mean) / spread.
    weights = [1 / count + (at - mean) * (index - mean) / spread for index in range(count)]
    predicted = [max(0.0, sum(weight * value for weight, value in zip(weights, points))) for points in zip(*curves)]
    return list(itertools.accumulate(predicted, max))


class ExactCurvesPolicy(KvtierPolicy):
    """kvtier's loop fed exact curves instead of the estimator's.

    Each tenant's hits at every quota over the intervals ``[now + first, now + last)`` (in
    intervals), from the hindsight stack distances of its whole stream, read behind its faster
    tiers as :func:`~kvtier.rebalance.estimator.storage_curve` reads the probe. ``(-k, 0)``: the
    last k intervals known perfectly, their mean, or with ``trend`` their least-squares line read
    at the next interval (:func:`extrapolated`): what a causal estimator of the recent past could
    know, without noise. ``(0, 1)``: the next interval (foresight, which no pod has). Until the
    window holds an interval, the shipped estimator.
    """

    def __init__(self, scenario: Scenario, first: int, last: int, *, trend: bool = False) -> None:
        if first >= last or (trend and last - first < 2):
            raise ValueError(f"a window of intervals [{first}, {last}) needs first < last (two for a trend)")
        super().__init__(scenario)
        self.first, self.last, self.trend = first, last, trend
        self.curves: dict[tuple[str, int, int, float, float], list[float]] = {}

    def attach(self, replay: Replay, scenario: Scenario) -> None:
        self.hindsight = Hindsight(replay.tenants, self.settings.interval_seconds)
        super().attach(replay, scenario)

    def _interval_curve(
        self, tenant: str, index: int, units: int, unit_chunks: float, front_chunks: float
    ) -> list[float]:
        key = (tenant, index, units, unit_chunks, front_chunks)
        curve = self.curves.get(key)
        if curve is None:
            histogram = self.hindsight.epoch(tenant, index)
            curve = self.curves[key] = storage_curve(histogram, units, unit_chunks, front_chunks)
        return curve

    def estimate(self, tenant: str, now: float, units: int, *, unit_chunks: float, front_chunks: float) -> Estimate:
        interval = self.settings.interval_seconds
        at = round(now / interval)
        window = range(max(0, at + self.first), min(self.hindsight.count, at + self.last))
        if not window:
            return super().estimate(tenant, now, units, unit_chunks=unit_chunks, front_chunks=front_chunks)
        curves = [self._interval_curve(tenant, index, units, unit_chunks, front_chunks) for index in window]
        per_second = self.scenario.block_tokens / interval
        if self.trend and len(curves) >= 2:
            hits = extrapolated(curves, at - window.start)
        else:
            hits = [sum(points) / len(curves) for points in zip(*curves)]
        accessed = sum(self.hindsight.epoch(tenant, index).total for index in window) / len(curves)
        return Estimate(tuple(value * per_second for value in hits), 1.0, False, "probe", accessed * per_second)


def intervals(scenario: Scenario, seconds: float) -> int:
    """The whole rebalance intervals of the scenario's ``kvtier`` settings nearest ``seconds`` (at least one)."""
    return max(1, round(seconds / LoopSettings.from_spec(scenario.rebalance).interval_seconds))


#: The loop on exact curves of the recent past (:class:`ExactCurvesPolicy`), by label: the best a
#: causal rebalancer could know of each tenant's curve, without noise. Where all of them fall short
#: of the hindsight split, its margin is foresight (``tests/unit/test_sim_scenarios.py``). Windows
#: are in seconds, so they keep their meaning whatever the interval.
CAUSAL_REFERENCES: dict[str, Callable[[Scenario], ExactCurvesPolicy]] = {
    **{
        f"the loop on the last {seconds} s of exact curves": (
            lambda scenario, seconds=seconds: ExactCurvesPolicy(scenario, -intervals(scenario, seconds), 0)
        )
        for seconds in (60, 120, 300, 600)
    },
    **{
        f"the loop on the last {seconds} s of exact curves, extrapolated by least squares": (
            lambda scenario, seconds=seconds: ExactCurvesPolicy(
                scenario, -max(2, intervals(scenario, seconds)), 0, trend=True
            )
        )
        for seconds in (600, 1200, 1800)
    },
}

#: The loop on the exact curves of the next minute: foresight, which no pod has. Where it reaches
#: the hindsight split and :data:`CAUSAL_REFERENCES` do not, the split's margin is foresight.
FORESIGHT_SECONDS = 60


def foresight_reference(scenario: Scenario) -> ExactCurvesPolicy:
    return ExactCurvesPolicy(scenario, 0, intervals(scenario, FORESIGHT_SECONDS))
