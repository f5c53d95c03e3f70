"""Demand curves for the allocator: each deployment's storage hits as a function of its quota.

A curve is in hit tokens per second at a storage quota of 0, 1, 2, ... allocation units (the
pool's unit: blocks, GiB, ...). Two sources, best first:

1. **The probe** (``kvtier_probe_stack_distance_chunks``, :mod:`kvtier.probe.demand`): an LRU of
   C chunks hits exactly the lookups of stack distance <= C, for every C at once, whatever the
   current quota. Each pod's storage tier sits behind its faster tiers (vLLM's HBM prefix cache,
   LMCache's L1), and every tier sees the whole access stream (inclusive LRUs,
   :mod:`kvtier.sim.engine`): a chunk hits *some* tier when its distance is within the largest
   of them, so a storage quota of c chunks adds the lookups of distance in ``(F, max(F, c)]``,
   with F the largest faster tier. Between bucket bounds the curve is linear; beyond the last
   tracked bound it is flat.
2. **The engines' counters** (no probe): every scrape interval gives one point, the storage
   hit ratio (L2 hit tokens / tokens asked of LMCache) at the quota held during it. The points
   are pooled per quota and fitted with the least concave majorant through (0, 0) (a hit-ratio
   curve is non-decreasing and, at the resolution of a few quotas, concave), flat beyond the
   largest quota seen: counters know nothing about quotas never held.

Windowing. The probe's own weights decay slowly (a half-life of ``--window``, 30 minutes by
default: it serves dashboards too). Between two scrapes the probe applied a known number of
decay ticks (``kvtier_probe_decay_ticks_total``), so ``H(t1) - decay ** ticks * H(t0)`` is
exactly the weight of the lookups in between; the estimator re-weights these increments with
its own, shorter half-life, so a phase change shows within an interval or two whatever the
probe's setting. Counter points are weighted the same way. Rates divide by the equally
weighted observed time, so a deployment seen only briefly still gets an unbiased rate.

Confidence (0..1): the share of the window actually observed (scrapes since the estimator
started, minus gaps) times ``n / (n + confidence_lookups)`` for the n (weighted) lookups in the
window: thin data has low confidence, and the loop lets such a deployment grow little. A
deployment with no fresh reading within ``stale_seconds`` is *stale*: the loop freezes it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from kvtier.probe.demand import HitCurve

Source = Literal["probe", "counters", "none"]


@dataclass(frozen=True)
class ProbeReading:
    """One scrape of a replica's probe: exactly what its ``/metrics`` page carries."""

    time: float
    bounds: tuple[float, ...]
    """The finite ``le`` of ``kvtier_probe_stack_distance_chunks``, ascending (chunks)."""
    cumulative: tuple[float, ...]
    """Bucket weight at each bound (lookups of distance <= bound)."""
    total: float
    """The ``+Inf`` bucket: every chunk looked up (decayed)."""
    lookups: float
    """``kvtier_probe_lookups_total``."""
    decay_ticks: float
    """``kvtier_probe_decay_ticks_total``."""
    decay_per_tick: float
    """``0.5 ** (kvtier_probe_tick_seconds / kvtier_probe_window_seconds)``; 1 without decay."""


@dataclass(frozen=True)
class CounterReading:
    """One scrape of a deployment's engine counters (summed over its replicas) and its quota."""

    time: float
    quota_units: int
    """Storage quota held (allocation units, per replica as the curve is)."""
    requested_tokens: float
    """Tokens asked of LMCache (``lmcache_mp_lookup_requested_total``)."""
    storage_hit_tokens: float
    """Tokens found in L2 (``lmcache_mp_lookup_hit_l2_total``)."""
    lookups: float
    """``lmcache_mp_lookups_total``."""


