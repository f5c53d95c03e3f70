"""One rebalancing round, as a pure function: estimates and settings in, a :class:`Decision` out.

:func:`decide` divides the pool among the deployments whose metrics are fresh (a stale or
missing estimate *freezes* a deployment: it keeps its quota, and the others share what is
left), then applies the safety rules of ``spec.rebalance``, in this order:

- ``Static``: every deployment goes to its request (nothing is estimated); outcome ``static``
  (or ``dry-run``, or ``cooldown``, as below).
- nothing to divide (every deployment frozen): ``frozen``.
- the proposal: ``MarginalGain`` runs the allocator on the curves (a deployment may grow by at
  most its confidence x the round's step, so thin data moves little; a grown quota is valued by
  what it earns while it fills, :func:`warmed_curve`, so moves that only pay back after the
  next rounds are not made); ``Proportional`` shares by weight x access rate. The proposal is
  then cut to ``maxStep`` of the pool (:func:`~kvtier.rebalance.allocator.limit_step`).
- ``below-min-gain``: the full proposal's predicted relative gain is under ``minGain`` (not when
  the deployments hold more than there is to divide: then the loop makes room, whatever it costs)
  (``Proportional``, which predicts no value, compares the moved share of the pool instead).
- ``cooldown``: the pool moved less than ``cooldown`` ago.
- ``dry-run``: reported, not applied.
- otherwise ``moved``.

Quotas are integer allocation units of the pool (the caller picks the unit: bytes / unit_bytes).
:func:`actuation_order` lists the changes shrinks first, so applying them one by one never holds
more than the larger of the old and new totals.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Literal

from kvtier.api.kvpool import RebalancePolicy, RebalanceSpec
from kvtier.rebalance.allocator import Demand, allocate, limit_step, moved_units, predict
from kvtier.rebalance.estimator import Estimate

#: How far ahead a move is valued (in intervals): the refill of a grown quota is paid within it.
WARMUP_HORIZON_INTERVALS = 2.0

Outcome = Literal["moved", "below-min-gain", "cooldown", "frozen", "dry-run", "static"]


_SPEC_DEFAULTS = RebalanceSpec()


@dataclass(frozen=True)
class LoopSettings:
    """``spec.rebalance`` as the loop reads it (durations in seconds); the defaults are the KVPool's."""

    policy: RebalancePolicy = _SPEC_DEFAULTS.policy
    min_gain: float = _SPEC_DEFAULTS.min_gain
    max_step: float = _SPEC_DEFAULTS.max_step
    cooldown_seconds: float = _SPEC_DEFAULTS.cooldown
    dry_run: bool = _SPEC_DEFAULTS.dry_run
    interval_seconds: float = _SPEC_DEFAULTS.interval
    warmup_horizon_intervals: float = WARMUP_HORIZON_INTERVALS
    """How far ahead a move is valued, in intervals; not a spec field (the sweep's variants vary it)."""

    @classmethod
    def from_spec(cls, spec: RebalanceSpec) -> LoopSettings:
        return cls(spec.policy, spec.min_gain, spec.max_step, spec.cooldown, spec.dry_run, spec.interval)


@dataclass(frozen=True)
class DeploymentState:
    """What the loop knows of one deployment."""

    current: int
    """Units held now (what the ledger says)."""
    estimate: Estimate | None
    """None or stale: frozen at ``current``."""
    hit_value: float = 1.0
    """Value of one hit token (1: hit tokens; or prefill seconds saved per token)."""
    weight: float = 1.0
    min_units: int = 0
    max_units: int | None = None
    request_units: int | None = None
    """Where ``Static`` keeps it (None: at ``current``)."""
    unit_tokens: float | None = None
    """Tokens one unit holds, to model how long a grown quota takes to fill (None: instantly)."""

    @property
    def frozen(self) -> bool:
        return self.estimate is None or self.estimate.stale


@dataclass(frozen=True)
class QuotaChange:
    name: str
    from_units: int
    to_units: int


@dataclass(frozen=True)
class Decision:
    """The round's outcome: ``target`` is what to apply (the current split unless it moved)."""

    outcome: Outcome
    target: dict[str, int]
    proposed: dict[str, int]
    """What the policy wanted this round (after ``maxStep``), applied or not."""
    changes: tuple[QuotaChange, ...]
    """``current`` -> ``proposed``, shrinks first."""
    predicted_gain: float
    """Predicted relative improvement of the proposal (0.05 = 5%); inf from nothing."""
    value_before: float
    value_after: float
    """Predicted value (hit value per second, over the warm-up horizon) of the movable
    deployments before and after the proposal."""
    frozen: tuple[str, ...] = ()
    reason: str = ""
    moved_units: int = 0

    @property
    def applies(self) -> bool:
        """Whether the caller should actuate ``target`` (it differs from the current split)."""
        return self.outcome in ("moved", "static") and bool(self.changes)


