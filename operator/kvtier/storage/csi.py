"""Dynamic provisioning: the claim template names the pool's StorageClass and the CSI driver does the rest.

Each replica's claim asks for its quota ceiling (`max`): thin-provisioned arrays consume only
what is written, and the quota the rebalancer sets stays within the volume.
"""

from __future__ import annotations

from kvtier.api.kvpool import CSIStorage
from kvtier.storage.base import Attachment, StorageBackend


class CSIBackend(StorageBackend):
    @property
    def spec(self) -> CSIStorage:
        assert self.pool.spec.storage.csi is not None
        return self.pool.spec.storage.csi

    @property
    def attachment(self) -> Attachment:
        return Attachment(self.spec.volume_mode)

    def storage_class_name(self) -> str:
        return self.spec.storage_class_name
