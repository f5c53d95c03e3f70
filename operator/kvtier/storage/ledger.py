"""The pool ledger: who holds how much of which pool. Pure functions over `KVPool.status`.

The ledger is `status.allocations` of the KVPool itself (plus `status.waiting`, the admission
queue). Every change is computed here and written back with the status' `resourceVersion` as a
precondition (`kvtier.controllers.pools.update_pool_status`), so concurrent writers serialise on
the API server, and the entry is written *before* any volume, pod or quota is actuated: after a
crash at any point the sum of the quotas is still within `capacity`, and what actually runs is at
most what the ledger says.

Admission rules:
- a new deployment gets `request` per replica, or less if the pool is short, but never less than
  `min`; if even `min` x replicas does not fit, nothing is allocated and it waits;
- waiting deployments are admitted oldest first: a newer one never overtakes an older one;
- static NVMe-oF pools also bind one free namespace per replica, best fit (the smallest that
  holds the quota), and a bound namespace's size caps that replica's quota;
- scaling keeps the quota and the namespaces of the ordinals that remain; growth that does not
  fit keeps the replicas already admitted.

Volume reclaim: a namespace that leaves an allocation (its deployment deleted, the ordinal scaled
away) moves to `status.reclaiming` in the same write, and admission never binds it from there;
the pool controller removes it (`reclaimed`) once its PersistentVolume is gone: wiped and deleted
(`volumeReclaim: Wipe`), or deleted by an administrator (`Retain`). So no namespace is ever free
with the previous tenant's KV data on it, whatever crashes in between.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from kvtier.api.inferencedeployment import InferenceDeployment
from kvtier.api.kvpool import Allocation, KVPool, KVPoolStatus, NVMeoFNamespace, WaitingDeployment
from kvtier.api.units import format_quantity

#: Quotas are whole 4 KiB blocks (LMCache's raw-block alignment).
QUOTA_ALIGN = 4096


@dataclass(frozen=True)
class Claim:
    """What one deployment asks of its pool."""

    namespace: str
    name: str
    uid: str
    created: datetime
    replicas: int
    request: int
    min: int
    max: int

    @classmethod
    def of(cls, deployment: InferenceDeployment, created: datetime) -> Claim:
        storage = deployment.spec.kv_cache.storage
        assert storage is not None and deployment.metadata.uid, "only stored deployments with a storage tier claim"
        return cls(
            namespace=deployment.metadata.namespace or "default",
            name=deployment.metadata.name or "",
            uid=deployment.metadata.uid,
            created=created,
            replicas=deployment.spec.replicas,
            request=storage.request,
            min=storage.effective_min,
            max=storage.effective_max,
        )


@dataclass(frozen=True)
class Decision:
    """The ledger after a claim, and what it granted (None: the claim waits, `reason`/`message` say why)."""

    status: KVPoolStatus
    allocation: Allocation | None
    reason: str
    message: str


def _align(value: int) -> int:
    return value // QUOTA_ALIGN * QUOTA_ALIGN


def allocated(status: KVPoolStatus) -> int:
    return sum(entry.allocated for entry in status.allocations)


def summarise(pool: KVPool, status: KVPoolStatus) -> KVPoolStatus:
    """The derived fields (`capacity`, `allocated`, `available`, `deployments`) recomputed from the ledger."""
    used = allocated(status)
    return status.model_copy(
        update={
            "capacity": pool.spec.capacity,
            "allocated": used,
            "available": max(pool.spec.capacity - used, 0),
            "deployments": len(status.allocations),
        }
    )


def _reclaim(status: KVPoolStatus, uuids: list[str]) -> list[str]:
    """`status.reclaiming` with `uuids` added (once each, in order)."""
    return list(dict.fromkeys([*status.reclaiming, *uuids]))


def release(pool: KVPool, status: KVPoolStatus, uid: str) -> KVPoolStatus:
    """The ledger without the deployment `uid` (its allocation and its place in the queue); its namespaces
    go to `reclaiming`."""
    gone = [uuid for a in status.allocations if a.uid == uid for uuid in a.volumes]
    return summarise(
        pool,
        status.model_copy(
            update={
                "allocations": [a for a in status.allocations if a.uid != uid],
                "waiting": [w for w in status.waiting if w.uid != uid],
                "reclaiming": _reclaim(status, gone),
            }
        ),
    )


def reclaimed(pool: KVPool, status: KVPoolStatus, uuids: set[str]) -> KVPoolStatus:
    """The ledger with the namespaces `uuids` free again (their PersistentVolumes are gone)."""
    return summarise(pool, status.model_copy(update={"reclaiming": [u for u in status.reclaiming if u not in uuids]}))


def _namespaces(pool: KVPool) -> dict[str, NVMeoFNamespace]:
    nvmeof = pool.spec.storage.nvmeof
    return {ns.uuid: ns for ns in nvmeof.namespaces} if nvmeof is not None else {}


def admit(pool: KVPool, status: KVPoolStatus, claim: Claim) -> Decision:
    """Grant, resize or queue `claim`; never lets the ledger exceed `capacity`."""
    # Entries of an earlier object with the same name (deleted and recreated) are stale.
    others = [a for a in status.allocations if a.uid != claim.uid and (a.namespace, a.name) != (claim.namespace, claim.name)]
    stale = [uuid for a in status.allocations if a.uid != claim.uid and a not in others for uuid in a.volumes]
    existing = next((a for a in status.allocations if a.uid == claim.uid), None)
    queue = [w for w in status.waiting if w.uid != claim.uid and (w.namespace, w.name) != (claim.namespace, claim.name)]
    free = pool.spec.capacity - sum(a.allocated for a in others)

    if existing is None:
        ahead = [w for w in queue if (w.since, w.namespace, w.name) < (claim.created, claim.namespace, claim.name)]
        if ahead:
            first = ahead[0]
            return _wait(pool, status, others, queue, claim, "Queued",
                         f"waiting behind {len(ahead)} earlier deployment(s) for KVPool {pool.metadata.name}, "
                         f"first {first.namespace}/{first.name}")
        wanted = claim.request
    else:
        wanted = min(max(existing.quota, claim.min), claim.max)

    quota = wanted
    if claim.replicas and quota * claim.replicas > free:
        quota = _align(max(free, 0) // claim.replicas)
    volumes: list[str] = []
    inventory = _namespaces(pool)
    if inventory and claim.replicas:
        kept = list(existing.volumes[: claim.replicas]) if existing else []
        taken = {uuid for a in others for uuid in a.volumes} | set(kept) | set(status.reclaiming) | set(stale)
        candidates = sorted((ns for ns in inventory.values() if ns.uuid not in taken), key=lambda ns: (ns.size, ns.uuid))
        needed = claim.replicas - len(kept)
        fitting = [ns for ns in candidates if ns.size >= max(claim.min, 1)]
        if len(fitting) < needed:
            return _refuse(pool, status, others, queue, existing, claim,
                           f"KVPool {pool.metadata.name} has {len(fitting)} free NVMe-oF namespace(s) of at least "
                           f"{format_quantity(claim.min)}; {claim.name} needs {needed} more (one per replica)")
        # Best fit: the smallest namespaces that hold the quota, else the largest of those that hold `min`.
        holding = [ns for ns in fitting if ns.size >= quota]
        chosen = holding[:needed] if len(holding) >= needed else fitting[-needed:]
        volumes = kept + [ns.uuid for ns in chosen]
        quota = min([quota] + [inventory[uuid].size for uuid in volumes])
    quota = _align(quota) if quota < wanted else quota
    if claim.replicas and quota < claim.min:
        return _refuse(pool, status, others, queue, existing, claim,
                       f"KVPool {pool.metadata.name} has {format_quantity(max(free, 0))} available; "
                       f"{claim.name} needs at least min x replicas = {format_quantity(claim.min)} x {claim.replicas}")
    allocation = Allocation(namespace=claim.namespace, name=claim.name, uid=claim.uid, replicas=claim.replicas,
                            quota=quota, volumes=volumes)
    dropped = [uuid for uuid in (existing.volumes if existing else []) if uuid not in volumes]
    # An admitted deployment keeps its place in the list: an unchanged entry leaves the status unchanged.
    kept = {a.uid for a in others} | {claim.uid}
    allocations = [allocation if a.uid == claim.uid else a for a in status.allocations if a.uid in kept]
    if existing is None:
        allocations.append(allocation)
    new = summarise(pool, status.model_copy(update={"allocations": allocations, "waiting": queue,
                                                    "reclaiming": _reclaim(status, stale + dropped)}))
    return Decision(new, allocation, "Bound",
                    f"{format_quantity(quota)} per replica x {claim.replicas} from KVPool {pool.metadata.name}")


def _refuse(pool: KVPool, status: KVPoolStatus, others: list[Allocation], queue: list[WaitingDeployment],
            existing: Allocation | None, claim: Claim, message: str) -> Decision:
    """No change for an admitted deployment (it keeps what it has); a new one joins the queue."""
    if existing is not None:
        return Decision(summarise(pool, status), existing, "InsufficientCapacity", message)
    return _wait(pool, status, others, queue, claim, "InsufficientCapacity", message)


def _wait(pool: KVPool, status: KVPoolStatus, others: list[Allocation], queue: list[WaitingDeployment],
          claim: Claim, reason: str, message: str) -> Decision:
    entry = WaitingDeployment(namespace=claim.namespace, name=claim.name, uid=claim.uid, since=claim.created,
                              needs=claim.min * claim.replicas)
    waiting = sorted([*queue, entry], key=lambda w: (w.since, w.namespace, w.name))
    stale = [uuid for a in status.allocations if a not in others for uuid in a.volumes]
    new = summarise(pool, status.model_copy(update={"allocations": others, "waiting": waiting,
                                                    "reclaiming": _reclaim(status, stale)}))
    return Decision(new, None, reason, message)

