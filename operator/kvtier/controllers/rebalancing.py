"""A KVPool's rebalance round against the cluster: read, decide, write the ledger, actuate, explain.

The pool controller runs :func:`rebalance_pool` every `spec.rebalance.interval` (a daemon per pool);
the pure parts are :mod:`kvtier.rebalance` (estimator, loop, allocator) and the quota calls
:mod:`kvtier.rebalance.actuator`.

1. Read the pool and its ledger (`status.allocations`), and each admitted deployment's spec.
2. Ask the :class:`~kvtier.rebalance.demand.DemandBook` for each deployment's curve in the pool's
   allocation unit (:func:`pool_unit`); a deployment without fresh metrics is frozen.
3. :func:`~kvtier.rebalance.loop.decide` with `spec.rebalance`; capacity that waiting deployments
   need at their minimum is kept out of the division, so admission can still take them.
4. A move is written to the ledger first (compare-and-swap on the pool's status: a ledger that
   changed meanwhile, by an admission or a scale, makes the round give up until the next one), with
   `status.lastRebalance`. Only then are the engines' quotas set, shrinks before grows, through the
   LMCache MP quota API; a failure is reported and left to the InferenceDeployment controller,
   which brings every replica to the ledger's quota each resync (also after an operator crash
   between the two steps). Modes without a live quota API re-render with the new size and roll.
5. An Event on the pool per round that moved (or would have, in a dry run), one on each deployment
   whose quota changed, and the `kvtier_rebalance_*` metrics.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
import kopf
from pydantic import ValidationError

from kvtier.api.inferencedeployment import InferenceDeployment
from kvtier.api.kvpool import KVPool, KVPoolStatus, QuotaMove, RebalanceRecord, RebalanceSpec
from kvtier.api.units import format_quantity
from kvtier.controllers.events import post_event
from kvtier.controllers.kvpools import POOL, PoolGone, update_pool_status
from kvtier.controllers.runtime import InvalidSpec, OperatorConfig, parse
from kvtier.kube import KVPOOLS, PODS, APIError, KubeClient
from kvtier.rebalance.actuator import apply_quotas
from kvtier.rebalance.demand import HALF_LIFE_INTERVALS, DemandBook, Geometry
from kvtier.rebalance.loop import Decision, DeploymentState, LoopSettings, decide
from kvtier.render import StorageBinding, selector
from kvtier.render.lmcache import chunk_storage_bytes
from kvtier.render.volumes import kv_volume
from kvtier.storage.ledger import QUOTA_ALIGN, allocated, summarise
from kvtier.telemetry.metrics import OperatorMetrics

log = logging.getLogger(__name__)

#: A pool is divided in at most about this many units (the allocator's work grows with it).
POOL_UNITS = 4096
#: Longest wait between two looks at `spec.rebalance.interval` (seconds).
INTERVAL_SLICE = 10.0


def pool_unit(capacity: int) -> int:
    """The pool's allocation unit: a multiple of the quota alignment, about capacity / POOL_UNITS."""
    return max(QUOTA_ALIGN, math.ceil(capacity / POOL_UNITS / QUOTA_ALIGN) * QUOTA_ALIGN)


@dataclass
class PoolMemory:
    """What the operator remembers of a pool between rounds (lost on restart: the cooldown then
    restarts from `status.lastRebalance`)."""

    last_move: float | None = None
    #: Storage hit tokens per second of the pool's deployments before the last move, and its time.
    hit_rate_before: float | None = None
    moved_at: float | None = None
    #: Deployments with a `kvtier_rebalance_quota_bytes` series for this pool.
    exported: set[tuple[str, str]] = field(default_factory=set)


@dataclass(frozen=True)
class _Member:
    """One admitted deployment as the round sees it."""

    uid: str
    body: dict[str, Any]
    deployment: InferenceDeployment
    replicas: int
    quota: int
    """Per-replica quota in the ledger."""
    cap: int
    """Per-replica ceiling: `max`, and what the replica's volume offers LMCache."""
    request: int
    """Per-replica `request`, within the ceiling (where `Static` keeps it)."""

    @property
    def key(self) -> tuple[str, str]:
        return self.deployment.metadata.namespace or "default", self.deployment.metadata.name or ""


