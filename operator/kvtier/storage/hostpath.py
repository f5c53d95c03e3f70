"""Development pools (kind, the embedded cluster): one directory per replica under the pool's host path.

kvtier creates a hostPath PersistentVolume per replica, pre-bound to the replica's claim, so the
StatefulSet sees the same `kv-store` claim as with an array. hostPath volumes are Filesystem
only: LMCache's raw_block adapter then works on a pre-sized file in that directory.
"""

from __future__ import annotations

from typing import Any

from kvtier.api.kvpool import HostPathStorage
from kvtier.api.units import format_quantity
from kvtier.storage.base import POOL_LABEL, Attachment, StorageBackend


class HostPathBackend(StorageBackend):
    @property
    def spec(self) -> HostPathStorage:
        assert self.pool.spec.storage.host_path is not None
        return self.pool.spec.storage.host_path

    @property
    def attachment(self) -> Attachment:
        return Attachment("Filesystem")

    def storage_class_name(self) -> str:
        return ""

    def persistent_volume(self, claim_namespace: str, claim: str, size: int) -> dict[str, Any]:
        pool = self.pool.metadata.name
        return {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"kvtier-{pool}-{claim_namespace}-{claim}", "labels": {POOL_LABEL: pool}},
            "spec": {
                "capacity": {"storage": format_quantity(size)},
                "accessModes": ["ReadWriteOnce"],
                "volumeMode": "Filesystem",
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "claimRef": {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "namespace": claim_namespace,
                    "name": claim,
                },
                "hostPath": {
                    "path": f"{self.spec.path.rstrip('/')}/{claim_namespace}/{claim}",
                    "type": "DirectoryOrCreate",
                },
            },
        }
