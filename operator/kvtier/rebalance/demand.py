"""Demand curves of live deployments: telemetry's replica snapshots into the estimator, per pool units.

The telemetry loop hands every replica's :class:`~kvtier.telemetry.engines.Snapshot` to
:meth:`DemandBook.observe` each scrape. A pool's rebalance round asks :meth:`DemandBook.estimate`
for a deployment's curve in the pool's allocation unit; only then are the buffered snapshots fed,
in order, into one :class:`~kvtier.rebalance.estimator.DemandEstimator` per replica (recreated when
the round's window or unit changes), and the replicas' curves are added up
(:func:`~kvtier.rebalance.estimator.deployment_curve`).

A replica's probe page gives the best curve (:func:`probe_reading_of`); without one, the engine's
LMCache counters and its quota (:func:`counter_reading_of`) give a fitted one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvtier.rebalance.estimator import (
    CounterReading,
    DemandEstimator,
    Estimate,
    ProbeReading,
    deployment_curve,
    stale_estimate,
)
from kvtier.telemetry.engines import Snapshot

#: Snapshots kept per replica between two rounds (a round every interval reads them all), at most
#: this many and this old.
PENDING_LIMIT = 1024
PENDING_SECONDS = 3600.0
#: Storage hit counter readings kept per replica (for measured hit rates).
HITS_LIMIT = 256

DeploymentKey = tuple[str, str]

#: The estimators' half-life, in rebalance intervals: the last interval weighs 15/16 of the curve
#: (its end most), so a phase change shows at the next round.
HALF_LIFE_INTERVALS = 0.25


def probe_reading_of(snapshot: Snapshot, time: float) -> ProbeReading | None:
    """The probe's part of a scraped page, or None when the replica serves no (complete) probe page."""
    buckets = snapshot.demand_chunks
    if buckets is None or snapshot.probe_lookups is None or snapshot.probe_decay_ticks is None:
        return None
    finite = [(bound, count) for bound, count in buckets.pairs if bound != float("inf")]
    tick, window = snapshot.probe_tick_seconds, snapshot.probe_window_seconds
    decay = 0.5 ** (tick / window) if tick and window else 1.0
    return ProbeReading(
        time=time,
        bounds=tuple(bound for bound, _ in finite),
        cumulative=tuple(count for _, count in finite),
        total=buckets.pairs[-1][1],
        lookups=snapshot.probe_lookups,
        decay_ticks=snapshot.probe_decay_ticks,
        decay_per_tick=decay,
    )


def counter_reading_of(snapshot: Snapshot, time: float, unit_bytes: int) -> CounterReading | None:
    """The LMCache counters and quota of a scraped replica, or None when any is missing."""
    requested, hits, quota = snapshot.lmcache_requested, snapshot.lmcache_hit_l2, snapshot.storage_quota_bytes
    if requested is None or hits is None or quota is None:
        return None
    return CounterReading(time, int(quota // unit_bytes), requested, hits, snapshot.lmcache_lookups or 0.0)


@dataclass(frozen=True)
class Geometry:
    """How a deployment's cache maps onto its pool's allocation unit (all per replica)."""

    unit_bytes: int
    """The pool's allocation unit."""
    chunk_bytes: int
    """Bytes one LMCache chunk takes in the storage tier."""
    chunk_tokens: int
    front_chunks: float
    """Chunks the faster tiers in front of storage hold (the CPU tier: a hit there is no storage hit)."""


@dataclass
class _Replica:
    pending: deque[tuple[float, Snapshot]] = field(default_factory=lambda: deque(maxlen=PENDING_LIMIT))
    estimator: DemandEstimator | None = None
    settings: tuple[float, int] | None = None
    hits: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=HITS_LIMIT))


