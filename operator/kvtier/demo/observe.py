"""What the demo shows, read from the Kubernetes API only: the pool, the deployments, their Events.

:func:`snapshot` turns raw objects into a :class:`Snapshot` (pure: the view and the report are
tested on fixed objects). Every field the operator may or may not have written yet is optional,
so the demo runs against any operator build and shows more as the operator reports more:
``status.kv`` (watermark, hit ratio per tier, TTFT, storage quota and use) on each
InferenceDeployment, ``status.allocations`` (the ledger) and ``status.lastRebalance`` on the KVPool,
and Events such as ``Rebalanced``. :func:`observe` reads them through a :class:`~kvtier.kube.KubeClient`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kvtier.api.units import parse_duration, parse_quantity
from kvtier.kube import EVENTS, INFERENCEDEPLOYMENTS, KVPOOLS, KubeClient
from kvtier.telemetry.report import as_number

TIERS = ("hbm", "cpu", "storage", "total")
#: Kinds whose Events the demo shows.
KINDS = ("KVPool", "InferenceDeployment")
#: Event reasons of a quota move (the rebalancer's), matched by prefix.
REBALANCE_REASON = "Rebalanc"


def _quantity(value: Any) -> int | None:
    try:
        return parse_quantity(value) if value is not None else None
    except ValueError:
        return None


def _seconds(value: Any) -> float | None:
    try:
        return parse_duration(value) if value is not None else None
    except ValueError:
        return None


def epoch_seconds(timestamp: str) -> float | None:
    """`2026-12-04T15:45:41Z` as seconds since the epoch (None if it is not a timestamp)."""
    try:
        return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class DeploymentView:
    namespace: str
    name: str
    desired: int | None = None
    replicas: int | None = None
    ready: int | None = None
    ready_reason: str | None = None
    """Reason of the Ready condition (AllReplicasReady, ReplicasNotReady, ...)."""
    watermark: float | None = None
    hit_ratio: Mapping[str, float | None] = field(default_factory=dict)
    ttft_p50: float | None = None
    quota: int | None = None
    """Storage quota per replica: the pool's ledger entry, else `status.kv.storage.quota`."""
    applied_quota: int | None = None
    """`status.kv.storage.quota`: the quota the operator last applied to the replicas."""
    used: int | None = None
    min: int | None = None
    max: int | None = None
    metrics_reason: str | None = None
    """Reason of the MetricsAvailable condition, when there is one."""
    prompt_rate: float | None = None
    """Prompt tokens per second the replicas received over the telemetry window (`status.kv.promptTokensPerSecond`)."""

    @property
    def storage_hit_rate(self) -> float | None:
        """Prompt tokens per second served from the storage tier: its hit ratio x the prompt rate (one window)."""
        storage = self.hit_ratio.get("storage")
        return None if storage is None or self.prompt_rate is None else storage * self.prompt_rate

    @property
    def is_ready(self) -> bool:
        return self.desired is not None and self.ready is not None and self.ready >= self.desired

    def hit(self, tier: str) -> float | None:
        return self.hit_ratio.get(tier)


@dataclass(frozen=True)
class Move:
    namespace: str
    name: str
    from_quota: int | None
    to_quota: int | None


@dataclass(frozen=True)
class Rebalance:
    """`status.lastRebalance` of the pool."""

    time: str
    moved_bytes: int | None
    predicted_gain: float | None
    reason: str
    dry_run: bool
    moves: tuple[Move, ...]


@dataclass(frozen=True)
class PoolView:
    name: str
    capacity: int | None = None
    allocated: int | None = None
    available: int | None = None
    policy: str | None = None
    interval: float | None = None
    storage: str | None = None
    """Which kind of storage: nvmeof, csi or hostPath."""
    ready_reason: str | None = None
    last_rebalance: Rebalance | None = None
    allocations: Mapping[tuple[str, str], int] = field(default_factory=dict)
    """(namespace, name) -> quota per replica, from `status.allocations`."""


@dataclass(frozen=True)
class EventView:
    time: str
    kind: str
    name: str
    type: str
    reason: str
    message: str
    count: int = 1

    @property
    def is_rebalance(self) -> bool:
        return self.reason.startswith(REBALANCE_REASON)


@dataclass(frozen=True)
class Snapshot:
    pool: PoolView | None
    deployments: tuple[DeploymentView, ...]
    events: tuple[EventView, ...]
    """Events about kvtier objects, oldest first."""

    @property
    def all_ready(self) -> bool:
        return bool(self.deployments) and all(d.is_ready for d in self.deployments)


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    for condition in status.get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == kind:
            return condition
    return {}


