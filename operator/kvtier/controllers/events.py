"""Kubernetes Events about kvtier's objects, posted once per condition change (not once per resync)."""

from __future__ import annotations

import socket
from datetime import datetime, timezone
from typing import Any

from kvtier.controllers.conditions import transitions
from kvtier.kube import EVENTS, APIError, KubeClient

COMPONENT = "kvtier"
#: The value of each condition that deserves a Warning when it appears; reaching the other value is Normal.
TROUBLE = {"Ready": "False", "StorageBound": "False", "Degraded": "True", "OverCommitted": "True"}


async def post_event(kube: KubeClient, body: Any, kind: str, reason: str, message: str) -> None:
    """Post one Event about `body` (`kind` is Normal or Warning); cluster-scoped objects' go to `default`."""
    metadata = body["metadata"]
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{metadata['name']}.", "namespace": metadata.get("namespace") or "default"},
        "involvedObject": {"apiVersion": body["apiVersion"], "kind": body["kind"], "name": metadata["name"],
                           "namespace": metadata.get("namespace"), "uid": metadata.get("uid")},
        "type": kind,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": socket.gethostname(),
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        await kube.create(EVENTS, event)
    except APIError:
        pass  # an Event is a courtesy: never fail a reconcile over it


async def post_transitions(kube: KubeClient, body: Any, before: list[dict[str, Any]],
                           after: list[dict[str, Any]]) -> None:
    """An Event for every watched condition whose status or reason changed."""
    for condition in transitions(before, after):
        trouble = TROUBLE.get(condition["type"])
        if trouble is None:
            continue
        if condition["status"] == trouble:
            await post_event(kube, body, "Warning", condition["reason"], condition["message"] or condition["type"])
        elif condition["type"] in ("Ready", "StorageBound"):
            await post_event(kube, body, "Normal", condition["reason"], condition["message"] or condition["type"])
