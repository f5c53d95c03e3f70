"""One rebalance round planned as a pure function: the pool, its ledger, its deployments and their demand in;
the loop's decision, each deployment's new per-replica quota and the record to write out.

Everything between bytes and the loop's units lives here: the pool's allocation unit (:func:`pool_unit`),
each deployment's bounds (its `min`/`max`, and what its volume offers LMCache: :func:`members`), the
capacity kept out of the division (what waiting deployments need at their minimum, and what entries
outside the round hold), the `Static` policy's exact requests, and the words that explain a round.
The controller (:mod:`kvtier.controllers.rebalancing`) only reads the cluster, calls :func:`plan_round`,
writes the ledger, actuates and reports.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from kvtier.api.inferencedeployment import InferenceDeployment
from kvtier.api.kvpool import KVPool, KVPoolStatus, QuotaMove, RebalanceRecord
from kvtier.api.units import format_quantity
from kvtier.rebalance.costmodel import known_shape
from kvtier.rebalance.demand import HALF_LIFE_INTERVALS, DemandBook, Geometry
from kvtier.rebalance.loop import Decision, DeploymentState, LoopSettings, decide
from kvtier.render import StorageBinding
from kvtier.render.lmcache import chunk_storage_bytes
from kvtier.render.volumes import kv_volume
from kvtier.storage.ledger import QUOTA_ALIGN

#: A pool is divided in at most about this many units (the allocator's work grows with it).
POOL_UNITS = 4096


def pool_unit(capacity: int) -> int:
    """The pool's allocation unit: a multiple of the quota alignment, about capacity / POOL_UNITS."""
    return max(QUOTA_ALIGN, math.ceil(capacity / POOL_UNITS / QUOTA_ALIGN) * QUOTA_ALIGN)


@dataclass(frozen=True)
class Member:
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

    @property
    def label(self) -> str:
        return f"{self.key[0]}/{self.key[1]}"


def members(pool: KVPool, status: KVPoolStatus, deployments: Iterable[Mapping[str, Any]]) -> list[Member]:
    """The admitted deployments that take part in the round (not those being deleted, scaled to zero,
    without storage or whose spec does not parse: their entries are held out of the division)."""
    found = []
    namespaces = {ns.uuid: ns for ns in pool.spec.storage.nvmeof.namespaces} if pool.spec.storage.nvmeof else {}
    by_uid = {deployment["metadata"].get("uid"): deployment for deployment in deployments}
    for allocation in status.allocations:
        body = by_uid.get(allocation.uid)
        if allocation.replicas < 1 or body is None or body["metadata"].get("deletionTimestamp"):
            continue
        try:
            deployment = InferenceDeployment.model_validate(body)
        except ValueError:  # pydantic's ValidationError: the deployment's own reconcile reports it
            continue
        storage = deployment.spec.kv_cache.storage
        if storage is None:
            continue
        # What a replica can hold: `max`, and what its volume offers LMCache (the same cap the
        # InferenceDeployment controller applies when it sets the quota each resync).
        binding = StorageBinding(
            quota=storage.effective_max, namespaces=tuple(namespaces[u] for u in allocation.volumes if u in namespaces)
        )
        cap = kv_volume(deployment, pool, binding).quota
        found.append(
            Member(
                allocation.uid,
                dict(body),
                deployment,
                allocation.replicas,
                allocation.quota,
                cap,
                min(storage.request, cap),
            )
        )
    return found


