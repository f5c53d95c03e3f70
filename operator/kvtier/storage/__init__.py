"""Pool backends: static NVMe-oF namespaces, a dynamic CSI StorageClass, or a host path (development)."""

from kvtier.api.kvpool import KVPool
from kvtier.storage.base import CLAIM_NAME, DEVICE_PATH, MOUNT_PATH, Attachment, StorageBackend, claim_name
from kvtier.storage.csi import CSIBackend
from kvtier.storage.hostpath import HostPathBackend
from kvtier.storage.nvmeof import NVMeoFBackend

_BACKENDS: dict[str, type[StorageBackend]] = {
    "nvmeof": NVMeoFBackend,
    "csi": CSIBackend,
    "hostPath": HostPathBackend,
}


def backend_for(pool: KVPool) -> StorageBackend:
    """The backend of the pool's single `spec.storage` entry."""
    return _BACKENDS[pool.spec.storage.backend](pool)


__all__ = [
    "CLAIM_NAME",
    "DEVICE_PATH",
    "MOUNT_PATH",
    "Attachment",
    "CSIBackend",
    "HostPathBackend",
    "NVMeoFBackend",
    "StorageBackend",
    "backend_for",
    "claim_name",
]
