"""Capacity planning: what a pool of each size would earn, divided as the rebalancer divides it (pure).

Input: per tenant (deployment) a :class:`TenantProfile`: its requests' *effective* LRU stack
distances with prefix semantics (the same distances the probe and the replay's oracles compute),
their arrivals and prompt lengths, and its cost model. For every candidate capacity the planner
(:func:`plan` runs the steps)

1. :func:`split` builds each tenant's demand curve (hit tokens at a quota of 0, 1, 2, ... allocation
   units; a unit is about capacity / :data:`PLAN_UNITS` blocks, the operator's granularity) and values a hit
   token by the GPU seconds it saves over the tenant's mean prompt, as the rebalancer's
   ``MarginalGain`` does, and divides the capacity with the production allocator
   (:func:`~kvtier.rebalance.allocator.allocate`, within each tenant's min/max);
2. :func:`kvtier.sim.planning.evaluate` evaluates that static split exactly: a request hits its
   blocks of effective distance <= its tenant's quota (an LRU partition of fixed size hits exactly
   those), so block and token hit ratios are what a replay of the split measures; GPU prefill
   seconds saved and TTFT p50/p99 come from replaying the hits through the replay's
   :class:`~kvtier.sim.replay.PrefillQueue` (the cost model's prefill time, a hit's load before
   its compute with the GPUs serving others meanwhile, one queue per replica);
   the read bandwidth the hits need (mean over the run and the busiest minute) is compared with
   the pool's; :func:`priced` prices it from a :class:`~kvtier.rebalance.prices.PriceTable`.

A live cluster publishes only a few points of each deployment's curve (:class:`CurveProfile`, read
by :mod:`kvtier.rebalance.planlive`); :func:`evaluate_curves` then stands in for step 2, coarser.

:func:`pick` chooses the smallest capacity that meets the targets. The method's limits
(docs/capacity-planning.md): the curves describe the recorded window only, and the pool is taken to
be the tenants' only tier (HBM and CPU tiers in front of it are not modelled).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kvtier.rebalance.allocator import Demand, allocate
from kvtier.rebalance.costmodel import CostModel
from kvtier.rebalance.prices import PriceTable

#: A pool is divided in about this many allocation units (the operator's ``POOL_UNITS``).
PLAN_UNITS = 4096
#: Default candidate capacities, as multiples of the current one (steps of about sqrt 2).
DEFAULT_FACTORS = (0.25, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8, 4.0)
#: The window of the peak read bandwidth.
PEAK_WINDOW_SECONDS = 60.0
SECONDS_PER_YEAR = 365 * 24 * 3600.0


@dataclass(frozen=True)
class TenantProfile:
    """One tenant's recorded requests, reduced to what the plan needs."""

    name: str
    arrivals: Sequence[float]
    """Arrival of every request (seconds, ascending)."""
    prompt_tokens: Sequence[int]
    distances: Sequence[Sequence[float]]
    """Per request, the effective stack distance of each block (non-decreasing; inf: never seen)."""
    block_tokens: int
    cost: CostModel
    replicas: int = 1
    cpu_read_bytes_per_second: float = 50e9
    weight: float = 1.0
    min_blocks: int = 0
    max_blocks: int | None = None
    _token_curve: tuple[list[float], list[float]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not len(self.arrivals) == len(self.prompt_tokens) == len(self.distances):
            raise ValueError(f"tenant {self.name}: arrivals, prompt_tokens and distances differ in length")
        # Hit tokens by distance: every block is full but a prompt's last one.
        tokens: dict[float, float] = {}
        bt = self.block_tokens
        for prompt, request in zip(self.prompt_tokens, self.distances):
            for index, distance in enumerate(request):
                if distance == math.inf:
                    break
                weight = min(bt, prompt - index * bt)
                if weight > 0:
                    tokens[distance] = tokens.get(distance, 0.0) + weight
        keys = sorted(tokens)
        running, cumulative = 0.0, []
        for key in keys:
            running += tokens[key]
            cumulative.append(running)
        object.__setattr__(self, "_token_curve", (keys, cumulative))

    @property
    def mean_prompt_tokens(self) -> float:
        return sum(self.prompt_tokens) / len(self.prompt_tokens) if self.prompt_tokens else 0.0

    def hit_tokens(self, quota_blocks: float) -> float:
        """Hit tokens of the whole record at a fixed quota."""
        keys, cumulative = self._token_curve
        position = bisect.bisect_right(keys, quota_blocks)
        return cumulative[position - 1] if position else 0.0

    def demand(self, units: int, unit_blocks: int) -> Demand:
        """The allocator's view: hit tokens at 0..units units, each worth the GPU seconds it saves."""
        curve = [self.hit_tokens(k * unit_blocks) for k in range(units + 1)]
        max_units = None if self.max_blocks is None else self.max_blocks // unit_blocks
        min_units = -(-self.min_blocks // unit_blocks)
        if max_units is not None:
            max_units = max(max_units, min_units)
        return Demand(
            curve,
            hit_value=self.cost.saved_per_hit_token(self.mean_prompt_tokens),
            weight=self.weight,
            min_units=min_units,
            max_units=max_units,
        )


@dataclass(frozen=True)
class CurveProfile:
    """A live deployment as its ``status.kv`` publishes it: a few points of its demand curve (the share of
    lookups an LRU of a capacity per replica would hit) and its prompt rate; plans in pool blocks of
    ``block_bytes``."""

    name: str
    points: Sequence[tuple[float, float]]
    """(bytes per replica, hit ratio), ascending; the curve is 0 at 0, linear between points, flat beyond."""
    replicas: int
    prompt_tokens_per_second: float
    kv_bytes_per_token: int
    block_bytes: int
    saved_per_hit_token: float
    """GPU seconds one hit token saves."""
    weight: float = 1.0
    min_blocks: int = 0
    max_blocks: int | None = None

    def hit_ratio(self, quota_blocks: float) -> float:
        """Hit ratio at a total quota (blocks over all replicas)."""
        per_replica = quota_blocks * self.block_bytes / max(1, self.replicas)
        previous = (0.0, 0.0)
        for point in self.points:
            if per_replica <= point[0]:
                span = point[0] - previous[0]
                share = (per_replica - previous[0]) / span if span > 0 else 1.0
                return previous[1] + share * (point[1] - previous[1])
            previous = point
        return previous[1]

    def demand(self, units: int, unit_blocks: int) -> Demand:
        """Hit tokens per second at 0..units units, each worth the GPU seconds it saves."""
        curve = [self.prompt_tokens_per_second * self.hit_ratio(k * unit_blocks) for k in range(units + 1)]
        max_units = (
            None if self.max_blocks is None else max(self.max_blocks // unit_blocks, -(-self.min_blocks // unit_blocks))
        )
        return Demand(
            curve,
            hit_value=self.saved_per_hit_token,
            weight=self.weight,
            min_units=-(-self.min_blocks // unit_blocks),
            max_units=max_units,
        )


def evaluate_curves(
    profiles: Sequence[CurveProfile],
    quotas: Mapping[str, int],
    *,
    block_bytes: int,
    read_bandwidth: float | None = None,
    chunk_tokens: int = 256,
) -> CapacityOutcome:
    """An hour at the published rates under a split (quotas in blocks): token hits from the curves (the
    curves count lookups, read here as tokens), blocks as ``chunk_tokens`` tokens; no TTFT, and the
    read rate is the mean (the busiest minute is not published)."""
    per_tenant = {}
    for profile in profiles:
        quota = quotas[profile.name]
        prompt = profile.prompt_tokens_per_second * 3600
        hits = prompt * profile.hit_ratio(quota)
        per_tenant[profile.name] = TenantOutcome(
            quota,
            0,
            round(prompt / chunk_tokens),
            round(hits / chunk_tokens),
            round(prompt),
            round(hits),
            hits * profile.saved_per_hit_token,
            hits * profile.kv_bytes_per_token,
        )
    read_rate = sum(t.read_bytes for t in per_tenant.values()) / 3600
    return CapacityOutcome(
        capacity_blocks=sum(quotas.values()),
        capacity_bytes=sum(quotas.values()) * block_bytes,
        per_tenant=per_tenant,
        gpu_seconds_saved_per_hour=sum(t.gpu_prefill_seconds_saved for t in per_tenant.values()),
        ttft_p50_seconds=None,
        ttft_p99_seconds=None,
        read_bytes_per_second_mean=read_rate,
        read_bytes_per_second_peak=read_rate,
        read_bandwidth=read_bandwidth,
    )


@dataclass(frozen=True)
class TenantOutcome:
    quota_blocks: int
    requests: int
    accessed_blocks: int
    hit_blocks: int
    prompt_tokens: int
    hit_tokens: int
    gpu_prefill_seconds_saved: float
    read_bytes: float

    @property
    def block_hit_ratio(self) -> float:
        return self.hit_blocks / self.accessed_blocks if self.accessed_blocks else 0.0

    @property
    def token_hit_ratio(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(frozen=True)
class CapacityOutcome:
    """What one capacity earns under the allocator's static split."""

    capacity_blocks: int
    capacity_bytes: int
    per_tenant: dict[str, TenantOutcome]
    gpu_seconds_saved_per_hour: float
    ttft_p50_seconds: float | None
    """None when the source has no requests to queue (published curves)."""
    ttft_p99_seconds: float | None
    read_bytes_per_second_mean: float
    read_bytes_per_second_peak: float
    read_bandwidth: float | None
    """The pool's read bandwidth (bytes/s) the need is compared with; None: unknown."""
    price: float | None = None
    price_option: str | None = None

    @property
    def block_hit_ratio(self) -> float:
        accessed = sum(t.accessed_blocks for t in self.per_tenant.values())
        return sum(t.hit_blocks for t in self.per_tenant.values()) / accessed if accessed else 0.0

    @property
    def token_hit_ratio(self) -> float:
        prompt = sum(t.prompt_tokens for t in self.per_tenant.values())
        return sum(t.hit_tokens for t in self.per_tenant.values()) / prompt if prompt else 0.0

    @property
    def saturated(self) -> bool:
        """The busiest minute's reads exceed the pool's read bandwidth."""
        return self.read_bandwidth is not None and self.read_bytes_per_second_peak > self.read_bandwidth

    def price_per_saved_gpu_hour(self, amortization_years: float) -> float | None:
        if self.price is None:
            return None
        saved_hours = self.gpu_seconds_saved_per_hour / 3600 * amortization_years * SECONDS_PER_YEAR / 3600
        return self.price / saved_hours if saved_hours > 0 else math.inf

    def to_dict(self, amortization_years: float | None = None) -> dict[str, Any]:
        return {
            "capacity_blocks": self.capacity_blocks,
            "capacity_bytes": self.capacity_bytes,
            "block_hit_ratio": self.block_hit_ratio,
            "token_hit_ratio": self.token_hit_ratio,
            "gpu_prefill_seconds_saved_per_hour": self.gpu_seconds_saved_per_hour,
            "ttft_p50_seconds": self.ttft_p50_seconds,
            "ttft_p99_seconds": self.ttft_p99_seconds,
            "read_bytes_per_second_mean": self.read_bytes_per_second_mean,
            "read_bytes_per_second_peak_minute": self.read_bytes_per_second_peak,
            "read_bandwidth": self.read_bandwidth,
            "saturated": self.saturated,
            "price": self.price,
            "price_option": self.price_option,
            "price_per_saved_gpu_hour": (
                self.price_per_saved_gpu_hour(amortization_years) if amortization_years is not None else None
            ),
            "per_tenant": {
                name: {
                    "quota_blocks": t.quota_blocks,
                    "block_hit_ratio": t.block_hit_ratio,
                    "token_hit_ratio": t.token_hit_ratio,
                    "hit_blocks": t.hit_blocks,
                    "accessed_blocks": t.accessed_blocks,
                    "gpu_prefill_seconds_saved": t.gpu_prefill_seconds_saved,
                }
                for name, t in self.per_tenant.items()
            },
        }


@dataclass(frozen=True)
class Targets:
    hit_ratio: float | None = None
    """Overall block hit ratio at least this."""
    ttft_p50_seconds: float | None = None
    """Overall TTFT p50 at most this."""
    max_price_per_saved_gpu_hour: float | None = None

    @property
    def any(self) -> bool:
        return any(
            value is not None for value in (self.hit_ratio, self.ttft_p50_seconds, self.max_price_per_saved_gpu_hour)
        )


@dataclass(frozen=True)
class Pick:
    capacity: CapacityOutcome | None
    reason: str


def split(profiles: Sequence[TenantProfile] | Sequence[CurveProfile], capacity_blocks: int) -> dict[str, int]:
    """The allocator's split of ``capacity_blocks`` (in whole allocation units), per tenant, in blocks."""
    unit_blocks = max(1, -(-capacity_blocks // PLAN_UNITS))
    units = capacity_blocks // unit_blocks
    demands = {profile.name: profile.demand(units, unit_blocks) for profile in profiles}
    quotas = allocate(demands, units)
    return {name: quota * unit_blocks for name, quota in quotas.items()}


def priced(
    outcome: CapacityOutcome,
    capacity_blocks: int,
    block_bytes: int,
    read_bandwidth: float | None,
    prices: PriceTable | None,
) -> CapacityOutcome:
    """``outcome`` reported as the capacity bought (a split may leave less than a unit unassigned),
    priced by the option :meth:`PriceTable.choose` picks, checked against that option's arrays'
    read bandwidth when the pool's is not given."""
    capacity_bytes = capacity_blocks * block_bytes
    changes: dict[str, Any] = {
        "capacity_blocks": capacity_blocks,
        "capacity_bytes": capacity_bytes,
        "read_bandwidth": read_bandwidth,
    }
    if prices is not None:
        option, price = prices.choose(capacity_bytes, outcome.read_bytes_per_second_peak, read_bandwidth)
        changes.update(price=price, price_option=option.name)
        if read_bandwidth is None and option.array_read_bytes_per_second is not None:
            changes["read_bandwidth"] = option.arrays_read_bandwidth(capacity_bytes)
    return replace(outcome, **changes)


Profiles = Sequence[TenantProfile] | Sequence[CurveProfile]
#: Evaluates a split: ``evaluate(profiles, quotas, block_bytes=..., read_bandwidth=...)``
#: (:func:`kvtier.sim.planning.evaluate` for recorded requests, :func:`evaluate_curves` for published curves).
Evaluate = Callable[..., CapacityOutcome]


def plan(
    profiles: Profiles,
    capacities_blocks: Sequence[int],
    *,
    evaluate: Evaluate,
    block_bytes: int,
    read_bandwidth: float | None = None,
    prices: PriceTable | None = None,
) -> list[CapacityOutcome]:
    """Every capacity (ascending), divided by :func:`split`, evaluated, priced when ``prices``."""
    if not profiles:
        raise ValueError("nothing to plan: no tenants")
    outcomes = []
    for capacity in sorted(set(capacities_blocks)):
        if capacity < sum(profile.min_blocks for profile in profiles):
            raise ValueError(f"capacity {capacity} blocks is below the tenants' minimums")
        quotas = split(profiles, capacity)
        outcome = evaluate(profiles, quotas, block_bytes=block_bytes, read_bandwidth=read_bandwidth)
        outcomes.append(priced(outcome, capacity, block_bytes, read_bandwidth, prices))
    return outcomes


def refine(
    profiles: Profiles,
    outcomes: Sequence[CapacityOutcome],
    targets: Targets,
    *,
    evaluate: Evaluate,
    block_bytes: int,
    read_bandwidth: float | None = None,
    prices: PriceTable | None = None,
    steps: int = 4,
) -> list[CapacityOutcome]:
    """``outcomes`` plus up to ``steps`` bisections between the pick and the largest capacity below it
    that misses, so the pick lands within 1/2^steps of that gap (hit ratio and savings grow with
    capacity: the allocator never predicts less for more)."""
    amortization = prices.amortization_years if prices is not None else 3.0
    outcomes = sorted(outcomes, key=lambda o: o.capacity_blocks)
    for _ in range(steps):
        chosen = pick(outcomes, targets, amortization).capacity
        below = [o for o in outcomes if o.capacity_blocks < chosen.capacity_blocks] if chosen else []
        if chosen is None or not below:
            break
        middle = (below[-1].capacity_blocks + chosen.capacity_blocks) // 2
        if middle <= below[-1].capacity_blocks:
            break
        outcomes = sorted(
            [
                *outcomes,
                *plan(
                    profiles,
                    [middle],
                    evaluate=evaluate,
                    block_bytes=block_bytes,
                    read_bandwidth=read_bandwidth,
                    prices=prices,
                ),
            ],
            key=lambda o: o.capacity_blocks,
        )
    return outcomes


def default_capacities(current_blocks: int, factors: Sequence[float] = DEFAULT_FACTORS) -> list[int]:
    return sorted({max(1, round(current_blocks * factor)) for factor in factors})


def pick(outcomes: Sequence[CapacityOutcome], targets: Targets, amortization_years: float = 3.0) -> Pick:
    """The smallest capacity meeting every target given, with the reason (or why none does)."""
    if not targets.any:
        return Pick(None, "no target given (--target-hit-ratio, --target-ttft-p50, --max-price-per-saved-gpu-hour)")
    if targets.max_price_per_saved_gpu_hour is not None and any(o.price is None for o in outcomes):
        return Pick(None, "--max-price-per-saved-gpu-hour needs a price table (--prices)")
    for outcome in sorted(outcomes, key=lambda o: o.capacity_blocks):
        reasons = _meets(outcome, targets, amortization_years)
        if reasons is not None:
            note = "; reads would saturate the pool's read bandwidth" if outcome.saturated else ""
            return Pick(outcome, "smallest capacity with " + ", ".join(reasons) + note)
    if targets.ttft_p50_seconds is not None and all(o.ttft_p50_seconds is None for o in outcomes):
        return Pick(
            None, "--target-ttft-p50 needs requests to queue (--scenario or --trace); published curves carry no TTFT"
        )
    ordered = sorted(outcomes, key=lambda o: o.capacity_blocks)
    best_ratio = max(o.block_hit_ratio for o in ordered)
    best = next(o for o in ordered if o.block_hit_ratio >= best_ratio - 1e-9)
    ttfts = [o.ttft_p50_seconds for o in outcomes if o.ttft_p50_seconds is not None]
    ttft = f", TTFT p50 {min(ttfts):.3g} s at best" if ttfts else ""
    advice = (
        "try larger --capacities"
        if best is ordered[-1]
        else "more capacity does not help: the hit ratio stops growing there (the curves' reach, or the "
        "deployments' max)"
    )
    return Pick(
        None,
        "no capacity tried meets " + _describe(targets) + f" (best block hit ratio "
        f"{best.block_hit_ratio:.3f}, from {best.capacity_blocks:,} blocks{ttft}); {advice}",
    )


def _meets(outcome: CapacityOutcome, targets: Targets, amortization_years: float) -> list[str] | None:
    reasons = []
    if targets.hit_ratio is not None:
        if outcome.block_hit_ratio < targets.hit_ratio:
            return None
        reasons.append(f"block hit ratio {outcome.block_hit_ratio:.3f} >= {targets.hit_ratio}")
    if targets.ttft_p50_seconds is not None:
        if outcome.ttft_p50_seconds is None or outcome.ttft_p50_seconds > targets.ttft_p50_seconds:
            return None
        reasons.append(f"TTFT p50 {outcome.ttft_p50_seconds:.3g} s <= {targets.ttft_p50_seconds} s")
    if targets.max_price_per_saved_gpu_hour is not None:
        per_hour = outcome.price_per_saved_gpu_hour(amortization_years)
        if per_hour is None or per_hour > targets.max_price_per_saved_gpu_hour:
            return None
        reasons.append(
            f"price per saved GPU-hour {per_hour:.3g} <= {targets.max_price_per_saved_gpu_hour} "
            f"(over {amortization_years:g} years)"
        )
    return reasons


def _describe(targets: Targets) -> str:
    parts = []
    if targets.hit_ratio is not None:
        parts.append(f"block hit ratio >= {targets.hit_ratio}")
    if targets.ttft_p50_seconds is not None:
        parts.append(f"TTFT p50 <= {targets.ttft_p50_seconds} s")
    if targets.max_price_per_saved_gpu_hour is not None:
        parts.append(f"price per saved GPU-hour <= {targets.max_price_per_saved_gpu_hour}")
    return " and ".join(parts)
