"""Helpers the pod simulator's parts share: time stamps, owner references, pod conditions and requests."""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from kvtier.api.units import quantity_value
from kvtier.kube import APIError

log = logging.getLogger(__name__)

GPU = "nvidia.com/gpu"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def template_hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:10]


def pod_requests(pod: dict[str, Any]) -> dict[str, Decimal]:
    """Effective requests: the sum over containers (a missing request is its limit), at least each init container."""

    def of(container: dict[str, Any]) -> dict[str, Decimal]:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {name: quantity_value(str(value)) for name, value in merged.items()}

    total: dict[str, Decimal] = {}
    for container in pod["spec"].get("containers", []):
        for name, value in of(container).items():
            total[name] = total.get(name, Decimal(0)) + value
    for container in pod["spec"].get("initContainers", []):
        for name, value in of(container).items():
            total[name] = max(total.get(name, Decimal(0)), value)
    return total


def owned_by(obj: dict[str, Any], owner: dict[str, Any]) -> bool:
    uid = owner["metadata"]["uid"]
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences", []))


def owner_reference(owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def pod_condition(pod: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in (pod.get("status") or {}).get("conditions", []) if c.get("type") == kind), None)


async def isolated(obj: dict[str, Any], step: Any) -> None:
    """Run one object's step; its API errors (a terminating namespace, a lost race) do not stop the pass."""
    try:
        await step
    except APIError as error:
        log.debug("%s %s/%s: %s", obj.get("kind"), obj["metadata"].get("namespace"), obj["metadata"]["name"], error)


def job_condition(kind: str, reason: str, message: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastProbeTime": now(),
        "lastTransitionTime": now(),
    }


def is_ready(pod: dict[str, Any]) -> bool:
    condition = pod_condition(pod, "Ready")
    return bool(condition and condition.get("status") == "True")
