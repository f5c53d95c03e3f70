"""The pool ledger: who holds how much of which pool. Pure functions over `KVPool.status`.

The ledger is `status.allocations` of the KVPool itself (plus `status.waiting`, the admission
queue). Every change is computed here and written back with the status' `resourceVersion` as a
precondition (`kvtier.controllers.pools.update_pool_status`), so concurrent writers serialise on
the API server, and the entry is written *before* any volume, pod or quota is actuated: after a
crash at any point the sum of the quotas is still within `capacity`, and what actually runs is at
most what the ledger says.

Admission rules:
- a deployment that can never fit (`min` x replicas above the pool's capacity, or, in a static pool,
  fewer namespaces of at least `min` in the whole inventory than it has replicas) is refused with
  `NeverFits` and takes no place in the queue, so it blocks nobody;
- a new deployment gets `request` per replica, or less if the pool is short, but never less than
  `min`; if even `min` x replicas does not fit, nothing is allocated and it waits;
- waiting deployments are admitted oldest first, with one exception that keeps a large waiter from
  stalling the pool: a newer deployment that fits the free capacity is admitted ahead of older waiters
  that do not fit it, and each older waiter passed over that way counts it (`passedOver`); once a
  waiter has been passed over `MAX_PASS_OVER` times nobody overtakes it any more, so it waits behind
  no more than `MAX_PASS_OVER` newer deployments and then gets the next capacity that frees up
  (the rebalancer also keeps what waiters need at their minimum out of its division);
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

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from kvtier.api.inferencedeployment import InferenceDeployment
from kvtier.api.kvpool import STATUS_LIST_LIMIT, Allocation, KVPool, KVPoolStatus, NVMeoFNamespace, WaitingDeployment
from kvtier.api.units import format_quantity
from kvtier.storage.base import BLOCK_ALIGN, align_down

#: Quotas are whole blocks of LMCache's raw-block alignment.
QUOTA_ALIGN = BLOCK_ALIGN

#: How many newer deployments may be admitted ahead of an older waiter that does not fit (see above).
MAX_PASS_OVER = 3


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
class Admission:
    """The ledger after a claim, and what it granted (None: the claim waits, `reason`/`message` say why)."""

    status: KVPoolStatus
    allocation: Allocation | None
    reason: str
    message: str


def _align(value: int) -> int:
    return align_down(value, QUOTA_ALIGN)


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


def never_fits(pool: KVPool, claim: Claim) -> str | None:
    """Why `claim` can never be admitted to `pool`, whatever else is released (None: it can, some day)."""
    if not claim.replicas:
        return None
    needs = claim.min * claim.replicas
    if needs > pool.spec.capacity:
        return (
            f"needs at least min x replicas = {format_quantity(claim.min)} x {claim.replicas} = "
            f"{format_quantity(needs)}, more than KVPool {pool.metadata.name}'s whole capacity "
            f"{format_quantity(pool.spec.capacity)}; lower spec.replicas or spec.kvCache.storage.min"
        )
    inventory = _namespaces(pool)
    if inventory:
        large = sum(1 for ns in inventory.values() if ns.size >= max(claim.min, 1))
        if large < claim.replicas:
            return (
                f"needs one NVMe-oF namespace of at least {format_quantity(claim.min)} per replica "
                f"({claim.replicas}); KVPool {pool.metadata.name} has {large} in all"
            )
    return None


def admit(pool: KVPool, status: KVPoolStatus, claim: Claim) -> Admission:
    """Grant, resize or queue `claim`; never lets the ledger exceed `capacity`. Linear in the ledger's size."""
    key = (claim.namespace, claim.name)
    # Entries of an earlier object with the same name (deleted and recreated) are stale.
    others = [a for a in status.allocations if a.uid != claim.uid and (a.namespace, a.name) != key]
    other_uids = {a.uid for a in others}
    stale = [uuid for a in status.allocations if a.uid != claim.uid and a.uid not in other_uids for uuid in a.volumes]
    existing = next((a for a in status.allocations if a.uid == claim.uid), None)
    queue = [w for w in status.waiting if w.uid != claim.uid and (w.namespace, w.name) != key]
    free = pool.spec.capacity - sum(a.allocated for a in others)

    impossible = never_fits(pool, claim)
    if impossible is not None:
        message = f"{claim.name} {impossible}"
        if existing is not None:  # keeps what it was admitted with; the growth is what never fits
            return Admission(summarise(pool, status), existing, "NeverFits", message)
        new = summarise(
            pool,
            status.model_copy(update={"allocations": others, "waiting": queue, "reclaiming": _reclaim(status, stale)}),
        )
        return Admission(new, None, "NeverFits", message)

    if existing is None and len(others) >= STATUS_LIST_LIMIT:  # the CRD bounds the ledger (CEL cost budget)
        new = summarise(
            pool,
            status.model_copy(update={"allocations": others, "waiting": queue, "reclaiming": _reclaim(status, stale)}),
        )
        return Admission(
            new,
            None,
            "PoolFull",
            f"KVPool {pool.metadata.name} already holds {STATUS_LIST_LIMIT} deployments, the most one "
            f"pool's ledger records; {claim.name} is admitted when one leaves (or use another pool)",
        )

    passed: list[WaitingDeployment] = []
    if existing is None:
        ahead = [w for w in queue if (w.since, w.namespace, w.name) < (claim.created, claim.namespace, claim.name)]
        blocking = [w for w in ahead if w.needs <= free or w.passed_over >= MAX_PASS_OVER]
        needs = claim.min * claim.replicas
        if blocking or (ahead and needs > free):
            first = (blocking or ahead)[0]
            return _wait(
                pool,
                status,
                others,
                queue,
                claim,
                "Queued",
                f"waiting behind {len(ahead)} earlier deployment(s) for KVPool {pool.metadata.name}, "
                f"first {first.namespace}/{first.name} (needs {format_quantity(first.needs)}, "
                f"{format_quantity(max(free, 0))} available)",
            )
        passed = ahead  # none of them fits the free capacity: this one goes first, and they count it
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
        candidates = sorted(
            (ns for ns in inventory.values() if ns.uuid not in taken), key=lambda ns: (ns.size, ns.uuid)
        )
        needed = claim.replicas - len(kept)
        fitting = [ns for ns in candidates if ns.size >= max(claim.min, 1)]
        if len(fitting) < needed:
            return _refuse(
                pool,
                status,
                others,
                queue,
                existing,
                claim,
                f"KVPool {pool.metadata.name} has {len(fitting)} free NVMe-oF namespace(s) of at least "
                f"{format_quantity(claim.min)}; {claim.name} needs {needed} more (one per replica)",
            )
        # Best fit: the smallest namespaces that hold the quota, else the largest of those that hold `min`.
        holding = [ns for ns in fitting if ns.size >= quota]
        chosen = holding[:needed] if len(holding) >= needed else fitting[-needed:]
        volumes = kept + [ns.uuid for ns in chosen]
        quota = min([quota] + [inventory[uuid].size for uuid in volumes])
    quota = _align(quota) if quota < wanted else quota
    if claim.replicas and quota < claim.min:
        return _refuse(
            pool,
            status,
            others,
            queue,
            existing,
            claim,
            f"KVPool {pool.metadata.name} has {format_quantity(max(free, 0))} available; "
            f"{claim.name} needs at least min x replicas = {format_quantity(claim.min)} x {claim.replicas}",
        )
    allocation = Allocation(
        namespace=claim.namespace, name=claim.name, uid=claim.uid, replicas=claim.replicas, quota=quota, volumes=volumes
    )
    dropped = [uuid for uuid in (existing.volumes if existing else []) if uuid not in volumes]
    # An admitted deployment keeps its place in the list: an unchanged entry leaves the status unchanged.
    kept_uids = other_uids | {claim.uid}
    allocations = [allocation if a.uid == claim.uid else a for a in status.allocations if a.uid in kept_uids]
    if existing is None:
        allocations.append(allocation)
    overtaken = {w.uid for w in passed}
    queue = [w.model_copy(update={"passed_over": w.passed_over + 1}) if w.uid in overtaken else w for w in queue]
    new = summarise(
        pool,
        status.model_copy(
            update={"allocations": allocations, "waiting": queue, "reclaiming": _reclaim(status, stale + dropped)}
        ),
    )
    ahead_note = f" (admitted ahead of {len(passed)} earlier deployment(s) that do not fit yet)" if passed else ""
    return Admission(
        new,
        allocation,
        "Bound",
        f"{format_quantity(quota)} per replica x {claim.replicas} from KVPool {pool.metadata.name}{ahead_note}",
    )


