"""The capacity planner's live source: every KVPool and its deployments' demand curves as the operator publishes them.

The curves are read from each InferenceDeployment's ``status.kv`` (``demand``: up to 16 points of the
share of lookups an LRU of a capacity per replica would hit, from the probes; ``promptTokensPerSecond``),
which the chart's RBAC lets any reader of the kvtier resources see; no operator endpoint is needed. A
live pool is planned in blocks of :data:`LIVE_BLOCK_BYTES`. What the curves cannot give: TTFT (there
are no requests to queue), the busiest minute's reads (the mean rate only), and the attention term of
the GPU seconds a hit saves (prompt lengths are not published: a hit token is valued at the cost
model's first-token prefill time, a lower bound).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from kvtier.api.inferencedeployment import InferenceDeployment
from kvtier.api.kvpool import KVPool
from kvtier.kube import INFERENCEDEPLOYMENTS, KVPOOLS, KubeClient
from kvtier.rebalance.costmodel import CostModel
from kvtier.rebalance.planner import CurveProfile

#: Bytes of the blocks a live pool is planned in.
LIVE_BLOCK_BYTES = 2**20
#: The cost model preset a hit token is valued with (`kvtier plan --cost-model`'s default; the operator's).
DEFAULT_COST_MODEL = "llama-3-70b-4xh100"


@dataclass(frozen=True)
class LivePool:
    name: str
    capacity_bytes: int
    read_bandwidth: float | None
    """``spec.readBandwidth`` (what one replica reads) x the planned deployments' replicas; None: not set."""
    profiles: list[CurveProfile]
    without_curve: list[str] = field(default_factory=list)
    """Deployments on the pool that publish no demand curve yet (left out of the plan), with why."""

    @property
    def capacity_blocks(self) -> int:
        return self.capacity_bytes // LIVE_BLOCK_BYTES


def live_pools(
    pools: Iterable[Mapping[str, Any]], deployments: Iterable[Mapping[str, Any]], cost: CostModel
) -> list[LivePool]:
    """Pools and their deployments' curves from the objects' bodies (pure); unparseable objects are skipped."""
    by_pool: dict[str, list[InferenceDeployment]] = {}
    for body in deployments:
        try:
            deployment = InferenceDeployment.model_validate(body)
        except ValidationError:
            continue
        storage = deployment.spec.kv_cache.storage if deployment.spec.kv_cache else None
        if storage is not None:
            by_pool.setdefault(storage.pool_ref, []).append(deployment)
    result = []
    for body in pools:
        try:
            pool = KVPool.model_validate(body)
        except ValidationError:
            continue
        profiles, without = [], []
        pool_name = pool.metadata.name or ""  # a parsed pool has its name; this satisfies the type
        for deployment in sorted(
            by_pool.get(pool_name, []), key=lambda d: (d.metadata.namespace or "", d.metadata.name)
        ):
            name = f"{deployment.metadata.namespace}/{deployment.metadata.name}"
            profile = _profile(name, deployment, cost)
            if isinstance(profile, str):
                without.append(f"{name}: {profile}")
            else:
                profiles.append(profile)
        replicas = sum(profile.replicas for profile in profiles)
        bandwidth = None if pool.spec.read_bandwidth is None else float(pool.spec.read_bandwidth) * replicas
        result.append(LivePool(pool_name, pool.spec.capacity, bandwidth, profiles, without))
    return result


def _profile(name: str, deployment: InferenceDeployment, cost: CostModel) -> CurveProfile | str:
    """The deployment's curve profile, or why it has none."""
    kv = deployment.status.kv if deployment.status else None
    if kv is None or kv.demand is None or not kv.demand.points:
        return "no status.kv.demand yet (the probe publishes it once lookups arrive)"
    if not kv.prompt_tokens_per_second:
        return "no status.kv.promptTokensPerSecond yet"
    spec = deployment.spec
    kv_bytes = spec.model.bytes_per_token
    scale = 1 if kv.demand.unit == "bytes" else spec.kv_cache.chunk_size * kv_bytes
    storage = spec.kv_cache.storage
    assert storage is not None  # live_pools groups only deployments with a storage tier
    replicas = max(1, spec.replicas)
    return CurveProfile(
        name=name,
        points=[(point.capacity * scale, point.hit_ratio) for point in kv.demand.points],
        replicas=replicas,
        prompt_tokens_per_second=kv.prompt_tokens_per_second,
        kv_bytes_per_token=kv_bytes,
        block_bytes=LIVE_BLOCK_BYTES,
        saved_per_hit_token=cost.prefill_seconds(0, 1),
        weight=storage.weight,
        min_blocks=-(-storage.effective_min * replicas // LIVE_BLOCK_BYTES),
        max_blocks=storage.effective_max * replicas // LIVE_BLOCK_BYTES,
    )


async def read_live_pools(kube: KubeClient, cost: CostModel) -> list[LivePool]:
    """Every KVPool in the cluster with its deployments' published curves."""
    pools = await kube.list(KVPOOLS)
    deployments = await kube.list(INFERENCEDEPLOYMENTS)
    return live_pools(pools.get("items", []), deployments.get("items", []), cost)