@dataclass(frozen=True)
class Estimate:
    """A deployment's demand curve and how much to trust it."""

    curve: tuple[float, ...]
    """Storage hit tokens per second at a quota of 0 .. len - 1 units (flat beyond)."""
    confidence: float
    stale: bool
    source: Source
    access_tokens_per_second: float
    """Tokens looked up per second (the demand ``Proportional`` divides by)."""
    mean_prompt_tokens: float = 0.0
    """Tokens per lookup (a request's prompt, in whole chunks; 0 when unknown): how deep its hits reach,
    which sets what a hit token is worth (:meth:`~kvtier.rebalance.costmodel.ModelShape.hit_token_flops`)."""


def stale_estimate(units: int) -> Estimate:
    return Estimate((0.0,) * (units + 1), 0.0, True, "none", 0.0)


def confidence(coverage: float, lookups: float, confidence_lookups: float) -> float:
    """``coverage x n / (n + confidence_lookups)``, in [0, 1]."""
    if lookups <= 0:
        return 0.0
    return max(0.0, min(1.0, coverage)) * lookups / (lookups + confidence_lookups)


def probe_increment(previous: ProbeReading, current: ProbeReading) -> tuple[list[float], float, float] | None:
    """Bucket weights, total and lookups added between two readings of the same probe.

    None when they do not continue each other (a restarted or reconfigured probe): its
    histogram was rebuilt, so the difference means nothing.
    """
    ticks = current.decay_ticks - previous.decay_ticks
    lookups = current.lookups - previous.lookups
    if current.bounds != previous.bounds or ticks < 0 or lookups < 0 or current.time < previous.time:
        return None
    factor = current.decay_per_tick**ticks
    added = [max(0.0, now - factor * before) for now, before in zip(current.cumulative, previous.cumulative)]
    return added, max(0.0, current.total - factor * previous.total), lookups


class HitsByCapacity(Protocol):
    """A hit curve over cache capacities (chunks): the probe's :class:`HitCurve`, or an exact
    :class:`~kvtier.probe.stackdist.DistanceHistogram`."""

    def hits_at_each(self, capacities: Iterable[float]) -> list[float]:
        """Hits at every capacity, ascending."""
        ...


def storage_curve(hits: HitsByCapacity, units: int, unit_chunks: float, front_chunks: float = 0.0) -> list[float]:
    """Hits the storage tier adds at 0..units units: ``hits(max(F, c)) - hits(F)``, c in chunks.

    ``hits`` is the whole stream's hit curve (any tier), ``unit_chunks`` chunks make one unit,
    ``front_chunks`` (F) is the largest faster tier in front of the storage tier.
    """
    if units < 0 or unit_chunks <= 0 or front_chunks < 0:
        raise ValueError("units >= 0, unit_chunks > 0 and front_chunks >= 0 are required")
    capacities = [units_ * unit_chunks for units_ in range(units + 1)]
    behind = bisect.bisect_right(capacities, front_chunks)  # quotas within the faster tier: max(F, c) = F
    base, *at = hits.hits_at_each([front_chunks] * (behind + 1) + capacities[behind:])
    return [added if (added := value - base) > 0.0 else 0.0 for value in at]


def concave_fit(points: Sequence[tuple[float, float, float]]) -> list[tuple[float, float]]:
    """The least concave majorant through (0, 0) of ``(x, y, weight)`` points, non-decreasing.

    Points at the same x are pooled (weighted mean of y); x <= 0 and zero weights are ignored.
    Returns the hull's vertices ``(x, y)`` from (0, 0); slopes never rise and never go negative
    (a fall is flattened: more room never hits less).
    """
    pooled: dict[float, list[float]] = {}
    for x, y, weight in points:
        if x > 0 and weight > 0:
            entry = pooled.setdefault(x, [0.0, 0.0])
            entry[0] += y * weight
            entry[1] += weight
    hull: list[tuple[float, float]] = [(0.0, 0.0)]
    for x in sorted(pooled):
        total, weight = pooled[x]
        y = max(total / weight, hull[-1][1])
        while len(hull) >= 2:
            (x0, y0), (x1, y1) = hull[-2], hull[-1]
            if (y1 - y0) * (x - x0) <= (y - y0) * (x1 - x0):  # x1 on or below the chord: not a vertex
                hull.pop()
            else:
                break
        hull.append((x, y))
    return hull