async def rebalance_pool(kube: KubeClient, http: aiohttp.ClientSession, config: OperatorConfig, book: DemandBook,
                         metrics: OperatorMetrics, name: str, deployments: Iterable[Mapping[str, Any]],
                         memory: PoolMemory, now: float) -> Decision | None:
    """One round for KVPool `name`, whose `deployments` (from the watch-fed index) name it: the round's
    decision (whether applied or not), None when there is nothing to divide."""
    body = await kube.get_or_none(KVPOOLS, None, name)
    if body is None:
        return None
    pool = parse(KVPool, body)
    status = pool.status or KVPoolStatus()
    members = _members(pool, status, deployments)
    if not members:
        return None
    unit = pool_unit(pool.spec.capacity)
    settings = LoopSettings.from_spec(pool.spec.rebalance)
    # Kept out of the division: what waiting deployments need at their minimum, and what entries
    # outside the round hold (deployments being deleted, scaled to zero, or not parseable).
    reserved = sum(w.needs for w in status.waiting)
    in_round = {m.uid for m in members}
    held = sum(a.allocated for a in status.allocations if a.uid not in in_round)
    capacity_units = max(pool.spec.capacity - reserved - held, 0) // unit
    states = {f"{m.key[0]}/{m.key[1]}": _state(book, m, unit, capacity_units, settings, now) for m in members}
    if memory.last_move is None and status.last_rebalance is not None and not status.last_rebalance.dry_run:
        memory.last_move = now - (datetime.now(UTC) - status.last_rebalance.time).total_seconds()
    decision = decide(states, capacity_units, settings, now, memory.last_move)
    metrics.rebalance_rounds.labels(pool=name, outcome=decision.outcome).inc()
    _realised_gain(book, metrics, name, members, memory, now, settings.interval_seconds)
    by_name = {f"{m.key[0]}/{m.key[1]}": m for m in members}
    if settings.policy == "Static":  # exactly the requests, not their rounding to units
        quotas = {key: m.request if decision.proposed[key] != _units(m, unit) else m.quota
                  for key, m in by_name.items()}
    else:
        quotas = {key: _per_replica(decision.proposed[key], unit, by_name[key]) for key in by_name}
    moves = [QuotaMove(namespace=m.key[0], name=m.key[1], from_quota=m.quota, to_quota=quotas[key])
             for key, m in by_name.items() if quotas[key] != m.quota]
    if not moves or decision.outcome not in ("moved", "static", "dry-run"):
        return decision
    moved_bytes = sum(max(0, move.to_quota - move.from_quota) * by_name[f"{move.namespace}/{move.name}"].replicas
                      for move in moves)
    record = RebalanceRecord(time=datetime.now(UTC), moved_bytes=moved_bytes,
                             predicted_gain=_finite(decision.predicted_gain), reason=_reason(decision, settings),
                             dry_run=decision.outcome == "dry-run", moves=moves)
    if record.dry_run:
        last = status.last_rebalance
        if last is None or not last.dry_run or last.moves != record.moves:  # once per proposal, not every round
            await _write_record(kube, name, record)
            await post_event(kube, body, "Normal", "RebalanceDryRun", _summary(record))
        return decision
    refused = await _write_ledger(kube, name, members, quotas, record)
    if refused:
        log.info("KVPool %s: no move this round: %s", name, refused)
        return decision
    memory.last_move, memory.moved_at = now, now
    memory.hit_rate_before = book.storage_hit_rate([m.key for m in members], now, settings.interval_seconds)
    metrics.rebalance_moves.labels(pool=name).inc(len(moves))
    metrics.rebalance_moved_bytes.labels(pool=name).inc(moved_bytes)
    metrics.rebalance_predicted_gain.labels(pool=name).set(record.predicted_gain)
    for key, member in by_name.items():
        metrics.rebalance_quota.labels(pool=name, namespace=member.key[0], deployment=member.key[1]).set(quotas[key])
    for gone in memory.exported - {m.key for m in members}:  # left the pool: no frozen last value
        metrics.rebalance_quota.remove(name, *gone)
    memory.exported = {m.key for m in members}
    failures = await _actuate(kube, http, config, decision, by_name, quotas)
    if failures:
        metrics.actuation_errors.labels(pool=name).inc(len(failures))
        await post_event(kube, body, "Warning", "QuotaNotApplied",
                         "ledger updated, engines not all at their new quota yet (the next resync retries): "
                         + "; ".join(failures))
    await post_event(kube, body, "Normal", "Rebalanced", _summary(record))
    for move in moves:
        member = by_name[f"{move.namespace}/{move.name}"]
        await post_event(kube, member.body, "Normal", "StorageQuotaChanged",
                         f"KVPool {name} moved this deployment's storage quota from {format_quantity(move.from_quota)} "
                         f"to {format_quantity(move.to_quota)} per replica: {record.reason}")
    return decision


