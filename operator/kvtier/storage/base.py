"""What every pool backend tells the rest of the stack: how a replica's volume is claimed and attached.

Each replica of an InferenceDeployment gets one volume from its pool through the StatefulSet's
volume claim template `kv-store` (so the PVC of ordinal i is `kv-store-<statefulset>-<i>` and
survives pod restarts). Backends differ in where the PersistentVolume comes from (created by
kvtier for a static inventory, provisioned by a CSI driver for a StorageClass) and in whether
the pod sees a block device or a directory; the renderer asks them, and cares about nothing else.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Literal

from kvtier.api.inferencedeployment import InferenceDeployment
from kvtier.api.kvpool import KVPool
from kvtier.api.units import format_quantity

CLAIM_NAME = "kv-store"
#: Device I/O alignment of LMCache's raw-block tiers (`block_align`); quotas and usable sizes are multiples.
BLOCK_ALIGN = 4096
#: Fraction of a Filesystem volume left to the filesystem itself (metadata, reserved blocks); LMCache's
#: pre-sized file never uses it. Volumes are sized up by it, so the quota (up to `max`) always fits.
FILESYSTEM_RESERVE = 0.05


def align_up(value: int, alignment: int = BLOCK_ALIGN) -> int:
    return -(-value // alignment) * alignment


def align_down(value: int, alignment: int = BLOCK_ALIGN) -> int:
    return value // alignment * alignment


def usable_bytes(size: int, volume_mode: Literal["Block", "Filesystem"]) -> int:
    """The one definition of what LMCache may put on a volume of `size` bytes: all of a device,
    a filesystem less its reserve; block-aligned."""
    if volume_mode == "Block":
        return align_down(size)
    return align_down(int(size * (1 - FILESYSTEM_RESERVE)))


def volume_bytes(usable: int, volume_mode: Literal["Block", "Filesystem"]) -> int:
    """The smallest volume whose usable bytes hold `usable` (a Filesystem volume is sized up by the reserve)."""
    if volume_mode == "Block":
        return usable
    size = align_up(math.ceil(usable / (1 - FILESYSTEM_RESERVE)))
    while usable_bytes(size, volume_mode) < usable:
        size += BLOCK_ALIGN
    return size


#: Where a Block volume appears inside the `lmcache` container.
DEVICE_PATH = "/dev/kvtier/kv-store"
#: Where a Filesystem volume is mounted inside the containers that use it.
MOUNT_PATH = "/var/lib/kvtier/kv-store"
#: Pool label on every object kvtier creates for a pool.
POOL_LABEL = "kvtier.io/pool"


def claim_name(statefulset: str, ordinal: int) -> str:
    """The PVC the StatefulSet controller creates for one ordinal from the `kv-store` template."""
    return f"{CLAIM_NAME}-{statefulset}-{ordinal}"


#: On a Filesystem volume, the pre-sized file LMCache's raw_block adapter opens instead of a device.
DEVICE_FILE_NAME = "kv-store.img"


@dataclass(frozen=True)
class Attachment:
    """How a container reaches the replica's volume."""

    volume_mode: Literal["Block", "Filesystem"]

    @property
    def path(self) -> str:
        """The device node (Block) or the mount point (Filesystem)."""
        return DEVICE_PATH if self.volume_mode == "Block" else MOUNT_PATH

    @property
    def device_path(self) -> str:
        """What LMCache's raw_block adapter opens: the device, or a pre-sized file on the filesystem."""
        return DEVICE_PATH if self.volume_mode == "Block" else f"{MOUNT_PATH}/{DEVICE_FILE_NAME}"

    def container_fields(self) -> dict[str, Any]:
        """`volumeDevices` or `volumeMounts` entries for a container spec."""
        if self.volume_mode == "Block":
            return {"volumeDevices": [{"name": CLAIM_NAME, "devicePath": self.path}]}
        return {"volumeMounts": [{"name": CLAIM_NAME, "mountPath": self.path}]}


class StorageBackend(ABC):
    """One kind of pool storage (`spec.storage.<backend>`)."""

    def __init__(self, pool: KVPool):
        self.pool = pool

    @property
    @abstractmethod
    def attachment(self) -> Attachment: ...

    @abstractmethod
    def storage_class_name(self) -> str:
        """StorageClass of the claim template (`""` binds only to PersistentVolumes kvtier made)."""

    def volume_size(self, deployment: InferenceDeployment) -> int:
        """Bytes each replica's volume is requested at: enough for its quota ceiling (`max`) to be usable."""
        storage = deployment.spec.kv_cache.storage
        assert storage is not None, "only deployments with a storage tier get a volume"
        return volume_bytes(storage.effective_max, self.attachment.volume_mode)

    def usable_bytes(self, size: int) -> int:
        """What LMCache may use of one of this backend's volumes of `size` bytes."""
        return usable_bytes(size, self.attachment.volume_mode)

    def claim_template(self, deployment: InferenceDeployment, labels: dict[str, str]) -> dict[str, Any]:
        """The StatefulSet's `volumeClaimTemplates` entry."""
        return {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": CLAIM_NAME, "labels": {**labels, POOL_LABEL: self.pool.metadata.name}},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "volumeMode": self.attachment.volume_mode,
                "storageClassName": self.storage_class_name(),
                "resources": {"requests": {"storage": format_quantity(self.volume_size(deployment))}},
            },
        }
