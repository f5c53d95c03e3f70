"""Volumes: the PV/PVC binder (kube-controller-manager) and a stand-in for a CSI driver's
external provisioner and resizer (which no real control plane here runs)."""

from __future__ import annotations

import logging
from typing import Any

from kvtier.api.units import quantity_value
from kvtier.kube import PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES, STORAGECLASSES, APIError, KubeClient
from kvtier.testing.podsim.objects import isolated

log = logging.getLogger(__name__)


class VolumeControllers:
    """Binding, provisioning, reclaiming and expanding volumes."""

    kube: KubeClient

    async def _bind_volumes(self, *, provision: bool = True) -> None:
        """The binder (with `provision`, dynamic provisioning for existing StorageClasses too)."""
        claims = (await self.kube.list(PERSISTENT_VOLUME_CLAIMS))["items"]
        volumes = (await self.kube.list(PERSISTENT_VOLUMES))["items"]
        classes = {c["metadata"]["name"]: c for c in (await self.kube.list(STORAGECLASSES))["items"]}
        for claim in claims:
            if (claim.get("status") or {}).get("phase") == "Bound" or claim["metadata"].get("deletionTimestamp"):
                continue
            volume = self._matching_volume(claim, volumes)
            if volume is None and provision and claim["spec"].get("storageClassName") in classes:
                try:
                    volume = await self._provision(claim, classes[claim["spec"]["storageClassName"]])
                except APIError as error:
                    log.debug("cannot provision for %s: %s", claim["metadata"]["name"], error)
                    continue
                volumes.append(volume)
            if volume is not None:
                await isolated(claim, self._bind(claim, volume))
        await self._set_volume_phases()
        await self._resize_volumes()

    async def provision_for_binder(self) -> None:
        """A CSI driver's external provisioner and resizer, beside a real PV controller that binds.

        Provisions a PV (its `claimRef` naming the claim) for each pending claim the PV controller
        handed to an external provisioner (`volume.kubernetes.io/storage-provisioner`), once a node is
        selected when the class waits for the first consumer; deletes Released CSI volumes whose
        reclaim policy is Delete; expands claims whose request grew.
        """
        claims = (await self.kube.list(PERSISTENT_VOLUME_CLAIMS))["items"]
        volumes = (await self.kube.list(PERSISTENT_VOLUMES))["items"]
        classes = {c["metadata"]["name"]: c for c in (await self.kube.list(STORAGECLASSES))["items"]}
        claimed = {(v["spec"].get("claimRef") or {}).get("uid") for v in volumes}
        for claim in claims:
            annotations = claim["metadata"].get("annotations") or {}
            storage_class = classes.get(claim["spec"].get("storageClassName") or "")
            if (
                (claim.get("status") or {}).get("phase") == "Bound"
                or claim["metadata"].get("deletionTimestamp")
                or claim["metadata"]["uid"] in claimed
                or storage_class is None
                or annotations.get("volume.kubernetes.io/storage-provisioner") != storage_class["provisioner"]
            ):
                continue
            if (
                storage_class.get("volumeBindingMode") == "WaitForFirstConsumer"
                and "volume.kubernetes.io/selected-node" not in annotations
            ):
                continue
            await isolated(claim, self._provision(claim, storage_class, claim_ref=True))
        for volume in volumes:
            if (
                (volume.get("status") or {}).get("phase") == "Released"
                and volume["spec"].get("csi")
                and volume["spec"].get("persistentVolumeReclaimPolicy") == "Delete"
            ):
                await isolated(volume, self.kube.delete(PERSISTENT_VOLUMES, None, volume["metadata"]["name"]))
        await self._resize_volumes()

    async def _resize_volumes(self) -> None:
        """Grow the PV and `status.capacity` of every bound claim whose request outgrew them."""
        for claim in (await self.kube.list(PERSISTENT_VOLUME_CLAIMS))["items"]:
            status = claim.get("status") or {}
            wanted = claim["spec"].get("resources", {}).get("requests", {}).get("storage")
            have = (status.get("capacity") or {}).get("storage")
            if (
                status.get("phase") != "Bound"
                or wanted is None
                or have is None
                or quantity_value(str(wanted)) <= quantity_value(str(have))
            ):
                continue
            volume = claim["spec"].get("volumeName")
            if volume:
                await isolated(
                    claim,
                    self.kube.patch(PERSISTENT_VOLUMES, None, volume, {"spec": {"capacity": {"storage": wanted}}}),
                )
            await isolated(
                claim,
                self.kube.patch(
                    PERSISTENT_VOLUME_CLAIMS,
                    claim["metadata"]["namespace"],
                    claim["metadata"]["name"],
                    {"status": {"capacity": {"storage": wanted}}},
                    subresource="status",
                ),
            )

    async def _set_volume_phases(self) -> None:
        """Bound while the claim it names exists, then Released (Retain) or deleted (Delete); else Available."""
        claim_uids = {c["metadata"]["uid"] for c in (await self.kube.list(PERSISTENT_VOLUME_CLAIMS))["items"]}
        for volume in (await self.kube.list(PERSISTENT_VOLUMES))["items"]:
            name, claim_uid = volume["metadata"]["name"], (volume["spec"].get("claimRef") or {}).get("uid")
            if claim_uid is None:
                phase = "Available"
            elif claim_uid in claim_uids:
                phase = "Bound"
            elif volume["spec"].get("persistentVolumeReclaimPolicy") == "Delete":
                await isolated(volume, self.kube.delete(PERSISTENT_VOLUMES, None, name))
                continue
            else:
                phase = "Released"
            if (volume.get("status") or {}).get("phase") != phase:
                await isolated(
                    volume,
                    self.kube.patch(PERSISTENT_VOLUMES, None, name, {"status": {"phase": phase}}, subresource="status"),
                )

    @staticmethod
    def _matching_volume(claim: dict[str, Any], volumes: list[dict[str, Any]]) -> dict[str, Any] | None:
        name, namespace = claim["metadata"]["name"], claim["metadata"]["namespace"]
        spec = claim["spec"]
        wanted = quantity_value(str(spec.get("resources", {}).get("requests", {}).get("storage", "0")))
        mode = spec.get("volumeMode", "Filesystem")

        def fits(volume: dict[str, Any]) -> bool:
            capacity = quantity_value(str(volume["spec"].get("capacity", {}).get("storage", "0")))
            return capacity >= wanted and volume["spec"].get("volumeMode", "Filesystem") == mode

        for volume in volumes:
            ref = volume["spec"].get("claimRef") or {}
            if (ref.get("name"), ref.get("namespace")) == (name, namespace) and ref.get("uid") in (
                None,
                claim["metadata"]["uid"],
            ):
                return volume if fits(volume) else None
        if spec.get("volumeName"):
            return next((v for v in volumes if v["metadata"]["name"] == spec["volumeName"] and fits(v)), None)
        selector = (spec.get("selector") or {}).get("matchLabels") or {}
        for volume in sorted(volumes, key=lambda v: v["metadata"]["name"]):
            labels = volume["metadata"].get("labels") or {}
            if (
                not volume["spec"].get("claimRef")
                and volume["spec"].get("storageClassName", "") == spec.get("storageClassName", "")
                and all(labels.get(k) == v for k, v in selector.items())
                and fits(volume)
            ):
                return volume
        return None

    async def _provision(
        self, claim: dict[str, Any], storage_class: dict[str, Any], *, claim_ref: bool = False
    ) -> dict[str, Any]:
        """A PV for the claim (`claim_ref`: pre-bound to it, as an external provisioner creates them)."""
        spec = claim["spec"]
        volume = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {
                "name": f"pvc-{claim['metadata']['uid']}",
                "annotations": {"pv.kubernetes.io/provisioned-by": storage_class["provisioner"]},
            },
            "spec": {
                "capacity": {"storage": spec["resources"]["requests"]["storage"]},
                "accessModes": spec.get("accessModes", ["ReadWriteOnce"]),
                "volumeMode": spec.get("volumeMode", "Filesystem"),
                "storageClassName": storage_class["metadata"]["name"],
                "persistentVolumeReclaimPolicy": storage_class.get("reclaimPolicy", "Delete"),
                "csi": {"driver": storage_class["provisioner"], "volumeHandle": claim["metadata"]["uid"]},
            },
        }
        if claim_ref:
            volume["spec"]["claimRef"] = {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": claim["metadata"]["namespace"],
                "name": claim["metadata"]["name"],
                "uid": claim["metadata"]["uid"],
            }
        return await self.kube.create(PERSISTENT_VOLUMES, volume)

    async def _bind(self, claim: dict[str, Any], volume: dict[str, Any]) -> None:
        name, namespace = claim["metadata"]["name"], claim["metadata"]["namespace"]
        claim_ref = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "namespace": namespace,
            "name": name,
            "uid": claim["metadata"]["uid"],
        }
        volume_name = volume["metadata"]["name"]
        await self.kube.patch(PERSISTENT_VOLUMES, None, volume_name, {"spec": {"claimRef": claim_ref}})
        await self.kube.patch(PERSISTENT_VOLUME_CLAIMS, namespace, name, {"spec": {"volumeName": volume_name}})
        status = {
            "phase": "Bound",
            "accessModes": volume["spec"].get("accessModes"),
            "capacity": volume["spec"].get("capacity"),
        }
        await self.kube.patch(PERSISTENT_VOLUME_CLAIMS, namespace, name, {"status": status}, subresource="status")