def pool_view(body: Mapping[str, Any]) -> PoolView:
    spec, status = _map(body.get("spec")), _map(body.get("status"))
    rebalance = _map(spec.get("rebalance"))
    storage = next((kind for kind in ("nvmeof", "csi", "hostPath") if kind in _map(spec.get("storage"))), None)
    allocations = {}
    for entry in status.get("allocations") or []:
        entry = _map(entry)
        quota = _quantity(entry.get("quota"))
        if quota is not None:
            allocations[(str(entry.get("namespace")), str(entry.get("name")))] = quota
    last = None
    record = _map(status.get("lastRebalance"))
    if record:
        moves = tuple(
            Move(
                str(_map(m).get("namespace")),
                str(_map(m).get("name")),
                _quantity(_map(m).get("fromQuota")),
                _quantity(_map(m).get("toQuota")),
            )
            for m in record.get("moves") or []
        )
        last = Rebalance(
            str(record.get("time") or ""),
            _quantity(record.get("movedBytes")),
            as_number(record.get("predictedGain")),
            str(record.get("reason") or ""),
            bool(record.get("dryRun")),
            moves,
        )
    return PoolView(
        name=str(_map(body.get("metadata")).get("name")),
        capacity=_quantity(status.get("capacity", spec.get("capacity"))),
        allocated=_quantity(status.get("allocated")),
        available=_quantity(status.get("available")),
        policy=rebalance.get("policy", "MarginalGain") if spec else None,
        interval=_seconds(rebalance.get("interval", "1m")) if spec else None,
        storage=storage,
        ready_reason=_condition(status, "Ready").get("reason"),
        last_rebalance=last,
        allocations=allocations,
    )


def deployment_view(body: Mapping[str, Any], pool: PoolView | None = None) -> DeploymentView:
    metadata, spec, status = _map(body.get("metadata")), _map(body.get("spec")), _map(body.get("status"))
    namespace, name = str(metadata.get("namespace") or "default"), str(metadata.get("name"))
    kv = _map(status.get("kv"))
    storage_status = _map(kv.get("storage"))
    storage_spec = _map(_map(spec.get("kvCache")).get("storage"))
    applied = _quantity(storage_status.get("quota"))
    ledger = pool.allocations.get((namespace, name)) if pool is not None else None
    hit = _map(kv.get("hitRatio"))
    return DeploymentView(
        namespace=namespace,
        name=name,
        desired=spec.get("replicas") if isinstance(spec.get("replicas"), int) else None,
        replicas=status.get("replicas") if isinstance(status.get("replicas"), int) else None,
        ready=status.get("readyReplicas") if isinstance(status.get("readyReplicas"), int) else None,
        ready_reason=_condition(status, "Ready").get("reason"),
        watermark=as_number(kv.get("hbmWatermark")),
        hit_ratio={tier: as_number(hit.get(tier)) for tier in TIERS},
        ttft_p50=as_number(kv.get("ttftP50Seconds")),
        quota=ledger if ledger is not None else applied,
        applied_quota=applied,
        used=_quantity(storage_status.get("used")),
        min=_quantity(storage_spec.get("min", 0 if storage_spec else None)),
        max=_quantity(storage_spec.get("max", storage_spec.get("request"))),
        metrics_reason=_condition(status, "MetricsAvailable").get("reason"),
        prompt_rate=as_number(kv.get("promptTokensPerSecond")),
    )


def _event_key(event: Mapping[str, Any]) -> tuple[str, int]:
    metadata = _map(event.get("metadata"))
    when = event.get("lastTimestamp") or event.get("eventTime") or metadata.get("creationTimestamp") or ""
    version = str(metadata.get("resourceVersion") or "")
    return str(when), int(version) if version.isdigit() else 0


def event_views(events: Iterable[Mapping[str, Any]], names: Iterable[str] | None = None) -> tuple[EventView, ...]:
    """Events about KVPools and InferenceDeployments (only those named, if given), oldest first."""
    wanted = set(names) if names is not None else None
    chosen = []
    for event in events:
        involved = _map(event.get("involvedObject"))
        if involved.get("kind") not in KINDS or (wanted is not None and involved.get("name") not in wanted):
            continue
        chosen.append(event)
    chosen.sort(key=_event_key)
    return tuple(
        EventView(
            time=_event_key(event)[0],
            kind=str(_map(event.get("involvedObject")).get("kind")),
            name=str(_map(event.get("involvedObject")).get("name")),
            type=str(event.get("type") or "Normal"),
            reason=str(event.get("reason") or ""),
            message=str(event.get("message") or ""),
            count=event.get("count") if isinstance(event.get("count"), int) else 1,
        )
        for event in chosen
    )


def snapshot(
    pool: Mapping[str, Any] | None, deployments: Iterable[Mapping[str, Any]], events: Iterable[Mapping[str, Any]] = ()
) -> Snapshot:
    pool_state = pool_view(pool) if pool else None
    views = tuple(sorted((deployment_view(body, pool_state) for body in deployments), key=lambda d: d.name))
    names = {d.name for d in views} | ({pool_state.name} if pool_state else set())
    return Snapshot(pool_state, views, event_views(events, names))


async def observe(kube: KubeClient, namespace: str, pool: str) -> Snapshot:
    """Read the pool, the namespace's deployments and the Events about them (a pool's are in `default`)."""
    pool_body, deployments, events, pool_events = await asyncio.gather(
        kube.get_or_none(KVPOOLS, None, pool),
        kube.list(INFERENCEDEPLOYMENTS, namespace),
        kube.list(EVENTS, namespace),
        kube.list(EVENTS, "default"),
    )
    return snapshot(pool_body, deployments.get("items", []), [*events.get("items", []), *pool_events.get("items", [])])
