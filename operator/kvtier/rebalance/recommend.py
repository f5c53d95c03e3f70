"""A pool's capacity recommendation (``KVPool.status.recommendation``): the live plan in short (pure).

The computation is ``kvtier plan --live``'s: the pool's deployments' published curves
(:func:`kvtier.rebalance.planlive.live_pools`) divided at each capacity by :func:`kvtier.rebalance.planner.plan`
and evaluated by :func:`~kvtier.rebalance.planner.evaluate_curves`. On top of it:

- the **recommended capacity**: capacities are tried on a grid of the current one, 0.25x to 8x in steps of
  sqrt 2 (whole GiB from 1 GiB up); the recommendation is the smallest capacity C from which doubling (C to 2C,
  and every further doubling on the grid) raises the pool's predicted block hit ratio by less than
  ``minGainPerDoubling``. When doubling 4x still gains that much, the recommendation is 8x ("at least");
- **materiality** (:func:`material`): a new recommendation is written only when the recommended capacity,
  a saturation flag, the deployments planned, the undersized state or its streak changed, or a point's hit
  ratio moved by at least :data:`HIT_RATIO_STEP` or its GPU seconds saved by at least :data:`SAVED_STEP` of
  the larger value;
- the **undersized state** (:func:`advance`): the pool is found undersized by a refresh when the
  recommendation exceeds the capacity x (1 + ``undersizedMargin``); the state flips (and an Event says so)
  only when ``undersizedRefreshes`` refreshes in a row disagree with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from kvtier.api.kvpool import CapacityPoint, PoolRecommendation
from kvtier.api.units import format_quantity
from kvtier.rebalance.planlive import LIVE_BLOCK_BYTES, LivePool
from kvtier.rebalance.planner import PLAN_UNITS, CapacityOutcome, Profiles, evaluate_curves, plan

#: Capacities tried, as multiples of the current one: 0.25x to 8x in steps of sqrt 2.
GRID = tuple(2 ** (step / 2) for step in range(-4, 7))
#: The capacities shown in the status, as multiples of the current one.
SHOWN = (0.5, 1.0, 2.0)
#: A point's hit ratio must move at least this much (absolute) to be a material change.
HIT_RATIO_STEP = 0.01
#: A point's GPU seconds saved per hour must move at least this share of the larger value to be material.
SAVED_STEP = 0.05
GIB_BLOCKS = 2**30 // LIVE_BLOCK_BYTES


def grid_blocks(current_blocks: int, factor: float) -> int:
    """``factor`` x the current capacity in blocks, in whole GiB from 1 GiB up (so the status reads well)."""
    blocks = current_blocks * factor
    if blocks >= GIB_BLOCKS:
        return max(GIB_BLOCKS, round(blocks / GIB_BLOCKS) * GIB_BLOCKS)
    return max(1, round(blocks))


def divisible(profiles: Profiles, capacity_blocks: int) -> bool:
    """Whether :func:`kvtier.rebalance.planner.split` can divide ``capacity_blocks``: every tenant's minimum,
    rounded up to whole allocation units as the split rounds it, fits (a capacity just at the minimums' sum
    may not)."""
    unit_blocks = max(1, -(-capacity_blocks // PLAN_UNITS))
    needed = sum(-(-profile.min_blocks // unit_blocks) for profile in profiles)
    return needed <= capacity_blocks // unit_blocks


def recommend(pool: LivePool, min_gain_per_doubling: float, now: datetime) -> PoolRecommendation:
    """The recommendation for ``pool`` (its undersized state left at the defaults: see :func:`advance`)."""
    if not pool.profiles:
        return PoolRecommendation(
            observed_at=now,
            capacity=pool.capacity_bytes,
            without_curve=len(pool.without_curve),
            reason="no deployment on the pool publishes a demand curve (status.kv.demand) yet",
        )
    current = pool.capacity_blocks
    factors = {factor: grid_blocks(current, factor) for factor in (*GRID, *SHOWN)}
    factors = {factor: blocks for factor, blocks in factors.items() if divisible(pool.profiles, blocks)}
    outcomes = {
        o.capacity_blocks: o
        for o in plan(
            pool.profiles,
            list(factors.values()),
            evaluate=evaluate_curves,
            block_bytes=LIVE_BLOCK_BYTES,
            read_bandwidth=pool.read_bandwidth,
        )
    }
    tried = [(factor, outcomes[factors[factor]]) for factor in GRID if factor in factors]
    chosen, reason = _smallest_sufficient(tried, min_gain_per_doubling)
    points = [
        CapacityPoint(
            factor=factor,
            capacity=outcomes[factors[factor]].capacity_bytes,
            hit_ratio=round(outcomes[factors[factor]].block_hit_ratio, 4),
            gpu_seconds_saved_per_hour=round(outcomes[factors[factor]].gpu_seconds_saved_per_hour, 3),
            read_bytes_per_second=round(outcomes[factors[factor]].read_bytes_per_second_mean / 2**20) * 2**20,
            saturated=_saturated(outcomes[factors[factor]]),
        )
        for factor in SHOWN
        if factor in factors
    ]
    return PoolRecommendation(
        observed_at=now,
        capacity=pool.capacity_bytes,
        without_curve=len(pool.without_curve),
        recommended_capacity=chosen.capacity_bytes,
        reason=reason,
        saturated=_saturated(chosen),
        points=points,
        deployments=len(pool.profiles),
    )


def _saturated(outcome: CapacityOutcome) -> bool | None:
    return None if outcome.read_bandwidth is None else outcome.saturated


def _smallest_sufficient(
    tried: Sequence[tuple[float, CapacityOutcome]], min_gain: float
) -> tuple[CapacityOutcome, str]:
    """The smallest grid capacity from which every doubling gains less than ``min_gain``, and why."""
    ratio = {factor: outcome.block_hit_ratio for factor, outcome in tried}
    by_factor = dict(tried)
    doublings = [
        (factor, double, ratio[double] - ratio[factor])
        for factor in ratio
        if (double := next((f for f in ratio if abs(f - 2 * factor) < 1e-9), None)) is not None
    ]
    if not doublings:  # every smaller capacity is below the deployments' minimums
        largest = tried[-1][1]
        return largest, "the deployments' minimums leave no smaller capacity to compare"
    chosen: tuple[float, float] | None = None
    for factor, _, gain in reversed(doublings):
        if gain >= min_gain:
            break
        chosen = (factor, gain)
    if chosen is None:
        last, double, gain = doublings[-1]
        outcome = by_factor[double]
        return outcome, (
            f"doubling {format_quantity(by_factor[last].capacity_bytes)} still adds {gain:.3f} to the hit ratio "
            f"(>= {min_gain:g}): at least {format_quantity(outcome.capacity_bytes)}"
        )
    outcome = by_factor[chosen[0]]
    return outcome, (
        f"hit ratio {outcome.block_hit_ratio:.3f} at {format_quantity(outcome.capacity_bytes)}; doubling it adds "
        f"{chosen[1]:.3f} (< {min_gain:g})"
    )


def material(old: PoolRecommendation | None, new: PoolRecommendation) -> bool:
    """Whether ``new`` differs from ``old`` enough to be written (see the module's docstring)."""
    if old is None:
        return True
    same = ("capacity", "recommended_capacity", "saturated", "deployments", "without_curve", "undersized", "streak")
    if any(getattr(old, key) != getattr(new, key) for key in same):
        return True
    if [p.factor for p in old.points] != [p.factor for p in new.points]:
        return True
    for before, after in zip(old.points, new.points):
        if before.saturated != after.saturated or abs(before.hit_ratio - after.hit_ratio) >= HIT_RATIO_STEP:
            return True
        larger = max(before.gpu_seconds_saved_per_hour, after.gpu_seconds_saved_per_hour)
        if larger > 0 and abs(before.gpu_seconds_saved_per_hour - after.gpu_seconds_saved_per_hour) >= (
            SAVED_STEP * larger
        ):
            return True
    return False


def undersized(recommendation: PoolRecommendation, margin: float) -> bool:
    """Whether this refresh finds the pool undersized: the recommendation above capacity x (1 + margin)."""
    recommended = recommendation.recommended_capacity
    return recommended is not None and recommended > recommendation.capacity * (1 + margin)


@dataclass(frozen=True)
class Sizing:
    """The pool's undersized state as the status keeps it, and whether this refresh flipped it."""

    undersized: bool
    streak: int
    flipped: bool = False


def advance(previous: Sizing, finding: bool, refreshes: int) -> Sizing:
    """The state after a refresh whose finding is ``finding`` (undersized or not): it flips once ``refreshes``
    findings in a row disagree with it; an agreeing finding resets the streak."""
    if finding == previous.undersized:
        return Sizing(previous.undersized, 0)
    streak = previous.streak + 1
    if streak >= refreshes:
        return Sizing(finding, 0, flipped=True)
    return Sizing(previous.undersized, streak)
