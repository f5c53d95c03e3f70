"""Server-side printer columns of built-in kinds, after the real server's (pkg/printers/internalversion).

Each column computes its cell from the object (`Age` columns are JSONPath date columns, rendered
by :mod:`.table` with :func:`age`).
Columns with priority 1 only show with `kubectl get -o wide`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

Cell = Callable[[dict[str, Any]], Any]


def human_duration(seconds: float) -> str:
    """Go's `duration.HumanDuration`, as kubectl shows ages."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m" if s % 60 == 0 else f"{minutes}m{s % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d" if hours % 24 == 0 else f"{hours // 24}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    years, days = hours // (24 * 365), (hours // 24) % 365
    if years < 8:
        return f"{years}y" if days == 0 else f"{years}y{days}d"
    return f"{years}y"


def age(value: Any) -> str | None:
    """The age of an RFC 3339 timestamp, as kubectl shows it (None when unparsable)."""
    if not isinstance(value, str):
        return None
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return human_duration((dt.datetime.now(dt.UTC) - when).total_seconds())


def _get(obj: Any, *path: str) -> Any:
    for part in path:
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def _none(value: Any) -> Any:
    return "<none>" if value in (None, "", []) else value


def _pod_ready(pod: dict[str, Any]) -> str:
    statuses = _get(pod, "status", "containerStatuses") or []
    total = len(_get(pod, "spec", "containers") or [])
    return f"{sum(1 for s in statuses if s.get('ready'))}/{total}"


def _pod_status(pod: dict[str, Any]) -> str:
    if _get(pod, "metadata", "deletionTimestamp"):
        return "Terminating"
    reason = _get(pod, "status", "reason")
    for status in _get(pod, "status", "containerStatuses") or []:
        state = status.get("state") or {}
        for key in ("waiting", "terminated"):
            if (state.get(key) or {}).get("reason"):
                reason = reason or state[key]["reason"]
    return reason or _get(pod, "status", "phase") or "Unknown"


def _restarts(pod: dict[str, Any]) -> int:
    return sum(s.get("restartCount", 0) for s in _get(pod, "status", "containerStatuses") or [])


def _containers(obj: dict[str, Any], field: str) -> str:
    containers = _get(obj, "spec", "template", "spec", "containers") or []
    return ",".join(c.get(field, "") for c in containers)


def _node_status(node: dict[str, Any]) -> str:
    ready = next((c for c in _get(node, "status", "conditions") or [] if c.get("type") == "Ready"), None)
    status = "Unknown" if ready is None else ("Ready" if ready.get("status") == "True" else "NotReady")
    return status + (",SchedulingDisabled" if _get(node, "spec", "unschedulable") else "")


def _node_roles(node: dict[str, Any]) -> str:
    prefix = "node-role.kubernetes.io/"
    roles = [k[len(prefix) :] for k in (_get(node, "metadata", "labels") or {}) if k.startswith(prefix)]
    return ",".join(sorted(roles)) or "<none>"


def _access_modes(obj: dict[str, Any]) -> str:
    short = {"ReadWriteOnce": "RWO", "ReadOnlyMany": "ROX", "ReadWriteMany": "RWX", "ReadWriteOncePod": "RWOP"}
    return ",".join(short.get(m, m) for m in _get(obj, "spec", "accessModes") or [])


def _ports(service: dict[str, Any]) -> str:
    ports = _get(service, "spec", "ports") or []
    return ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in ports) or "<none>"


def _col(name: str, cell: Cell, kind: str = "string", priority: int = 0) -> dict[str, Any]:
    return {"name": name, "type": kind, "format": "", "description": "", "priority": priority, "cell": cell}


AGE = {
    "name": "Age",
    "type": "date",
    "jsonPath": ".metadata.creationTimestamp",
    "priority": 0,
    "format": "",
    "description": "CreationTimestamp is a timestamp representing the server time when this object was created.",
}