def units_held(member: Member, unit: int) -> int:
    """What a deployment holds, in units rounded up: a deployment kept as it is never takes more bytes
    than its units, so the units adding up to the capacity means the bytes do too."""
    return -(-member.quota * member.replicas // unit)


def per_replica_quota(units: int, unit: int, member: Member) -> int:
    """A deployment's total units as a per-replica quota: aligned down, within its bounds."""
    storage = member.deployment.spec.kv_cache.storage
    assert storage is not None  # members() keeps only deployments with storage
    if units == units_held(member, unit):
        return member.quota  # unchanged: no rounding drift
    quota = units * unit // member.replicas // QUOTA_ALIGN * QUOTA_ALIGN
    return max(min(quota, member.cap), min(storage.effective_min, member.cap))


def _state(
    book: DemandBook, member: Member, unit: int, capacity_units: int, settings: LoopSettings, now: float
) -> DeploymentState:
    spec = member.deployment.spec
    storage = spec.kv_cache.storage
    assert storage is not None  # members() keeps only deployments with storage
    chunk = chunk_storage_bytes(member.deployment)
    cpu = spec.kv_cache.cpu.size if spec.kv_cache.cpu is not None else 0
    geometry = Geometry(
        unit_bytes=unit, chunk_bytes=chunk, chunk_tokens=spec.kv_cache.chunk_size, front_chunks=cpu / chunk
    )
    estimate = book.estimate(
        member.key,
        now,
        replicas=member.replicas,
        units=capacity_units,
        geometry=geometry,
        half_life_seconds=HALF_LIFE_INTERVALS * settings.interval_seconds,
    )
    current = units_held(member, unit)
    return DeploymentState(
        current=current,
        estimate=estimate,
        weight=storage.weight,
        min_units=min(math.ceil(storage.effective_min * member.replicas / unit), current),
        max_units=max(member.cap * member.replicas // unit, current),
        request_units=-(-member.request * member.replicas // unit),
        unit_tokens=unit / chunk * spec.kv_cache.chunk_size,
    )


@dataclass(frozen=True)
class RoundPlan:
    """A round's decision and what follows from it, in bytes."""

    decision: Decision
    settings: LoopSettings
    members: dict[str, Member]
    """By `namespace/name`."""
    quotas: dict[str, int]
    """Every member's per-replica quota after the round (its current one where it does not move)."""
    record: RebalanceRecord | None
    """What to write to `status.lastRebalance` and explain; None when nothing is to be applied or reported."""

    @property
    def moves(self) -> list[QuotaMove]:
        return self.record.moves if self.record is not None else []


def plan_round(
    pool: KVPool,
    status: KVPoolStatus,
    deployments: Iterable[Mapping[str, Any]],
    book: DemandBook,
    now: float,
    last_move: float | None,
    decided_at: datetime,
) -> RoundPlan | None:
    """Plan one round for `pool` (its ledger `status`, the `deployments` that name it); None when no
    admitted deployment takes part. `last_move` is the time of the pool's last applied move."""
    in_round = members(pool, status, deployments)
    if not in_round:
        return None
    unit = pool_unit(pool.spec.capacity)
    settings = LoopSettings.from_spec(pool.spec.rebalance)
    # Kept out of the division: what waiting deployments need at their minimum, and what entries
    # outside the round hold (deployments being deleted, scaled to zero, or not parseable).
    reserved = sum(w.needs for w in status.waiting)
    uids = {m.uid for m in in_round}
    held = sum(a.allocated for a in status.allocations if a.uid not in uids)
    capacity_units = max(pool.spec.capacity - reserved - held, 0) // unit
    by_label = {m.label: m for m in in_round}
    states = {label: _state(book, m, unit, capacity_units, settings, now) for label, m in by_label.items()}
    values = hit_values(by_label, states)
    if values is not None:
        states = {label: replace(state, hit_value=values[label]) for label, state in states.items()}
    decision = decide(states, capacity_units, settings, now, last_move)
    if settings.policy == "Static":  # exactly the requests, not their rounding to units
        quotas = {
            label: m.request if decision.proposed[label] != units_held(m, unit) else m.quota
            for label, m in by_label.items()
        }
    else:
        quotas = {label: per_replica_quota(decision.proposed[label], unit, m) for label, m in by_label.items()}
    moves = [
        QuotaMove(namespace=m.key[0], name=m.key[1], from_quota=m.quota, to_quota=quotas[label])
        for label, m in by_label.items()
        if quotas[label] != m.quota
    ]
    record = None
    if moves and decision.outcome in ("moved", "static", "dry-run"):
        moved_bytes = sum(
            max(0, move.to_quota - move.from_quota) * by_label[f"{move.namespace}/{move.name}"].replicas
            for move in moves
        )
        gain = decision.predicted_gain if math.isfinite(decision.predicted_gain) else 1.0
        record = RebalanceRecord(
            time=decided_at,
            moved_bytes=moved_bytes,
            predicted_gain=gain,
            reason=explain(decision, settings, valued=values is not None),
            dry_run=decision.outcome == "dry-run",
            moves=moves,
        )
    else:  # nothing is applied: the quotas stay
        quotas = {label: m.quota for label, m in by_label.items()}
    return RoundPlan(decision, settings, by_label, quotas, record)


def hit_values(members: Mapping[str, Member], states: Mapping[str, DeploymentState]) -> dict[str, float] | None:
    """What a storage hit token of each deployment is worth, relative to the pool's mean: the prefill
    FLOPs it saves (its model's shape, its mean prompt), so a deep hit of a long-context deployment
    counts more. None (every hit token alike) unless every deployment that takes part runs a model
    of :data:`~kvtier.rebalance.costmodel.KNOWN_MODELS` whose shape matches its spec, with a known
    mean prompt: values in two units would not compare."""
    flops = {}
    for label, state in states.items():
        if state.frozen:
            continue
        model = members[label].deployment.spec.model
        shape = known_shape(model.name)
        arch = model.architecture
        if shape is None or (
            arch is not None
            and (arch.layers, arch.kv_heads, arch.head_dim) != (shape.layers, shape.kv_heads, shape.head_dim)
        ):
            return None
        assert state.estimate is not None  # not frozen
        if state.estimate.mean_prompt_tokens <= 0:
            return None
        flops[label] = shape.hit_token_flops(state.estimate.mean_prompt_tokens)
    if not flops:
        return None
    mean = sum(flops.values()) / len(flops)
    return {label: flops.get(label, mean) / mean for label in states}


def explain(decision: Decision, settings: LoopSettings, valued: bool = False) -> str:
    """Why the round moved, in the spec's terms (the loop's own reason counts internal units); ``valued``:
    hit tokens were weighed by the prefill they save (:func:`hit_values`)."""
    if decision.outcome == "static":
        why = "policy Static: every deployment back to its request"
    elif settings.policy == "Proportional":
        why = "policy Proportional: shares by weight x access rate"
    else:
        why = f"predicted storage-tier hits {_rate(decision.value_before)} -> {_rate(decision.value_after)} tokens/s"
        if valued:
            why += " (each weighed by the prefill it saves, relative to the pool's mean)"
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


def summary(record: RebalanceRecord) -> str:
    """The pool's Event for a round: what moved (or would have), each quota before and after, and why."""
    moves = ", ".join(
        f"{m.namespace}/{m.name} {format_quantity(m.from_quota)}->{format_quantity(m.to_quota)}" for m in record.moves
    )
    prefix = "dry run: would move" if record.dry_run else "moved"
    return f"{prefix} {format_quantity(record.moved_bytes)} (per-replica quotas {moves}): {record.reason}"
