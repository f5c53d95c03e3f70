"""The storage tier of one deployment as rendered: its pool's backend, the ledger's binding, the volume.

Which namespace of a static pool serves which replica, and how much each replica may use, is the
pool ledger's decision (the KVPool controller). The renderer takes it as a `StorageBinding`;
`default_binding` stands in for the ledger when rendering offline (`kvtier render`): every replica
starts at `request`, and static namespaces go to ordinals in the pool's spec order.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from kvtier.api.inferencedeployment import InferenceDeployment
from kvtier.api.kvpool import KVPool, NVMeoFNamespace
from kvtier.render.errors import InsufficientCapacity
from kvtier.render.meta import cluster_labels, name_of, namespace_of
from kvtier.storage import Attachment, HostPathBackend, NVMeoFBackend, StorageBackend, backend_for, claim_name
from kvtier.storage.base import BLOCK_ALIGN, align_down, align_up  # noqa: F401 - render's alignment is storage's


@dataclass(frozen=True)
class StorageBinding:
    """What the pool's ledger granted one deployment."""

    quota: int
    """Per-replica storage quota in bytes (in-process modes size LMCache's disk tier by it)."""
    namespaces: tuple[NVMeoFNamespace, ...] = ()
    """Static NVMe-oF pools: the array namespace bound to each ordinal, in ordinal order."""
    volume_size: int | None = None
    """Bytes the replicas' existing volumes hold, when known (a StatefulSet keeps the claim size it was
    created with until its claims are expanded); caps the volume the pool would size now."""


def default_binding(deployment: InferenceDeployment, pool: KVPool, taken: Collection[str] = ()) -> StorageBinding:
    """The offline stand-in for the ledger: quota = `request`; free namespaces (uuids not in `taken`) in spec order."""
    storage = deployment.spec.kv_cache.storage
    assert storage is not None, "only deployments with a storage tier are bound"
    nvmeof = pool.spec.storage.nvmeof
    if nvmeof is None:
        return StorageBinding(quota=storage.request)
    free = tuple(ns for ns in nvmeof.namespaces if ns.uuid not in taken)
    replicas = deployment.spec.replicas
    if len(free) < replicas:
        raise InsufficientCapacity(
            f"KVPool {pool.metadata.name} has {len(free)} free NVMe-oF namespaces, "
            f"{name_of(deployment)} needs one per replica ({replicas})",
            field="spec.replicas",
        )
    return StorageBinding(quota=storage.request, namespaces=free[:replicas])


@dataclass(frozen=True)
class KVVolume:
    """One deployment's storage tier: the same on every replica."""

    pool: KVPool
    backend: StorageBackend
    binding: StorageBinding
    size: int
    """Bytes of each replica's volume: its claim's request, or less when the existing volumes are smaller."""

    @property
    def attachment(self) -> Attachment:
        return self.backend.attachment

    @property
    def rebalanced(self) -> bool:
        """Whether the pool moves quotas from measured demand (and so wants the probe's curves)."""
        return self.pool.spec.rebalance.policy != "Static"

    @property
    def usable_bytes(self) -> int:
        """Bytes LMCache may put on the volume (`kvtier.storage.base.usable_bytes`)."""
        return self.backend.usable_bytes(self.size)

    @property
    def quota(self) -> int:
        """The binding's quota, block-aligned and never more than the volume holds."""
        return align_down(min(self.binding.quota, self.usable_bytes))


def kv_volume(deployment: InferenceDeployment, pool: KVPool, binding: StorageBinding | None) -> KVVolume:
    backend = backend_for(pool)
    binding = binding or default_binding(deployment, pool)
    size = backend.volume_size(deployment)
    return KVVolume(
        pool=pool,
        backend=backend,
        binding=binding,
        size=size if binding.volume_size is None else min(size, binding.volume_size),
    )


def persistent_volumes(deployment: InferenceDeployment, volume: KVVolume) -> list[dict[str, Any]]:
    """The PersistentVolumes of a static pool, one per ordinal, pre-bound to that ordinal's claim."""
    volumes = _static_volumes(deployment, volume)
    for pv in volumes:
        pv["metadata"]["labels"] = {**cluster_labels(deployment), **pv["metadata"]["labels"]}
    return volumes


def _static_volumes(deployment: InferenceDeployment, volume: KVVolume) -> list[dict[str, Any]]:
    namespace, statefulset = namespace_of(deployment), name_of(deployment)
    claims = [claim_name(statefulset, ordinal) for ordinal in range(deployment.spec.replicas)]
    backend = volume.backend
    if isinstance(backend, NVMeoFBackend):
        if len(volume.binding.namespaces) < len(claims):
            raise InsufficientCapacity(
                f"the binding names {len(volume.binding.namespaces)} NVMe-oF namespaces for {len(claims)} replicas",
                field="spec.replicas",
            )
        return [backend.persistent_volume(ns, namespace, claim) for ns, claim in zip(volume.binding.namespaces, claims)]
    if isinstance(backend, HostPathBackend):
        return [backend.persistent_volume(namespace, claim, volume.size) for claim in claims]
    return []