def repair(pool: KVPool, status: KVPoolStatus, claims: Mapping[str, Claim | None]) -> tuple[KVPoolStatus, list[str]]:
    """The ledger corrected from the cluster's truth (`claims`: every deployment naming the pool, by uid;
    None for one whose spec does not parse, whose entry is left as it is),
    and what was repaired, in words. Run on every pool resync, so a damaged or stale status heals:

    - entries and waiters of deployments that are gone (or name another pool now) are released;
    - an entry for more replicas than its deployment has now keeps the first ones (scale-down);
    - a quota above `max` is lowered to it;
    - a quota below `min` is raised to it, from free capacity and then by shrinking other entries
      towards their own `min` (never below), the ones furthest above it first;
    - entries summing above `capacity` (capacity lowered) are shrunk towards their `min` the same way.

    Growth (more replicas, a raised request) stays admission's job (`admit`); what cannot be repaired
    within the others' bounds stays, and the pool's OverCommitted condition or the deployment's
    BelowMinimum reason says so.
    """
    repairs: list[str] = []
    named: list[Allocation | WaitingDeployment] = [*status.allocations, *status.waiting]
    gone = {e.uid: e for e in named if e.uid not in claims}
    for uid, entry in gone.items():
        repairs.append(f"released {entry.namespace}/{entry.name}: the deployment is gone or names another pool")
        status = release(pool, status, uid)
    known = {uid: claim for uid, claim in claims.items() if claim is not None}
    entries: list[Allocation] = []
    dropped: list[str] = []
    for entry in status.allocations:
        claim = known.get(entry.uid)
        who = f"{entry.namespace}/{entry.name}"
        if claim is not None and entry.replicas > claim.replicas:
            repairs.append(f"{who}: {entry.replicas} -> {claim.replicas} replicas (scaled down)")
            dropped += entry.volumes[claim.replicas :]
            entry = entry.model_copy(update={"replicas": claim.replicas, "volumes": entry.volumes[: claim.replicas]})
        if claim is not None and entry.quota > claim.max:
            repairs.append(f"{who}: quota {format_quantity(entry.quota)} -> {format_quantity(claim.max)} (above max)")
            entry = entry.model_copy(update={"quota": claim.max})
        entries.append(entry)

    def floor(entry: Allocation) -> int:
        """Least quota the entry may be shrunk to: its min (its current quota when its spec is unreadable)."""
        claim = known.get(entry.uid)
        return claim.min if claim is not None else entry.quota

    def shrink(target: int, keep: str | None) -> list[Allocation]:
        """Entries with up to `target` bytes taken from those above their min (`keep` is left alone)."""
        nonlocal entries
        result = list(entries)
        order = sorted(range(len(result)), key=lambda i: -(result[i].quota - floor(result[i])))
        for index in order:
            if target <= 0:
                break
            entry = result[index]
            if entry.uid == keep or not entry.replicas:
                continue
            spare = entry.quota - floor(entry)
            if spare <= 0:
                continue
            per_replica = min(spare, -(-target // entry.replicas))
            new_quota = max(_align(entry.quota - per_replica), floor(entry))
            target -= (entry.quota - new_quota) * entry.replicas
            result[index] = entry.model_copy(update={"quota": new_quota})
        return result

    for position, entry in enumerate(entries):
        claim = known.get(entry.uid)
        if claim is None or not entry.replicas or entry.quota >= claim.min:
            continue
        missing = (claim.min - entry.quota) * entry.replicas
        free = pool.spec.capacity - sum(a.allocated for a in entries)
        trial = shrink(missing - max(free, 0), keep=entry.uid) if missing > free else list(entries)
        trial[position] = entry.model_copy(update={"quota": claim.min})
        if sum(a.allocated for a in trial) <= pool.spec.capacity:
            moved = [
                f"{a.namespace}/{a.name} {format_quantity(b.quota)} -> {format_quantity(a.quota)}"
                for a, b in zip(trial, entries)
                if a.quota != b.quota and a.uid != entry.uid
            ]
            repairs.append(
                f"{entry.namespace}/{entry.name}: quota {format_quantity(entry.quota)} -> "
                f"{format_quantity(claim.min)} (below min)" + (f", taking from {', '.join(moved)}" if moved else "")
            )
            entries = trial
    excess = sum(a.allocated for a in entries) - pool.spec.capacity
    if excess > 0:
        trial = shrink(excess, keep=None)
        moved = [
            f"{a.namespace}/{a.name} {format_quantity(b.quota)} -> {format_quantity(a.quota)}"
            for a, b in zip(trial, entries)
            if a.quota != b.quota
        ]
        if moved:
            repairs.append(f"allocations exceeded capacity {format_quantity(pool.spec.capacity)}: {', '.join(moved)}")
            entries = trial
    if not repairs:
        return status, []
    return summarise(
        pool, status.model_copy(update={"allocations": entries, "reclaiming": _reclaim(status, dropped)})
    ), repairs


def _refuse(
    pool: KVPool,
    status: KVPoolStatus,
    others: list[Allocation],
    queue: list[WaitingDeployment],
    existing: Allocation | None,
    claim: Claim,
    message: str,
) -> Admission:
    """No change for an admitted deployment (it keeps what it has, and the reason says what it lacks);
    a new one joins the queue."""
    if existing is not None:
        held = (
            f"; it keeps {format_quantity(existing.quota)} per replica x {existing.replicas} meanwhile"
            if existing.replicas
            else ""
        )
        reason = "BelowMinimum" if existing.quota < claim.min else "InsufficientCapacity"
        return Admission(summarise(pool, status), existing, reason, message + held)
    return _wait(pool, status, others, queue, claim, "InsufficientCapacity", message)


def _wait(
    pool: KVPool,
    status: KVPoolStatus,
    others: list[Allocation],
    queue: list[WaitingDeployment],
    claim: Claim,
    reason: str,
    message: str,
) -> Admission:
    earlier = next((w for w in status.waiting if w.uid == claim.uid), None)
    entry = WaitingDeployment(
        namespace=claim.namespace,
        name=claim.name,
        uid=claim.uid,
        since=claim.created,
        needs=claim.min * claim.replicas,
        passed_over=earlier.passed_over if earlier else 0,
    )
    waiting = sorted([*queue, entry], key=lambda w: (w.since, w.namespace, w.name))
    other_uids = {a.uid for a in others}
    stale = [uuid for a in status.allocations if a.uid not in other_uids for uuid in a.volumes]
    new = summarise(
        pool,
        status.model_copy(update={"allocations": others, "waiting": waiting, "reclaiming": _reclaim(status, stale)}),
    )
    return Admission(new, None, reason, message)
