"""An InferenceDeployment's volumes after their creation: what may still change, and how they grow.

A StatefulSet's `volumeClaimTemplates` (like all of its spec but `replicas`, `ordinals`, `template`,
`updateStrategy`, `persistentVolumeClaimRetentionPolicy` and `minReadySeconds`) are fixed when it
is created; the API server refuses any other update with a 422. So the controller:

- keeps the claim templates an existing StatefulSet was created with (`keep_claim_templates`): a
  raised `kvCache.storage.max` never reaches them;
- grows the existing claims instead, on CSI pools whose StorageClass has `allowVolumeExpansion: true`
  (`expand_claims`); elsewhere it says plainly that the volumes stay as they are;
- sizes everything that depends on the volume (the quota cap, a hostPath volume, the pre-sized
  device file) by what the replicas' volumes hold now (`volume_size`), so a quota never exceeds them;
- reports, and leaves alone, a StatefulSet whose fixed parts would have to change for another reason
  (the pool's volume mode, its StorageClass): recreating it automatically would either fail the same
  way or give the pods claims of the wrong kind, so deleting it and its claims (dropping their cached
  KV data) is left to the user, whom the condition tells how.
"""

from __future__ import annotations

import copy
from typing import Any

from kvtier.api.inferencedeployment import InferenceDeployment
from kvtier.api.kvpool import KVPool
from kvtier.api.units import format_quantity, parse_quantity
from kvtier.contract import DEPLOYMENT_LABEL
from kvtier.kube import PERSISTENT_VOLUME_CLAIMS, STORAGECLASSES, KubeClient
from kvtier.storage import CSIBackend, backend_for

#: The parts of a StatefulSet spec kvtier renders that the API server never lets change.
_FIXED = ("serviceName", "podManagementPolicy", "selector")
#: The parts of a claim template that decide what kind of volume the pods get.
_VOLUME_KIND = ("accessModes", "volumeMode", "storageClassName")


async def claims_of(kube: KubeClient, namespace: str, name: str) -> list[dict[str, Any]]:
    """The PersistentVolumeClaims of the deployment's replicas."""
    found = await kube.list(PERSISTENT_VOLUME_CLAIMS, namespace, label_selector=f"{DEPLOYMENT_LABEL}={name}")
    return [c for c in found.get("items", []) if not c["metadata"].get("deletionTimestamp")]


def _requested(claim: dict[str, Any]) -> int:
    return parse_quantity(claim["spec"]["resources"]["requests"]["storage"])


def _capacity(claim: dict[str, Any]) -> int:
    """What the claim's volume holds: `status.capacity` once bound, its request before."""
    status = claim.get("status") or {}
    held = (status.get("capacity") or {}).get("storage") if status.get("phase") == "Bound" else None
    return parse_quantity(held) if held is not None else _requested(claim)


def volume_size(claims: list[dict[str, Any]], statefulset: dict[str, Any] | None) -> int | None:
    """Bytes every replica's volume holds now: the smallest claim's, or the StatefulSet's claim template's
    before any claim exists; None for a StatefulSet still to be created (the pool sizes it)."""
    if claims:
        return min(_capacity(claim) for claim in claims)
    templates = (statefulset or {}).get("spec", {}).get("volumeClaimTemplates") or []
    return min((_requested(t) for t in templates), default=None)


def keep_claim_templates(rendered: dict[str, Any], existing: dict[str, Any]) -> str | None:
    """Give the rendered StatefulSet the existing one's claim templates; the reason when its fixed parts differ."""
    spec, before = rendered["spec"], existing.get("spec") or {}
    changes = [f"{key} {before.get(key)!r} -> {spec.get(key)!r}" for key in _FIXED if spec.get(key) != before.get(key)]
    old = {t["metadata"]["name"]: t["spec"] for t in before.get("volumeClaimTemplates") or []}
    new = {t["metadata"]["name"]: t["spec"] for t in spec.get("volumeClaimTemplates") or []}
    volumes = (
        [f"volume claim templates {sorted(old)} -> {sorted(new)}"]
        if set(old) != set(new)
        else [
            f"{name}.{key} {old[name].get(key)!r} -> {new[name].get(key)!r}"
            for name in sorted(new)
            for key in _VOLUME_KIND
            if new[name].get(key) != old[name].get(key)
        ]
    )
    if changes or volumes:
        name, namespace = existing["metadata"]["name"], existing["metadata"]["namespace"]
        where = "spec.kvCache.storage: " if volumes else ""
        return (
            f"{where}StatefulSet {name} cannot be updated: {'; '.join(volumes + changes)} (Kubernetes allows only "
            f"replicas, template, updateStrategy, ordinals, persistentVolumeClaimRetentionPolicy and minReadySeconds "
            f"to change). Delete it and its claims to have them recreated, dropping their cached KV data: "
            f"kubectl delete statefulset {name} -n {namespace}; "
            f"kubectl delete pvc -n {namespace} -l {DEPLOYMENT_LABEL}={name}"
        )
    if old:
        spec["volumeClaimTemplates"] = [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {
                    k: copy.deepcopy(v)
                    for k, v in template["metadata"].items()
                    if k in ("name", "labels", "annotations")
                },
                "spec": copy.deepcopy(template["spec"]),
            }
            for template in before["volumeClaimTemplates"]
        ]
    return None


async def expand_claims(
    kube: KubeClient, deployment: InferenceDeployment, pool: KVPool, claims: list[dict[str, Any]]
) -> str | None:
    """Grow every claim below the size the pool now gives a replica, where its StorageClass allows that;
    otherwise say why the volumes stay smaller than `max` (the quota stays capped by them)."""
    backend = backend_for(pool)
    wanted = backend.volume_size(deployment)
    short = [claim for claim in claims if _capacity(claim) < wanted]
    if not short:
        return None
    held = format_quantity(min(_capacity(claim) for claim in short))
    grew = f"spec.kvCache.storage.max grew to {format_quantity(wanted)} but the replicas' volumes hold {held}"
    if not isinstance(backend, CSIBackend):
        return (
            f"{grew} and the {pool.spec.storage.backend} volumes of KVPool {pool.metadata.name} cannot be expanded; "
            f"the storage quota stays capped by the volumes"
        )
    class_name = backend.storage_class_name()
    storage_class = await kube.get_or_none(STORAGECLASSES, None, class_name)
    if storage_class is None or storage_class.get("allowVolumeExpansion") is not True:
        return (
            f"{grew} and StorageClass {class_name} does not allow volume expansion (allowVolumeExpansion is not "
            f"true); the storage quota stays capped by the volumes"
        )
    for claim in short:
        if (claim.get("status") or {}).get("phase") == "Bound" and _requested(claim) < wanted:
            await kube.patch(
                PERSISTENT_VOLUME_CLAIMS,
                claim["metadata"]["namespace"],
                claim["metadata"]["name"],
                {"spec": {"resources": {"requests": {"storage": format_quantity(wanted)}}}},
            )
    return None