COLUMNS: dict[tuple[str, str], list[dict[str, Any]]] = {
    ("", "pods"): [
        _col("Ready", _pod_ready),
        _col("Status", _pod_status),
        _col("Restarts", _restarts, "integer"),
        AGE,
        _col("IP", lambda p: _none(_get(p, "status", "podIP")), priority=1),
        _col("Node", lambda p: _none(_get(p, "spec", "nodeName")), priority=1),
    ],
    ("apps", "deployments"): [
        _col("Ready", lambda d: f"{_get(d, 'status', 'readyReplicas') or 0}/{_get(d, 'spec', 'replicas') or 0}"),
        _col("Up-to-date", lambda d: _get(d, "status", "updatedReplicas") or 0, "integer"),
        _col("Available", lambda d: _get(d, "status", "availableReplicas") or 0, "integer"),
        AGE,
        _col("Containers", lambda d: _containers(d, "name"), priority=1),
        _col("Images", lambda d: _containers(d, "image"), priority=1),
    ],
    ("apps", "statefulsets"): [
        _col("Ready", lambda s: f"{_get(s, 'status', 'readyReplicas') or 0}/{_get(s, 'spec', 'replicas') or 0}"),
        AGE,
        _col("Containers", lambda s: _containers(s, "name"), priority=1),
        _col("Images", lambda s: _containers(s, "image"), priority=1),
    ],
    ("", "nodes"): [
        _col("Status", _node_status),
        _col("Roles", _node_roles),
        AGE,
        _col("Version", lambda n: _get(n, "status", "nodeInfo", "kubeletVersion") or ""),
    ],
    ("", "namespaces"): [_col("Status", lambda n: _get(n, "status", "phase") or ""), AGE],
    ("", "persistentvolumeclaims"): [
        _col("Status", lambda c: _get(c, "status", "phase") or "Pending"),
        _col("Volume", lambda c: _get(c, "spec", "volumeName") or ""),
        _col("Capacity", lambda c: _get(c, "status", "capacity", "storage") or ""),
        _col("Access Modes", _access_modes),
        _col("StorageClass", lambda c: _none(_get(c, "spec", "storageClassName"))),
        AGE,
    ],
    ("", "persistentvolumes"): [
        _col("Capacity", lambda v: _get(v, "spec", "capacity", "storage") or ""),
        _col("Access Modes", _access_modes),
        _col("Reclaim Policy", lambda v: _get(v, "spec", "persistentVolumeReclaimPolicy") or ""),
        _col("Status", lambda v: _get(v, "status", "phase") or "Pending"),
        _col(
            "Claim",
            lambda v: "/".join(
                filter(None, (_get(v, "spec", "claimRef", "namespace"), _get(v, "spec", "claimRef", "name")))
            ),
        ),
        _col("StorageClass", lambda v: _get(v, "spec", "storageClassName") or ""),
        AGE,
    ],
    ("", "services"): [
        _col("Type", lambda s: _get(s, "spec", "type") or "ClusterIP"),
        _col("Cluster-IP", lambda s: _none(_get(s, "spec", "clusterIP"))),
        _col("Port(s)", _ports),
        AGE,
    ],
    ("", "configmaps"): [
        _col("Data", lambda c: len(c.get("data") or {}) + len(c.get("binaryData") or {}), "integer"),
        AGE,
    ],
    ("", "secrets"): [
        _col("Type", lambda s: s.get("type") or "Opaque"),
        _col("Data", lambda s: len(s.get("data") or {}) + len(s.get("stringData") or {}), "integer"),
        AGE,
    ],
    ("storage.k8s.io", "storageclasses"): [
        _col("Provisioner", lambda s: s.get("provisioner") or ""),
        _col("ReclaimPolicy", lambda s: s.get("reclaimPolicy") or "Delete"),
        _col("VolumeBindingMode", lambda s: s.get("volumeBindingMode") or "Immediate"),
        AGE,
    ],
    ("coordination.k8s.io", "leases"): [_col("Holder", lambda le: _get(le, "spec", "holderIdentity") or ""), AGE],
    ("", "events"): [
        _col(
            "Last Seen",
            lambda e: age(e.get("lastTimestamp") or e.get("eventTime") or _get(e, "metadata", "creationTimestamp")),
        ),
        _col("Type", lambda e: e.get("type") or ""),
        _col("Reason", lambda e: e.get("reason") or ""),
        _col(
            "Object",
            lambda e: f"{_get(e, 'involvedObject', 'kind') or ''}/{_get(e, 'involvedObject', 'name') or ''}".lower(),
        ),
        _col("Message", lambda e: (e.get("message") or "").strip()),
    ],
}

# Kinds whose Name column comes last and only with `-o wide`, as the real server prints events.
NAME_LAST = {("", "events")}