def actuation_order(current: Mapping[str, int], target: Mapping[str, int]) -> tuple[QuotaChange, ...]:
    """The quota changes from ``current`` to ``target``: every shrink (largest first), then every grow."""
    changes = [
        QuotaChange(name, current.get(name, 0), target[name])
        for name in sorted(target)
        if target[name] != current.get(name, 0)
    ]
    return tuple(
        sorted(
            changes,
            key=lambda change: (
                change.to_units > change.from_units,
                -abs(change.to_units - change.from_units),
                change.name,
            ),
        )
    )


def proportional_split(
    shares: Mapping[str, float], capacity: int, bounds: Mapping[str, tuple[int, int | None]]
) -> dict[str, int]:
    """``capacity`` in integer parts proportional to ``shares`` within ``[min, max]`` bounds (water-filling).

    A deployment held at a bound keeps it and the rest is shared again; without any share the
    capacity is shared evenly. Raises ``ValueError`` when the minimums do not fit.
    """
    if sum(low for low, _ in bounds.values()) > capacity:
        raise ValueError("the minimums exceed the capacity")
    fixed: dict[str, int] = {}
    while True:
        open_ = [name for name in sorted(shares) if name not in fixed]
        left = capacity - sum(fixed.values())
        weights = {name: max(0.0, shares[name]) for name in open_}
        whole = sum(weights.values())
        if whole <= 0:
            weights = {name: 1.0 for name in open_}
            whole = float(len(open_))
        ideal = {name: left * weights[name] / whole for name in open_}
        clamped = {}
        for name in open_:
            low, high = bounds[name]
            if ideal[name] < low:
                clamped[name] = low
            elif high is not None and ideal[name] > high:
                clamped[name] = high
        if not clamped:
            split = {name: math.floor(ideal[name]) for name in open_}
            rest = left - sum(split.values())
            for name in sorted(open_, key=lambda name: (split[name] - ideal[name], name))[:rest]:
                split[name] += 1
            return {**fixed, **split}
        # Fix the most violated side first (below-min deployments cost capacity others expected).
        below = {name: units for name, units in clamped.items() if units > ideal[name]}
        fixed.update(below or clamped)


