"""Static NVMe-oF inventory: kvtier creates one PersistentVolume per bound namespace.

Rendered for kubernetes-csi/csi-driver-nvmf (`csi.nvmf.com`) as its node plugin reads them:
`volumeHandle` is the namespace UUID, `volumeAttributes` carry `targetTrAddr`, `targetTrPort`,
`targetTrType`, `nqn`, `deviceUUID` and `hostNqn`. That driver connects one path (the first
target), has no ctrl-loss, queue or DH-HMAC-CHAP options, and disconnects by NQN (so use one
subsystem per namespace). For any other driver named in `spec.storage.nvmeof.driver`, the same
attributes are written and `auth.secretRef` is passed as the CSI `nodeStageSecretRef`, the
standard place a node plugin receives secrets; the secret's content is never read by kvtier.
"""

from __future__ import annotations

from typing import Any

from kvtier.api.inferencedeployment import InferenceDeployment
from kvtier.api.kvpool import NVMeoFNamespace, NVMeoFStorage
from kvtier.api.units import format_quantity
from kvtier.storage.base import POOL_LABEL, Attachment, StorageBackend

NVMF_DRIVER = "csi.nvmf.com"


def persistent_volume_name(pool: str, uuid: str) -> str:
    """The PersistentVolume of the array namespace `uuid` in `pool` (the ledger names namespaces by uuid)."""
    return f"kvtier-{pool}-{uuid.lower()}"


class NVMeoFBackend(StorageBackend):
    @property
    def spec(self) -> NVMeoFStorage:
        assert self.pool.spec.storage.nvmeof is not None
        return self.pool.spec.storage.nvmeof

    @property
    def attachment(self) -> Attachment:
        return Attachment("Block")

    def storage_class_name(self) -> str:
        return ""

    def volume_size(self, deployment: InferenceDeployment) -> int:
        # A claim binds only to a volume at least as large as its request: ask for no more than the
        # smallest namespace; the namespace actually bound caps the replica's quota.
        return min(super().volume_size(deployment), min(ns.size for ns in self.spec.namespaces))

    def unsupported_options(self) -> list[str]:
        """Options of the pool that its driver will not apply (reported in a condition, not rejected)."""
        if self.spec.driver != NVMF_DRIVER:
            return []
        ignored = []
        if len(self.spec.targets) > 1:
            ignored.append(f"targets beyond the first ({NVMF_DRIVER} connects one path, no multipath)")
        if self.spec.connect is not None:
            ignored.append(f"connect options ({NVMF_DRIVER} has no ctrl-loss, reconnect or queue settings)")
        if self.spec.auth is not None:
            ignored.append(f"auth ({NVMF_DRIVER} cannot do DH-HMAC-CHAP)")
        return ignored

    def persistent_volume(self, namespace: NVMeoFNamespace, claim_namespace: str, claim: str) -> dict[str, Any]:
        """The PersistentVolume binding one array namespace to one replica's claim."""
        target = self.spec.targets[0]
        attributes = {
            "targetTrAddr": target.address,
            "targetTrPort": str(target.port),
            "targetTrType": self.spec.transport,
            "nqn": namespace.nqn,
            "deviceUUID": namespace.uuid,
        }
        if self.spec.host_nqn:
            attributes["hostNqn"] = self.spec.host_nqn
        csi: dict[str, Any] = {
            "driver": self.spec.driver,
            "volumeHandle": namespace.uuid,
            "volumeAttributes": attributes,
        }
        if self.spec.auth is not None and self.spec.driver != NVMF_DRIVER:
            ref = self.spec.auth.secret_ref
            csi["nodeStageSecretRef"] = {"name": ref.name, "namespace": ref.namespace}
        pool = self.pool.metadata.name or ""  # a parsed pool always has its name; this satisfies the type
        return {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": persistent_volume_name(pool, namespace.uuid), "labels": {POOL_LABEL: pool}},
            "spec": {
                "capacity": {"storage": format_quantity(namespace.size)},
                "accessModes": ["ReadWriteOnce"],
                "volumeMode": "Block",
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "claimRef": {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "namespace": claim_namespace,
                    "name": claim,
                },
                "csi": csi,
            },
        }
