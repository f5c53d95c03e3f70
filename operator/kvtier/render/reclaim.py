"""Reclaiming a static volume no deployment uses any more: the claim and the Job that wipe it.

A static PersistentVolume kvtier made (an NVMe-oF namespace, a hostPath directory) is given back
to its pool by its deployment (deleted, or scaled down) with the label `kvtier.io/released`. With
the pool's `volumeReclaim: Wipe`, the KVPool controller re-points the volume's `claimRef` at a
claim of its own in the operator's namespace (`wipe_claim`), runs `wipe_job` on it, and deletes the
PersistentVolume once the Job has succeeded. Everything here is pure: the volume in, objects out.

The Job discards the whole device (`blkdiscard -f`; where the device cannot discard, it is zeroed
with `dd`), so LMCache's raw-block index reloads nothing of the previous tenant; on a Filesystem
volume (hostPath) it deletes everything in the directory, the pre-sized device file included.
"""

from __future__ import annotations

import hashlib
from typing import Any

from kvtier.storage.base import CLAIM_NAME, POOL_LABEL, Attachment

#: On a PersistentVolume its deployment gave back: the pool's controller reclaims it.
RELEASED_LABEL = "kvtier.io/released"
#: On a wipe claim and Job: the PersistentVolume they wipe (names can be longer than a label value).
VOLUME_ANNOTATION = "kvtier.io/volume"
#: Failed wipe pods before the Job gives up (each retry starts the wipe from the beginning).
WIPE_BACKOFF_LIMIT = 2

_BLOCK_WIPE = (
    'blkdiscard -f "$DEVICE" || '
    'dd if=/dev/zero of="$DEVICE" bs=4M count="$(blockdev --getsize64 "$DEVICE")" iflag=count_bytes '
    "oflag=direct conv=fsync status=none"
)
_FILESYSTEM_WIPE = 'find "$DEVICE" -mindepth 1 -delete'


def wipe_name(volume: dict[str, Any]) -> str:
    """Name of the wipe claim and Job of a PersistentVolume (a Job's name must fit a label value)."""
    digest = hashlib.sha256(volume["metadata"]["name"].encode()).hexdigest()[:16]
    return f"kvtier-wipe-{digest}"


def _metadata(volume: dict[str, Any], namespace: str) -> dict[str, Any]:
    labels = {POOL_LABEL: volume["metadata"]["labels"][POOL_LABEL]}
    return {
        "name": wipe_name(volume),
        "namespace": namespace,
        "labels": labels,
        "annotations": {VOLUME_ANNOTATION: volume["metadata"]["name"]},
    }


def wipe_claim(volume: dict[str, Any], namespace: str) -> dict[str, Any]:
    """A claim in the operator's namespace that binds exactly `volume` (whose claimRef is pointed at it)."""
    spec = volume["spec"]
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _metadata(volume, namespace),
        "spec": {
            "accessModes": spec.get("accessModes", ["ReadWriteOnce"]),
            "volumeMode": spec.get("volumeMode", "Filesystem"),
            "storageClassName": spec.get("storageClassName", ""),
            "volumeName": volume["metadata"]["name"],
            "resources": {"requests": {"storage": spec["capacity"]["storage"]}},
        },
    }


def claim_ref(volume: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The `spec.claimRef` that pre-binds `volume` to its wipe claim (no uid: any claim of that name)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "namespace": namespace,
        "name": wipe_name(volume),
        "uid": None,
        "resourceVersion": None,
    }


def wipe_job(volume: dict[str, Any], namespace: str, image: str) -> dict[str, Any]:
    """The Job that wipes `volume` through its wipe claim; it succeeds only if the whole wipe did."""
    attachment = Attachment(volume["spec"].get("volumeMode", "Filesystem"))
    script = _BLOCK_WIPE if attachment.volume_mode == "Block" else _FILESYSTEM_WIPE
    container = {
        "name": "wipe",
        "image": image,
        "command": ["sh", "-ec", script],
        "env": [{"name": "DEVICE", "value": attachment.path}],
        **attachment.container_fields(),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(volume, namespace),
        "spec": {
            "backoffLimit": WIPE_BACKOFF_LIMIT,
            "template": {
                "metadata": {"labels": {POOL_LABEL: volume["metadata"]["labels"][POOL_LABEL]}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [container],
                    "volumes": [{"name": CLAIM_NAME, "persistentVolumeClaim": {"claimName": wipe_name(volume)}}],
                },
            },
        },
    }