def interpolate(vertices: Sequence[tuple[float, float]], x: float) -> float:
    """Piecewise-linear value at ``x`` of sorted vertices, flat beyond the last one."""
    for (x0, y0), (x1, y1) in zip(vertices, vertices[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return vertices[-1][1]


class _Decaying:
    """Sums with exponentially decaying weights, aged by time (one per source)."""

    __slots__ = ("half_life", "time", "values", "observed")

    def __init__(self, half_life: float) -> None:
        self.half_life = half_life
        self.time: float | None = None
        self.values: list[float] = []
        #: Decayed seconds of observation (the rates' denominator).
        self.observed = 0.0

    def age_to(self, time: float) -> float:
        """The factor by which everything decayed since the last update (and move to ``time``)."""
        factor = 1.0 if self.time is None else 0.5 ** (max(0.0, time - self.time) / self.half_life)
        self.time = time if self.time is None else max(self.time, time)
        return factor

    def add(self, time: float, seconds: float, values: Sequence[float]) -> None:
        factor = self.age_to(time)
        if len(self.values) != len(values):
            self.values = [0.0] * len(values)
        self.values = [factor * old + new for old, new in zip(self.values, values)]
        self.observed = factor * self.observed + seconds

    def decayed(self, now: float) -> tuple[list[float], float]:
        factor = 1.0 if self.time is None else 0.5 ** (max(0.0, now - self.time) / self.half_life)
        return [factor * value for value in self.values], factor * self.observed


class DemandEstimator:
    """One deployment's estimator: feed it scrapes (:meth:`observe_probe`, :meth:`observe_counters`),
    ask it for a curve (:meth:`estimate`).

    ``half_life_seconds`` is the window (the loop's interval or less); a source without a
    reading within ``stale_seconds`` of ``now`` is not used. With several replicas, keep one
    estimator per replica probe and add the curves (:func:`deployment_curve`).
    """

    def __init__(self, half_life_seconds: float, stale_seconds: float, confidence_lookups: float = 32.0) -> None:
        if half_life_seconds <= 0 or stale_seconds <= 0 or confidence_lookups < 0:
            raise ValueError("half_life_seconds > 0, stale_seconds > 0 and confidence_lookups >= 0 are required")
        self.half_life = half_life_seconds
        self.stale_seconds = stale_seconds
        self.confidence_lookups = confidence_lookups
        self._probe: ProbeReading | None = None
        self._probe_window = _Decaying(half_life_seconds)  # [total, lookups, *bucket weights]
        self._counters: CounterReading | None = None
        self._counter_window = _Decaying(half_life_seconds)  # [requested, lookups]
        #: Decayed (quota, hit ratio, requested tokens) points; dropped once they weigh < 1%.
        self._points: list[tuple[float, int, float, float]] = []

    def observe_probe(self, reading: ProbeReading) -> None:
        previous, self._probe = self._probe, reading
        if previous is None:
            return
        increment = probe_increment(previous, reading)
        if increment is None:  # a restarted probe: start over from this reading
            self._probe_window = _Decaying(self.half_life)
            return
        buckets, total, lookups = increment
        self._probe_window.add(reading.time, reading.time - previous.time, [total, lookups, *buckets])

    def observe_counters(self, reading: CounterReading) -> None:
        previous, self._counters = self._counters, reading
        if previous is None:
            return
        requested = reading.requested_tokens - previous.requested_tokens
        hits = reading.storage_hit_tokens - previous.storage_hit_tokens
        lookups = reading.lookups - previous.lookups
        if requested < 0 or hits < 0 or lookups < 0 or reading.time <= previous.time:  # restarted engines
            return
        self._counter_window.add(reading.time, reading.time - previous.time, [requested, lookups])
        # An interval whose quota changed mixes two curves (and a grown partition is still filling).
        if requested > 0 and reading.quota_units == previous.quota_units:
            self._points.append((reading.time, reading.quota_units, hits / requested, requested))
            horizon = reading.time - self.half_life * math.log2(100)
            self._points = [point for point in self._points if point[0] >= horizon]

    def estimate(
        self, now: float, units: int, *, unit_chunks: float, chunk_tokens: float, front_chunks: float = 0.0
    ) -> Estimate:
        """The curve at 0..``units`` units: from the probe if fresh, else from the counters, else stale.

        ``unit_chunks`` chunks make one unit, a chunk is ``chunk_tokens`` tokens, ``front_chunks``
        is the largest faster tier of a replica (HBM prefix cache or L1).
        """
        if self._fresh(self._probe, now) and self._probe_window.observed > 0:
            return self._from_probe(now, units, unit_chunks, chunk_tokens, front_chunks)
        if self._fresh(self._counters, now) and self._counter_window.observed > 0:
            return self._from_counters(now, units)
        return stale_estimate(units)

    def _fresh(self, reading: ProbeReading | CounterReading | None, now: float) -> bool:
        return reading is not None and now - reading.time <= self.stale_seconds

    def _coverage(self, observed: float) -> float:
        """Share of the window's weight that was observed (1 after long uninterrupted scraping)."""
        return observed * math.log(2) / self.half_life

    def _from_probe(
        self, now: float, units: int, unit_chunks: float, chunk_tokens: float, front_chunks: float
    ) -> Estimate:
        assert self._probe is not None
        (total, lookups, *buckets), observed = self._probe_window.decayed(now)
        per_second = chunk_tokens / observed
        hits = HitCurve(self._probe.bounds, tuple(buckets), total)
        curve = tuple([value * per_second for value in storage_curve(hits, units, unit_chunks, front_chunks)])
        return Estimate(
            curve,
            confidence(self._coverage(observed), lookups, self.confidence_lookups),
            False,
            "probe",
            total * per_second,
            total * chunk_tokens / lookups if lookups > 0 else 0.0,
        )

    def _from_counters(self, now: float, units: int) -> Estimate:
        (requested, lookups), observed = self._counter_window.decayed(now)
        rate = requested / observed
        points = [
            (quota, ratio, weight * 0.5 ** ((now - time) / self.half_life))
            for time, quota, ratio, weight in self._points
        ]
        fit = concave_fit(points)
        curve = tuple(rate * interpolate(fit, quota) for quota in range(units + 1))
        return Estimate(
            curve,
            confidence(self._coverage(observed), lookups, self.confidence_lookups),
            False,
            "counters",
            rate,
            requested / lookups if lookups > 0 else 0.0,
        )


def deployment_curve(replica_curves: Sequence[Sequence[float]], replicas: int, units: int) -> list[float]:
    """A deployment's curve over its *total* units when every replica holds ``total // replicas``.

    ``replica_curves`` are the replicas' own curves over a per-replica quota (missing ones, e.g.
    of replicas not scraped yet, count as the mean of the others).
    """
    if replicas < 1 or not replica_curves:
        raise ValueError("a deployment needs >= 1 replica and >= 1 curve")
    scale = replicas / len(replica_curves)
    quotas = units // replicas + 1  # per-replica quotas 0..units // replicas, each `replicas` totals long

    def padded(curve: Sequence[float]) -> list[float]:
        return [*curve[:quotas], *[curve[-1]] * (quotas - len(curve))]

    # The same sums in the same order as one per total (a round computes this for every member of
    # every pool; per total, it was most of a 1,000-deployment operator's rebalance time).
    by_quota = [scale * sum(values) for values in zip(*map(padded, replica_curves))]
    return [by_quota[total // replicas] for total in range(units + 1)]