def _members(pool: KVPool, status: KVPoolStatus, deployments: Iterable[Mapping[str, Any]]) -> list[_Member]:
    """The admitted deployments that take part in the round (not those being deleted or scaled to zero)."""
    members = []
    namespaces = {ns.uuid: ns for ns in pool.spec.storage.nvmeof.namespaces} if pool.spec.storage.nvmeof else {}
    by_uid = {deployment["metadata"].get("uid"): deployment for deployment in deployments}
    for allocation in status.allocations:
        body = by_uid.get(allocation.uid)
        if allocation.replicas < 1 or body is None or body["metadata"].get("deletionTimestamp"):
            continue
        try:
            deployment = parse(InferenceDeployment, body)
        except InvalidSpec:
            continue
        storage = deployment.spec.kv_cache.storage
        if storage is None:
            continue
        # What a replica can hold: `max`, and what its volume offers LMCache (the same cap the
        # InferenceDeployment controller applies when it sets the quota each resync).
        binding = StorageBinding(quota=storage.effective_max,
                                 namespaces=tuple(namespaces[u] for u in allocation.volumes if u in namespaces))
        cap = kv_volume(deployment, pool, binding).quota
        members.append(_Member(allocation.uid, dict(body), deployment, allocation.replicas, allocation.quota, cap,
                               min(storage.request, cap)))
    return members