class DemandBook:
    """Per-replica estimators of every deployment, fed by telemetry, read by the rebalance rounds."""

    def __init__(self, stale_seconds: float) -> None:
        self.stale_seconds = stale_seconds
        self._replicas: dict[DeploymentKey, dict[str, _Replica]] = {}

    def observe(self, key: DeploymentKey, pod: str, time: float, snapshot: Snapshot) -> None:
        replica = self._replicas.setdefault(key, {}).setdefault(pod, _Replica())
        replica.pending.append((time, snapshot))
        while replica.pending[0][0] < time - PENDING_SECONDS:  # no round asked for a long while
            replica.pending.popleft()
        if snapshot.lmcache_hit_l2 is not None:
            replica.hits.append((time, snapshot.lmcache_hit_l2))

    def storage_hit_rate(self, keys: Sequence[DeploymentKey], now: float, window: float) -> float | None:
        """Storage-tier hit tokens per second of these deployments over the last `window` seconds, as
        measured by the engines' counters (None when no replica has two readings in it)."""
        rates = []
        for key in keys:
            for replica in self._replicas.get(key, {}).values():
                recent = [(time, hits) for time, hits in replica.hits if time >= now - window]
                if len(recent) >= 2 and recent[-1][0] > recent[0][0] and recent[-1][1] >= recent[0][1]:
                    rates.append((recent[-1][1] - recent[0][1]) / (recent[-1][0] - recent[0][0]))
        return sum(rates) if rates else None

    def forget(self, key: DeploymentKey, pods: Sequence[str] | None = None) -> None:
        """Drop a deleted deployment, or its replicas that are not in `pods`."""
        if pods is None:
            self._replicas.pop(key, None)
            return
        replicas = self._replicas.get(key, {})
        for pod in set(replicas) - set(pods):
            del replicas[pod]

    def estimate(
        self, key: DeploymentKey, now: float, *, replicas: int, units: int, geometry: Geometry, half_life_seconds: float
    ) -> Estimate:
        """The deployment's curve over its total quota of 0..`units` units (stale when no replica is fresh)."""
        curves, confidences, rates, sources = [], [], [], set()
        prompts = []
        for replica in self._replicas.get(key, {}).values():
            estimate = self._replica_estimate(replica, now, units, geometry, half_life_seconds)
            if estimate.stale:
                continue
            curves.append(estimate.curve)
            confidences.append(estimate.confidence)
            rates.append(estimate.access_tokens_per_second)
            prompts.append(estimate.mean_prompt_tokens)
            sources.add(estimate.source)
        if not curves or replicas < 1:
            return stale_estimate(units)
        scale = replicas / len(curves)
        return Estimate(
            curve=tuple(deployment_curve(curves, replicas, units)),
            confidence=min(confidences),
            stale=False,
            source="probe" if sources == {"probe"} else "counters",
            access_tokens_per_second=scale * sum(rates),
            mean_prompt_tokens=_mean_prompt(rates, prompts),
        )

    def _replica_estimate(
        self, replica: _Replica, now: float, units: int, geometry: Geometry, half_life: float
    ) -> Estimate:
        settings = (half_life, geometry.unit_bytes)
        if replica.estimator is None or replica.settings != settings:
            replica.estimator = DemandEstimator(half_life, self.stale_seconds)
            replica.settings = settings
        estimator = replica.estimator
        while replica.pending:
            time, snapshot = replica.pending.popleft()
            probe = probe_reading_of(snapshot, time)
            if probe is not None:
                estimator.observe_probe(probe)
            counters = counter_reading_of(snapshot, time, geometry.unit_bytes)
            if counters is not None:
                estimator.observe_counters(counters)
        return estimator.estimate(
            now,
            units,
            unit_chunks=geometry.unit_bytes / geometry.chunk_bytes,
            chunk_tokens=geometry.chunk_tokens,
            front_chunks=geometry.front_chunks,
        )


def _mean_prompt(rates: Sequence[float], prompts: Sequence[float]) -> float:
    """Tokens per lookup over replicas: their tokens per second over their lookups per second."""
    lookups = sum(rate / prompt for rate, prompt in zip(rates, prompts) if prompt > 0)
    return sum(rate for rate, prompt in zip(rates, prompts) if prompt > 0) / lookups if lookups > 0 else 0.0
