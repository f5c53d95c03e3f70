"""Defaults the real API server fills into built-in objects on every write (and the empty values it drops).

Only the defaults operators and `kubectl` commonly observe are applied: pod specs (also inside
workload templates), containers, services, workloads, volumes and claims.  Values follow
`pkg/apis/*/v1/defaults.go`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _container(container: dict[str, Any]) -> None:
    image = container.get("image") or ""
    tag = image.rsplit("/", 1)[-1]
    latest = "@" not in image and (":" not in tag or tag.endswith(":latest"))
    container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    for port in container.get("ports") or []:
        if isinstance(port, dict):
            port.setdefault("protocol", "TCP")
    for variable in container.get("env") or []:
        # `value` is `omitempty` in the Go type: a real API server stores `value: ""` as no value at all.
        if isinstance(variable, dict) and variable.get("value") == "":
            del variable["value"]


def pod_spec(spec: dict[str, Any]) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            if isinstance(container, dict):
                _container(container)


def _template(obj: dict[str, Any]) -> None:
    spec = (obj.get("spec") or {}).get("template", {}).get("spec")
    if isinstance(spec, dict):
        pod_spec(spec)


def _pod(obj: dict[str, Any]) -> None:
    if isinstance(obj.get("spec"), dict):
        pod_spec(obj["spec"])


def _deployment(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("replicas", 1)
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    spec.setdefault(
        "strategy", {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}
    )
    _template(obj)


def _statefulset(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("replicas", 1)
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("podManagementPolicy", "OrderedReady")
    spec.setdefault("updateStrategy", {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})
    spec.setdefault("persistentVolumeClaimRetentionPolicy", {"whenDeleted": "Retain", "whenScaled": "Retain"})
    for claim in spec.get("volumeClaimTemplates") or []:
        if isinstance(claim, dict) and isinstance(claim.get("spec"), dict):
            claim["spec"].setdefault("volumeMode", "Filesystem")
    _template(obj)


def _service(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    for port in spec.get("ports") or []:
        if isinstance(port, dict):
            port.setdefault("protocol", "TCP")
            if "port" in port:
                port.setdefault("targetPort", port["port"])


def _claim(obj: dict[str, Any]) -> None:
    obj.setdefault("spec", {}).setdefault("volumeMode", "Filesystem")


def _volume(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("volumeMode", "Filesystem")
    spec.setdefault("persistentVolumeReclaimPolicy", "Retain")


DEFAULTERS: dict[tuple[str, str], Callable[[dict[str, Any]], None]] = {
    ("", "pods"): _pod,
    ("apps", "deployments"): _deployment,
    ("apps", "statefulsets"): _statefulset,
    ("apps", "replicasets"): _template,
    ("apps", "daemonsets"): _template,
    ("batch", "jobs"): _template,
    ("", "services"): _service,
    ("", "persistentvolumeclaims"): _claim,
    ("", "persistentvolumes"): _volume,
}


def apply(storage_key: tuple[str, str], obj: dict[str, Any]) -> None:
    """Fill in the defaults of a built-in object, in place."""
    defaulter = DEFAULTERS.get(storage_key)
    if defaulter is not None:
        defaulter(obj)