def _state(book: DemandBook, member: _Member, unit: int, capacity_units: int, settings: LoopSettings,
           now: float) -> DeploymentState:
    spec = member.deployment.spec
    storage = spec.kv_cache.storage
    assert storage is not None
    chunk = chunk_storage_bytes(member.deployment)
    cpu = spec.kv_cache.cpu.size if spec.kv_cache.cpu is not None else 0
    geometry = Geometry(unit_bytes=unit, chunk_bytes=chunk, chunk_tokens=spec.kv_cache.chunk_size,
                        front_chunks=cpu / chunk)
    estimate = book.estimate(member.key, now, replicas=member.replicas, units=capacity_units, geometry=geometry,
                             half_life_seconds=HALF_LIFE_INTERVALS * settings.interval_seconds)
    current = _units(member, unit)
    return DeploymentState(
        current=current,
        estimate=estimate,
        weight=storage.weight,
        min_units=min(math.ceil(storage.effective_min * member.replicas / unit), current),
        max_units=max(member.cap * member.replicas // unit, current),
        request_units=-(-member.request * member.replicas // unit),
        unit_tokens=unit / chunk * spec.kv_cache.chunk_size,
    )


def _units(member: _Member, unit: int) -> int:
    """What a deployment holds, in units rounded up: a deployment kept as it is never takes more bytes
    than its units, so the units adding up to the capacity means the bytes do too."""
    return -(-member.quota * member.replicas // unit)


def _per_replica(units: int, unit: int, member: _Member) -> int:
    """A deployment's total units as a per-replica quota: aligned down, within its bounds."""
    storage = member.deployment.spec.kv_cache.storage
    assert storage is not None
    if units == _units(member, unit):
        return member.quota  # unchanged: no rounding drift
    quota = units * unit // member.replicas // QUOTA_ALIGN * QUOTA_ALIGN
    return max(min(quota, member.cap), min(storage.effective_min, member.cap))


async def _write_ledger(kube: KubeClient, name: str, members: list[_Member], quotas: Mapping[str, int],
                        record: RebalanceRecord) -> str | None:
    """The new quotas and the record, only if the ledger still holds what the round decided on;
    None when written, else why not."""
    expected = {m.uid: (m.replicas, m.quota, f"{m.key[0]}/{m.key[1]}") for m in members}
    refused: str | None = None

    def change(pool: KVPool, status: KVPoolStatus) -> KVPoolStatus:
        nonlocal refused
        seen = {a.uid: (a.replicas, a.quota) for a in status.allocations if a.uid in expected}
        if seen != {uid: value[:2] for uid, value in expected.items()}:
            refused = "the ledger changed during the round (an admission, a scale or a release)"
            return status
        allocations = [a.model_copy(update={"quota": quotas[expected[a.uid][2]]}) if a.uid in expected else a
                       for a in status.allocations]
        new = summarise(pool, status.model_copy(update={"allocations": allocations, "last_rebalance": record}))
        if allocated(new) > pool.spec.capacity:  # never hand out more than the pool holds
            refused = (f"the new quotas add up to {format_quantity(allocated(new))}, more than the capacity "
                       f"{format_quantity(pool.spec.capacity)}")
            return status
        refused = None
        return new

    try:
        await update_pool_status(kube, name, change)
    except PoolGone:
        return "the pool is gone"
    return refused


async def _write_record(kube: KubeClient, name: str, record: RebalanceRecord) -> None:
    try:
        await update_pool_status(kube, name, lambda pool, status: status.model_copy(update={"last_rebalance": record}))
    except PoolGone:
        pass


async def _actuate(kube: KubeClient, http: aiohttp.ClientSession, config: OperatorConfig, decision: Decision,
                   by_name: Mapping[str, _Member], quotas: Mapping[str, int]) -> list[str]:
    """Live quotas, shrinks first (the loop's order); modes without a quota API roll on their next reconcile."""
    failures: list[str] = []
    for change in decision.changes:
        member = by_name[change.name]
        quota = quotas[change.name]
        if member.deployment.spec.kv_cache.mode != "LMCacheMP" or quota == member.quota:
            continue
        if quota > member.quota and failures:
            failures.append(f"{change.name}: grow deferred until the shrinks apply")
            continue
        pods = await kube.list(PODS, member.key[0], label_selector=selector(member.deployment))
        results = await apply_quotas(kube, http, pods.get("items", []), min(quota, member.cap),
                                     config.render.lmcache_http_port)
        failures += [f"{r.pod}: {r.detail}" for r in results if not r.applied and r.detail != "not running yet"]
    return failures


def _realised_gain(book: DemandBook, metrics: OperatorMetrics, name: str, members: list[_Member],
                   memory: PoolMemory, now: float, interval: float) -> None:
    """One interval after a move: the measured change of the pool's storage hit rate."""
    if memory.moved_at is None or memory.hit_rate_before is None or now - memory.moved_at < interval:
        return
    after = book.storage_hit_rate([m.key for m in members], now, interval)
    if after is not None and memory.hit_rate_before > 0:
        metrics.rebalance_realised_gain.labels(pool=name).set(after / memory.hit_rate_before - 1)
    memory.moved_at = None


def _reason(decision: Decision, settings: LoopSettings) -> str:
    """Why the round moved, in the spec's terms (the loop's own reason counts internal units)."""
    if decision.outcome == "static":
        why = "policy Static: every deployment back to its request"
    elif settings.policy == "Proportional":
        why = "policy Proportional: shares by weight x access rate"
    else:
        why = f"predicted storage-tier hits {_rate(decision.value_before)} -> {_rate(decision.value_after)} tokens/s"
        if math.isfinite(decision.predicted_gain):
            best = decision.value_before * (1 + decision.predicted_gain)
            if not math.isclose(best, decision.value_after, rel_tol=1e-3):  # maxStep held this step back
                why += f" this step, {_rate(best)} tokens/s at the target"
            why += f" (+{decision.predicted_gain:.1%}, minGain {settings.min_gain:.0%})"
    if decision.frozen:
        why += f"; kept as they are (no fresh metrics): {', '.join(decision.frozen)}"
    return why


def _rate(tokens_per_second: float) -> str:
    """`1,234` or `35.2`: whole tokens where that is precise enough."""
    return f"{tokens_per_second:,.0f}" if tokens_per_second >= 100 else f"{tokens_per_second:.3g}"


def _summary(record: RebalanceRecord) -> str:
    moves = ", ".join(f"{m.namespace}/{m.name} {format_quantity(m.from_quota)}->{format_quantity(m.to_quota)}"
                      for m in record.moves)
    prefix = "dry run: would move" if record.dry_run else "moved"
    return f"{prefix} {format_quantity(record.moved_bytes)} (per-replica quotas {moves}): {record.reason}"


def _finite(value: float) -> float:
    return value if math.isfinite(value) else 1.0


def _interval(spec: Mapping[str, Any]) -> float:
    """`spec.rebalance.interval` in seconds (the default when the spec does not parse: the pool's
    reconcile reports that)."""
    try:
        return RebalanceSpec.model_validate(spec.get("rebalance") or {}).interval
    except ValidationError:
        return RebalanceSpec().interval


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    @kopf.daemon(*POOL, id="rebalance", registry=registry, cancellation_timeout=10)
    async def rebalance(name: str, spec: kopf.Spec, memo: kopf.Memo, stopped: kopf.DaemonStopped,
                        pool_deployments: kopf.Index, **_: Any) -> None:
        """A round every `spec.rebalance.interval` (read anew each time) until the pool goes."""
        memory = PoolMemory()
        while not stopped:
            started = time.monotonic()
            # Short waits, so a shortened spec.rebalance.interval applies within a slice.
            while not stopped and time.monotonic() - started < _interval(spec):
                await stopped.wait(min(INTERVAL_SLICE, _interval(spec) - (time.monotonic() - started)))
            if stopped:
                break
            try:
                decision = await rebalance_pool(memo.kube, memo.http, config, memo.demand, memo.metrics, name,
                                                list(pool_deployments.get(name, ())), memory, time.time())
                if decision is not None:
                    log.debug("KVPool %s: rebalance round %s: %s", name, decision.outcome, decision.reason)
            except (APIError, aiohttp.ClientError, TimeoutError, InvalidSpec) as error:
                log.warning("KVPool %s: rebalance round skipped: %s", name, error)
            except Exception:
                log.exception("KVPool %s: rebalance round failed", name)
