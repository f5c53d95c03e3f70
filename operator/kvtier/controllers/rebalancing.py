"""A KVPool's rebalance round against the cluster: read, plan, write the ledger, actuate, explain.

The pool controller runs :func:`rebalance_pool` every `spec.rebalance.interval` (a daemon per pool);
the round itself is planned by the pure :func:`kvtier.rebalance.round.plan_round` (units, bounds,
policies, the record), and the engines' quotas are set by :mod:`kvtier.rebalance.actuator`.

1. Read the pool and its ledger (`status.allocations`); the deployments come from the watch-fed index.
2. Plan the round from the :class:`~kvtier.rebalance.demand.DemandBook`'s curves (a deployment without
   fresh metrics is frozen).
3. A move is written to the ledger first (compare-and-swap on the pool's status: a ledger that
   changed meanwhile, by an admission or a scale, makes the round give up until the next one), with
   `status.lastRebalance`. Only then are the engines' quotas set, shrinks before grows, through the
   LMCache MP quota API; a failure is reported and left to the InferenceDeployment controller,
   which brings every replica to the ledger's quota each resync (also after an operator crash
   between the two steps). Modes without a live quota API re-render with the new size and roll.
4. An Event on the pool per round that moved (or would have, in a dry run), one on each deployment
   whose quota changed, and the `kvtier_rebalance_*` metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

import aiohttp
import kopf
from pydantic import ValidationError

from kvtier.api.kvpool import KVPool, KVPoolStatus, RebalanceRecord, RebalanceSpec
from kvtier.api.units import format_quantity
from kvtier.controllers.events import post_event
from kvtier.controllers.inferencedeployments import replica_pods
from kvtier.controllers.kvpools import POOL, PoolGone, PoolView, read_pool, update_pool_status
from kvtier.controllers.runtime import InvalidSpec, OperatorConfig
from kvtier.kube import APIError, KubeClient
from kvtier.rebalance.actuator import apply_quotas
from kvtier.rebalance.demand import DemandBook
from kvtier.rebalance.loop import Decision
from kvtier.rebalance.round import Member, RoundPlan, plan_round, summary
from kvtier.storage.ledger import allocated, summarise
from kvtier.telemetry.metrics import OperatorMetrics
from kvtier.telemetry.targets import TargetIndex

log = logging.getLogger(__name__)

#: Longest wait between two looks at `spec.rebalance.interval` (seconds).
INTERVAL_SLICE = 10.0


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


async def rebalance_pool(
    kube: KubeClient,
    http: aiohttp.ClientSession,
    config: OperatorConfig,
    book: DemandBook,
    metrics: OperatorMetrics,
    name: str,
    deployments: Iterable[Mapping[str, Any]],
    memory: PoolMemory,
    now: float,
    view: PoolView,
    targets: TargetIndex | None,
) -> Decision | None:
    """One round for KVPool `name`, whose `deployments` (from the watch-fed index) name it: the round's
    decision (whether applied or not), None when there is nothing to divide."""
    body = await read_pool(kube, name, view)
    if body is None:
        return None
    pool = view.model(body)
    status = pool.status or KVPoolStatus()
    if memory.last_move is None and status.last_rebalance is not None and not status.last_rebalance.dry_run:
        memory.last_move = now - (datetime.now(UTC) - status.last_rebalance.time).total_seconds()
    plan = plan_round(pool, status, deployments, book, now, memory.last_move, datetime.now(UTC))
    if plan is None:
        return None
    decision, record = plan.decision, plan.record
    metrics.rebalance_rounds.labels(pool=name, outcome=decision.outcome).inc()
    in_round = list(plan.members.values())
    _realised_gain(book, metrics, name, in_round, memory, now, plan.settings.interval_seconds)
    if record is None:
        return decision
    if record.dry_run:
        last = status.last_rebalance
        if last is None or not last.dry_run or last.moves != record.moves:  # once per proposal, not every round
            await _write_record(kube, name, record, view)
            await post_event(kube, body, "Normal", "RebalanceDryRun", summary(record))
        return decision
    refused = await _write_ledger(kube, name, in_round, plan.quotas, record, view)
    if refused:
        log.info("KVPool %s: no move this round: %s", name, refused)
        return decision
    memory.last_move, memory.moved_at = now, now
    memory.hit_rate_before = book.storage_hit_rate([m.key for m in in_round], now, plan.settings.interval_seconds)
    metrics.rebalance_moves.labels(pool=name).inc(len(record.moves))
    metrics.rebalance_moved_bytes.labels(pool=name).inc(record.moved_bytes)
    metrics.rebalance_predicted_gain.labels(pool=name).set(record.predicted_gain)
    for label, member in plan.members.items():
        metrics.rebalance_quota.labels(pool=name, namespace=member.key[0], deployment=member.key[1]).set(
            plan.quotas[label]
        )
    for gone in memory.exported - {m.key for m in in_round}:  # left the pool: no frozen last value
        metrics.rebalance_quota.remove(name, *gone)
    memory.exported = {m.key for m in in_round}
    failures = await _actuate(kube, http, config, plan, targets)
    if failures:
        metrics.actuation_errors.labels(pool=name).inc(len(failures))
        await post_event(
            kube,
            body,
            "Warning",
            "QuotaNotApplied",
            "ledger updated, engines not all at their new quota yet (the next resync retries): " + "; ".join(failures),
        )
    await post_event(kube, body, "Normal", "Rebalanced", summary(record))
    for move in record.moves:
        member = plan.members[f"{move.namespace}/{move.name}"]
        await post_event(
            kube,
            member.body,
            "Normal",
            "StorageQuotaChanged",
            f"KVPool {name} moved this deployment's storage quota from {format_quantity(move.from_quota)} "
            f"to {format_quantity(move.to_quota)} per replica: {record.reason}",
        )
    return decision


async def _write_ledger(
    kube: KubeClient,
    name: str,
    members: list[Member],
    quotas: Mapping[str, int],
    record: RebalanceRecord,
    view: PoolView,
) -> str | None:
    """The new quotas and the record, only if the ledger still holds what the round decided on;
    None when written, else why not."""
    expected = {m.uid: (m.replicas, m.quota, m.label) for m in members}
    refused: str | None = None

    def change(pool: KVPool, status: KVPoolStatus) -> KVPoolStatus:
        nonlocal refused
        seen = {a.uid: (a.replicas, a.quota) for a in status.allocations if a.uid in expected}
        if seen != {uid: value[:2] for uid, value in expected.items()}:
            refused = "the ledger changed during the round (an admission, a scale or a release)"
            return status
        allocations = [
            a.model_copy(update={"quota": quotas[expected[a.uid][2]]}) if a.uid in expected else a
            for a in status.allocations
        ]
        new = summarise(pool, status.model_copy(update={"allocations": allocations, "last_rebalance": record}))
        if allocated(new) > pool.spec.capacity:  # never hand out more than the pool holds
            refused = (
                f"the new quotas add up to {format_quantity(allocated(new))}, more than the capacity "
                f"{format_quantity(pool.spec.capacity)}"
            )
            return status
        refused = None
        return new

    try:
        await update_pool_status(kube, name, change, view)
    except PoolGone:
        return "the pool is gone"
    return refused


async def _write_record(kube: KubeClient, name: str, record: RebalanceRecord, view: PoolView) -> None:
    try:
        await update_pool_status(
            kube, name, lambda pool, status: status.model_copy(update={"last_rebalance": record}), view
        )
    except PoolGone:
        pass


async def _actuate(
    kube: KubeClient,
    http: aiohttp.ClientSession,
    config: OperatorConfig,
    plan: RoundPlan,
    targets: TargetIndex | None,
) -> list[str]:
    """Live quotas, shrinks first (the loop's order); modes without a quota API roll on their next reconcile."""
    failures: list[str] = []
    for change in plan.decision.changes:
        member = plan.members[change.name]
        quota = plan.quotas[change.name]
        if member.deployment.spec.kv_cache.mode != "LMCacheMP" or quota == member.quota:
            continue
        if quota > member.quota and failures:
            failures.append(f"{change.name}: grow deferred until the shrinks apply")
            continue
        replicas_now = partial(replica_pods, kube, targets, member.deployment)
        pods = await replicas_now()
        results = await apply_quotas(kube, http, pods, quota, config.render.lmcache_http_port, replicas_now)
        # an unanswered replica may still hold its old quota: it counts, so grows wait for the shrinks
        failures += [f"{r.pod}: {r.detail}" for r in results if not (r.applied or r.skipped)]
    return failures


def _realised_gain(
    book: DemandBook,
    metrics: OperatorMetrics,
    name: str,
    members: list[Member],
    memory: PoolMemory,
    now: float,
    interval: float,
) -> None:
    """One interval after a move: the measured change of the pool's storage hit rate."""
    if memory.moved_at is None or memory.hit_rate_before is None or now - memory.moved_at < interval:
        return
    after = book.storage_hit_rate([m.key for m in members], now, interval)
    if after is not None and memory.hit_rate_before > 0:
        metrics.rebalance_realised_gain.labels(pool=name).set(after / memory.hit_rate_before - 1)
    memory.moved_at = None


def _interval(spec: Mapping[str, Any]) -> float:
    """`spec.rebalance.interval` in seconds (the default when the spec does not parse: the pool's
    reconcile reports that)."""
    try:
        return RebalanceSpec.model_validate(spec.get("rebalance") or {}).interval
    except ValidationError:
        return RebalanceSpec().interval


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    @kopf.daemon(*POOL, id="rebalance", registry=registry, cancellation_timeout=10)
    async def rebalance(
        name: str, spec: kopf.Spec, memo: kopf.Memo, stopped: kopf.DaemonStopped, pool_deployments: kopf.Index, **_: Any
    ) -> None:
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
                decision = await rebalance_pool(
                    memo.kube,
                    memo.http,
                    config,
                    memo.demand,
                    memo.metrics,
                    name,
                    list(pool_deployments.get(name, ())),
                    memory,
                    time.time(),
                    memo.pool_view,
                    getattr(getattr(memo, "telemetry", None), "targets", None),
                )
                if decision is not None:
                    log.debug("KVPool %s: rebalance round %s: %s", name, decision.outcome, decision.reason)
            except (APIError, aiohttp.ClientError, TimeoutError, InvalidSpec) as error:
                log.warning("KVPool %s: rebalance round skipped: %s", name, error)
            except Exception:
                log.exception("KVPool %s: rebalance round failed", name)