def decide(
    deployments: Mapping[str, DeploymentState],
    capacity: int,
    settings: LoopSettings,
    now: float,
    last_move: float | None = None,
) -> Decision:
    """One round for a pool of ``capacity`` units; ``last_move`` is the time of its last applied move."""
    current = {name: state.current for name, state in deployments.items()}
    since_move = math.inf if last_move is None else now - last_move
    cooling = since_move < settings.cooldown_seconds
    if settings.policy == "Static":
        proposed = {
            name: state.current if state.request_units is None else state.request_units
            for name, state in deployments.items()
        }
        changes = actuation_order(current, proposed)
        moved = moved_units(current, proposed)
        if changes and settings.dry_run:
            return Decision(
                "dry-run",
                current,
                proposed,
                changes,
                0.0,
                0.0,
                0.0,
                moved_units=moved,
                reason="dry run: policy Static would bring every deployment back to its request",
            )
        if changes and cooling:
            return Decision(
                "cooldown",
                current,
                proposed,
                changes,
                0.0,
                0.0,
                0.0,
                moved_units=moved,
                reason=f"policy Static, but the pool moved {since_move:g}s ago",
            )
        return Decision(
            "static",
            proposed,
            proposed,
            changes,
            0.0,
            0.0,
            0.0,
            reason="policy Static: every deployment at its request",
            moved_units=moved,
        )
    frozen = tuple(sorted(name for name, state in deployments.items() if state.frozen))
    active = {name: state for name, state in deployments.items() if not state.frozen}
    if not active:
        return Decision(
            "frozen",
            current,
            current,
            (),
            0.0,
            0.0,
            0.0,
            frozen,
            reason="every deployment's metrics are stale or missing",
        )
    free = capacity - sum(deployments[name].current for name in frozen)
    if sum(state.min_units for state in active.values()) > free:
        return Decision(
            "frozen",
            current,
            current,
            (),
            0.0,
            0.0,
            0.0,
            frozen,
            reason=f"the minimums need more than the {free} units the frozen deployments leave",
        )
    step = math.floor(settings.max_step * capacity)
    now_active = {name: state.current for name, state in active.items()}
    demands = _demands(active, step, settings.interval_seconds * settings.warmup_horizon_intervals)
    if settings.policy == "Proportional":
        shares = {
            name: state.weight * state.estimate.access_tokens_per_second  # type: ignore[union-attr]  # active ones have one
            for name, state in active.items()
        }
        full = proportional_split(shares, free, {name: (d.min_units, d.max_units) for name, d in demands.items()})
    else:
        full = allocate(demands, free, now_active)
    # Held above what there is to divide (the capacity shrank, or waiting deployments need room):
    # the whole correction at once, whatever it costs.
    deficit = sum(now_active.values()) > free
    proposal = full if deficit else limit_step(now_active, full, step)
    before, after, best = predict(demands, now_active), predict(demands, proposal), predict(demands, full)
    proposed = {**current, **proposal}
    changes = actuation_order(current, proposed)
    moved = moved_units(current, proposed)
    if settings.policy == "Proportional":
        gain = moved / capacity if capacity else 0.0
        judged = f"moves {gain:.1%} of the pool"
    else:
        gain = (best - before) / before if before > 0 else (math.inf if best > before else 0.0)
        judged = f"predicted gain {gain:+.1%}"
    suffix = f" (frozen: {', '.join(frozen)})" if frozen else ""

    def decision(outcome: Outcome, reason: str) -> Decision:
        target = proposed if outcome == "moved" else current
        return Decision(outcome, target, proposed, changes, gain, before, after, frozen, reason + suffix, moved)

    if deficit:
        judged = f"making room: the deployments hold more than the {free} units to divide"
    if not changes or (gain < settings.min_gain and not deficit):
        return decision("below-min-gain", f"{judged}, below minGain {settings.min_gain:g}")
    if cooling:
        wait = settings.cooldown_seconds - since_move
        return decision("cooldown", f"{judged}, but the pool moved {since_move:g}s ago (cooldown {wait:g}s left)")
    summary = f"{len(changes)} quota changes, {moved} units, {judged}"
    if settings.dry_run:
        return decision("dry-run", f"dry run: would make {summary}")
    return decision("moved", summary)


def _demands(active: Mapping[str, DeploymentState], step: int, horizon: float) -> dict[str, Demand]:
    """The allocator's view: each curve valued over ``horizon`` seconds with its warm-up, within
    its bounds, growth capped at confidence x step."""
    demands = {}
    for name, state in active.items():
        estimate = state.estimate
        assert estimate is not None
        high = state.current + math.floor(estimate.confidence * step)
        if state.max_units is not None:
            high = min(high, state.max_units)
        curve: Sequence[float] = estimate.curve
        if state.unit_tokens:
            held = curve[min(state.current, len(curve) - 1)]
            fill = max(0.0, estimate.access_tokens_per_second - held) / state.unit_tokens
            curve = warmed_curve(curve, state.current, fill, horizon)
        demands[name] = Demand(curve, state.hit_value, state.weight, state.min_units, max(state.min_units, high))
    return demands


def warmed_curve(curve: Sequence[float], current: int, fill_units_per_second: float, horizon: float) -> list[float]:
    """The mean value over the next ``horizon`` seconds of every quota, starting from ``current``.

    A shrink takes effect at once (its tail is evicted); a grown quota starts empty and fills
    with the deployment's misses, ``fill_units_per_second``: while it fills it is worth what the
    part filled so far is worth. So a move pays only what it earns before the next rounds.
    """
    if horizon <= 0:
        raise ValueError("horizon must be > 0")
    curve = list(curve)
    if current >= len(curve) - 1:
        return curve
    warmed = curve[: current + 1]
    rate = fill_units_per_second
    steps = range(1, len(curve) - current)  # a grown quota of current + step units
    if rate > 0:
        # The integral of the value over the fill so far (unit-seconds of value), and the time it took.
        fillings = list(accumulate([value / rate for value in curve[current:-1]], initial=0.0))[1:]
        seconds = [step / rate for step in steps]
    else:
        fillings = seconds = [math.inf] * len(steps)
    reachable = bisect.bisect_right(seconds, horizon)  # filled within the horizon
    warmed.extend(
        [
            (filling + curve[current + step] * (horizon - took)) / horizon
            for step, filling, took in zip(steps[:reachable], fillings, seconds)
        ]
    )
    # Not filled within the horizon: no more than the last reachable point.
    warmed.extend([warmed[-1]] * (len(steps) - reachable))
    return warmed
