"""KVPool controller: the pool's status (ledger summary, conditions), volume reclaim, and its deletion guard.

Each pass first advances the reclaim of the static volumes deployments gave back
(`kvtier.controllers.reclaim`), then writes the ledger: allocations of deployments that no longer
exist are released (their namespaces to `reclaiming`), reclaimed namespaces are freed, and the ledger
is repaired from the deployments that name the pool (`kvtier.storage.ledger.repair`).

The ledger itself (`status.allocations`, `status.waiting`) is changed by whoever needs it —
admission in the InferenceDeployment controller, the rebalancer — always through
`update_pool_status`, a compare-and-swap on the status' `resourceVersion`. It starts from the operator's
`PoolView` (the newest copy of each pool from the watch or from its own writes) rather than a GET: a stale
copy costs one 409 and a GET, never a lost write.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import kopf

from kvtier.api.inferencedeployment import InferenceDeployment
from kvtier.api.kvpool import KVPool, KVPoolStatus
from kvtier.api.units import counted, format_quantity
from kvtier.controllers.conditions import set_condition
from kvtier.controllers.events import post_event, post_transitions
from kvtier.controllers.reclaim import reclaim_volumes
from kvtier.controllers.runtime import InvalidSpec, OperatorConfig, api_errors, measured, parse
from kvtier.kube import KVPOOLS, APIError, KubeClient
from kvtier.storage import NVMeoFBackend, backend_for
from kvtier.storage.ledger import Claim, allocated, reclaimed, repair

POOL = ("kvtier.io", "v1alpha1", "kvpools")
DEPLOYMENTS = ("kvtier.io", "v1alpha1", "inferencedeployments")
CAS_ATTEMPTS = 5


class PoolGone(Exception):
    """The KVPool does not exist (any more)."""


class PoolView:
    """The newest copy of every KVPool this operator has seen, from its watch and from its own status writes.

    Every InferenceDeployment pass reads its pool's ledger; from here that costs no request (a GET per pass
    was the operator's largest API cost at scale), and each version of a pool is parsed once (parsing a
    100-deployment ledger on every pass was a sixth of the operator's CPU at 1,000 deployments). Our own
    writes enter at once, so a pass never reads a ledger older than one this process wrote; a copy that is
    behind the API for a moment (someone else's write still on the watch) is caught by the compare-and-swap
    that every write is. Copies and models are never changed in place (a change is a new status, as
    `update_pool_status` compares it with the old): treat what `get` and `model` return as read-only.
    """

    def __init__(self) -> None:
        self._bodies: dict[str, Mapping[str, Any]] = {}
        self._models: dict[str, tuple[tuple[str, str], KVPool]] = {}

    def get(self, name: str) -> Mapping[str, Any] | None:
        return self._bodies.get(name)

    def model(self, body: Mapping[str, Any]) -> KVPool:
        """`body` parsed (`InvalidSpec` naming the fields at fault), once per version of the pool."""
        metadata = body["metadata"]
        version = (metadata.get("uid", ""), metadata.get("resourceVersion", ""))
        cached = self._models.get(metadata["name"])
        if cached is not None and cached[0] == version and version[1]:
            return cached[1]
        pool = parse(KVPool, body)
        self._models[metadata["name"]] = (version, pool)
        return pool

    def observe(self, body: Mapping[str, Any]) -> None:
        """Keep `body` (the view's from now on: nobody changes it) unless the copy held is newer (a watch event
        may arrive after our own later write)."""
        name = body["metadata"]["name"]
        held = self._bodies.get(name)
        if held is None or not _older(body, held):
            self._bodies[name] = body

    def forget(self, name: str, uid: str | None = None) -> None:
        """Drop the copy of a deleted pool (only that incarnation's, when `uid` is given)."""
        held = self._bodies.get(name)
        if held is not None and (uid is None or held["metadata"].get("uid") == uid):
            del self._bodies[name]
            self._models.pop(name, None)


def _older(body: Mapping[str, Any], than: Mapping[str, Any]) -> bool:
    """Whether `body` is an older version of the same pool than `than`. resourceVersions are opaque to
    clients, but both kube-apiserver (etcd revisions) and the embedded one issue increasing integers; any
    other form counts as newer, as an informer takes whatever the watch brings last."""
    if body["metadata"].get("uid") != than["metadata"].get("uid"):
        return False
    mine, theirs = body["metadata"].get("resourceVersion", ""), than["metadata"].get("resourceVersion", "")
    return mine.isdigit() and theirs.isdigit() and int(mine) < int(theirs)


async def read_pool(
    kube: KubeClient, name: str, view: PoolView | None = None, *, fresh: bool = False
) -> Mapping[str, Any] | None:
    """The pool's body from the view, else (or when `fresh`) from the API, which the view then keeps
    (None: no such pool)."""
    body = view.get(name) if view is not None and not fresh else None
    if body is None:
        body = await kube.get_or_none(KVPOOLS, None, name)
        if view is not None and body is not None:
            view.observe(body)
        elif view is not None:
            view.forget(name)
    return body


async def update_pool_status(
    kube: KubeClient,
    name: str,
    change: Callable[[KVPool, KVPoolStatus], KVPoolStatus],
    view: PoolView | None = None,
) -> tuple[KVPool, KVPoolStatus]:
    """Read the pool (from `view` when it holds it), apply `change` to its status, write it back only if
    nobody wrote in between.

    A lost race reads the pool from the API and tries again, a few times at once; after that the conflict
    goes to kopf as a temporary error.
    """
    for attempt in range(CAS_ATTEMPTS):
        body = await read_pool(kube, name, view, fresh=attempt > 0)
        if body is None:
            raise PoolGone(name)
        pool = view.model(body) if view is not None else parse(KVPool, body)
        current = pool.status or KVPoolStatus()
        new = change(pool, current)
        if new == current:
            return pool, current
        try:
            written = await kube.replace(KVPOOLS, {**body, "status": new.to_wire()}, subresource="status")
        except APIError as error:
            if error.status == 404:
                if view is not None:
                    view.forget(name)
                raise PoolGone(name) from None
            if error.status != 409 or attempt == CAS_ATTEMPTS - 1:
                raise
            continue
        if view is not None:
            view.observe(written)
        return pool, new
    raise AssertionError("unreachable")


def created_at(metadata: Any) -> datetime:
    """An object's `creationTimestamp` (admission order)."""
    return datetime.fromisoformat(str(metadata["creationTimestamp"]).replace("Z", "+00:00"))


def _claims(deployments: Iterable[Any]) -> dict[str, Claim | None]:
    """What each deployment naming the pool asks of it, by uid (None: its spec does not parse)."""
    claims: dict[str, Claim | None] = {}
    for body in deployments:
        uid = body["metadata"].get("uid")
        try:
            deployment = parse(InferenceDeployment, body)
        except InvalidSpec:
            claims[uid] = None
            continue
        claims[uid] = Claim.of(deployment, created_at(body["metadata"])) if deployment.spec.kv_cache.storage else None
    return claims


def pool_conditions(
    pool: KVPool,
    status: KVPoolStatus,
    generation: int | None,
    reclaim_problems: Sequence[str] = (),
    reclaim_reason: str = "WipeFailed",
) -> list[dict[str, Any]]:
    """Ready, OverCommitted and Degraded, from the spec, the ledger and the reclaim pass' problems."""
    conditions = [c.to_wire() for c in status.conditions]
    used = allocated(status)
    problems = list(reclaim_problems)
    backend = backend_for(pool)
    if isinstance(backend, NVMeoFBackend):
        ignored = backend.unsupported_options()
        if ignored:
            problems.append(f"driver {backend.spec.driver} ignores: {'; '.join(ignored)}")
        inventory = sum(ns.size for ns in backend.spec.namespaces)
        if inventory < pool.spec.capacity:
            problems.append(
                f"capacity {format_quantity(pool.spec.capacity)} exceeds the namespaces' {format_quantity(inventory)}"
            )
    if used > pool.spec.capacity:
        conditions = set_condition(
            conditions,
            "OverCommitted",
            "True",
            "CapacityReduced",
            f"allocated {format_quantity(used)} exceeds capacity "
            f"{format_quantity(pool.spec.capacity)}; no new admissions until it fits",
            generation,
        )
    else:
        conditions = set_condition(
            conditions,
            "OverCommitted",
            "False",
            "WithinCapacity",
            f"{format_quantity(used)} of {format_quantity(pool.spec.capacity)} allocated",
            generation,
        )
    if reclaim_problems:
        conditions = set_condition(conditions, "Degraded", "True", reclaim_reason, "; ".join(problems), generation)
    elif problems:
        conditions = set_condition(
            conditions, "Degraded", "True", "StorageLimitations", "; ".join(problems), generation
        )
    else:
        conditions = set_condition(conditions, "Degraded", "False", "AsExpected", "", generation)
    return set_condition(conditions, "Ready", "True", "Available", holdings(pool, status), generation)


def holdings(pool: KVPool, status: KVPoolStatus) -> str:
    """Who holds how much of the pool, in words: `3 deployments hold 96Gi of 96Gi; 1 waits for capacity`."""
    capacity = format_quantity(pool.spec.capacity)
    holders = len(status.allocations)
    if holders:
        verb = "holds" if holders == 1 else "hold"
        parts = [f"{counted(holders, 'deployment')} {verb} {format_quantity(allocated(status))} of {capacity}"]
    else:
        parts = [f"no deployment holds any of its {capacity} yet"]
    if status.waiting:
        verb = "waits" if len(status.waiting) == 1 else "wait"
        parts.append(f"{counted(len(status.waiting), 'deployment')} {verb} for capacity")
    if status.reclaiming:
        one = len(status.reclaiming) == 1
        state = (
            "being wiped"
            if pool.spec.volume_reclaim == "Wipe"
            else (
                "retained until its PersistentVolume is deleted"
                if one
                else "retained until their PersistentVolumes are deleted"
            )
        )
        parts.append(f"{counted(len(status.reclaiming), 'released NVMe-oF namespace')} {state}")
    return "; ".join(parts)


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    @kopf.on.startup(id="pool-view", registry=registry)
    async def open_pool_view(memo: kopf.Memo, **_: Any) -> None:
        memo.pool_view = PoolView()

    @kopf.on.event(*POOL, id="pool-view", registry=registry)
    async def pool_view(event: Mapping[str, Any], body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        if event.get("type") == "DELETED":
            memo.pool_view.forget(body.metadata.name, body.metadata.uid)
        else:
            memo.pool_view.observe(copy.deepcopy(dict(body)))

    @kopf.index(*DEPLOYMENTS, id="pool_deployments", registry=registry)
    async def pool_deployments(body: kopf.Body, **_: Any) -> dict[str, dict[str, Any]] | None:
        """Pool name -> the InferenceDeployments that name it now (their spec and identity, not status);
        the pool's reconcile and its rebalance rounds read it as the `pool_deployments` kwarg."""
        pool = (((body.get("spec") or {}).get("kvCache") or {}).get("storage") or {}).get("poolRef")
        if not pool:
            return None
        metadata = {key: value for key, value in body.metadata.items() if key != "managedFields"}
        return {
            pool: {
                "apiVersion": body["apiVersion"],
                "kind": body["kind"],
                "metadata": metadata,
                "spec": dict(body.spec),
            }
        }

    async def reconcile(body: kopf.Body, memo: kopf.Memo, pool_deployments: kopf.Index, **_: Any) -> None:
        generation = body.metadata.get("generation")
        try:
            pool = parse(KVPool, body)
        except InvalidSpec as error:
            conditions = set_condition(
                list(body.get("status", {}).get("conditions", [])),
                "Ready",
                "False",
                "InvalidSpec",
                str(error),
                generation,
            )
            with api_errors():
                await memo.kube.patch(
                    KVPOOLS, None, body.metadata.name, {"status": {"conditions": conditions}}, subresource="status"
                )
            await post_transitions(memo.kube, body, list(body.get("status", {}).get("conditions", [])), conditions)
            raise

        with api_errors():
            reclaim = await reclaim_volumes(memo.kube, pool, config.namespace, config.render.wipe_image)

        repairs: list[str] = []

        def refresh(pool: KVPool, status: KVPoolStatus) -> KVPoolStatus:
            # The ledger repaired from the deployments that name the pool now (see `ledger.repair`): read from
            # the live index here, after the pool's status was read, not before the awaits above. A deployment
            # admitted meanwhile is in the index before its entry can be in the ledger (kopf indexes an event
            # before its handlers run); a snapshot taken earlier released it as gone (seen on the real ground).
            claims = _claims(pool_deployments.get(body.metadata.name, ()))
            status, found = repair(pool, status, claims)
            repairs[:] = found
            status = reclaimed(pool, status, reclaim.freed).model_copy(update={"observed_generation": generation})
            conditions = pool_conditions(pool, status, generation, reclaim.problems, reclaim.reason)
            return status.model_validate({**status.to_wire(), "conditions": conditions})

        before = list(body.get("status", {}).get("conditions", []))
        with api_errors():
            try:
                pool, status = await update_pool_status(memo.kube, body.metadata.name, refresh, memo.pool_view)
            except PoolGone:
                return
        await post_transitions(memo.kube, body, before, [c.to_wire() for c in status.conditions])
        if repairs:
            await post_event(
                memo.kube,
                body,
                "Warning",
                "LedgerRepaired",
                f"the ledger did not match the deployments using the pool; repaired: {'; '.join(repairs)}",
            )
        metrics = getattr(memo, "metrics", None)
        if metrics is not None:
            metrics.pool_capacity.labels(pool=body.metadata.name).set(pool.spec.capacity)
            metrics.pool_allocated.labels(pool=body.metadata.name).set(allocated(status))

    reconcile = measured("KVPool", reconcile)
    kopf.on.resume(*POOL, id="reconcile", registry=registry)(reconcile)
    kopf.on.create(*POOL, id="reconcile", registry=registry)(reconcile)
    kopf.on.update(*POOL, id="reconcile", field="spec", registry=registry)(reconcile)
    kopf.timer(*POOL, id="resync", interval=config.resync_seconds, registry=registry)(reconcile)

    @kopf.on.delete(*POOL, id="held-while-used", registry=registry)
    async def held_while_used(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        # Timers stop once deletion starts: reclaim from here until the last released namespace is free.
        pool = parse(KVPool, body)
        with api_errors():
            reclaim = await reclaim_volumes(memo.kube, pool, config.namespace, config.render.wipe_image)
            try:
                _, status = await update_pool_status(
                    memo.kube,
                    body.metadata.name,
                    lambda pool, status: reclaimed(pool, status, reclaim.freed),
                    memo.pool_view,
                )
            except PoolGone:
                return
        users = [f"{a.namespace}/{a.name}" for a in status.allocations] + [
            f"{w.namespace}/{w.name}" for w in status.waiting
        ]
        if users:
            reason = "InUse"
            message = (
                f"deletion waits for {counted(len(users), 'InferenceDeployment')} using the pool: "
                f"{', '.join(users[:5])}{' ...' if len(users) > 5 else ''}"
            )
        elif status.reclaiming and not reclaim.unwiped:
            reason = "Reclaiming"
            message = "; ".join(
                [
                    f"deletion waits for {counted(len(status.reclaiming), 'released NVMe-oF namespace')} to be "
                    f"reclaimed (spec.volumeReclaim; Retain keeps them until their PersistentVolumes "
                    f"are deleted)",
                    *reclaim.problems,
                ]
            )
        else:
            # Nothing uses the pool. Volumes no wipe can start for stay Released, labelled with the pool: a pool
            # of the same name wipes them before it binds them again, as `Retain` would keep them.
            if reclaim.unwiped:
                await post_event(
                    memo.kube,
                    body,
                    "Warning",
                    reclaim.reason,
                    f"KVPool {body.metadata.name} deleted without wiping {counted(len(reclaim.unwiped), 'released volume')} "
                    f"({', '.join(reclaim.unwiped[:5])}): {'; '.join(reclaim.problems)}; they "
                    f"stay Released until deleted, or wiped by a new pool of the same name",
                )
            metrics = getattr(memo, "metrics", None)
            for family in (metrics.pool_capacity, metrics.pool_allocated) if metrics is not None else ():
                with contextlib.suppress(KeyError):
                    family.remove(body.metadata.name)
            return
        conditions = set_condition(
            list(body.get("status", {}).get("conditions", [])),
            "Ready",
            "False",
            "Terminating",
            message,
            body.metadata.get("generation"),
        )
        conditions = set_condition(conditions, "Terminating", "True", reason, message, body.metadata.get("generation"))
        with api_errors():
            await memo.kube.patch(
                KVPOOLS, None, body.metadata.name, {"status": {"conditions": conditions}}, subresource="status"
            )
        raise kopf.TemporaryError(message, delay=config.resync_seconds)
