"""Kubernetes Events about kvtier's objects, posted once per condition change (not once per resync).

The same Event (object, type, reason, message) is posted at most once per `REPEAT_SECONDS`: a
timer and a change handler of one object can see the same transition at the same time.
"""

from __future__ import annotations

import socket
import time
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

from kvtier.controllers.conditions import transitions
from kvtier.kube import EVENTS, APIError, KubeClient

COMPONENT = "kvtier"
#: The value of each condition that deserves a Warning when it appears; reaching the other value is Normal.
TROUBLE = {"Ready": "False", "StorageBound": "False", "Degraded": "True", "OverCommitted": "True"}
#: Reasons of a trouble value that are a normal stage, not trouble: a Normal Event (replicas still
#: starting within their grace period, none failing).
NORMAL_REASONS = {"ReplicasStarting"}
#: Least seconds between two posts of the same Event.
REPEAT_SECONDS = 60.0
#: Events remembered for that (the oldest are forgotten first).
REMEMBERED = 4096

_posted: OrderedDict[tuple[str, ...], float] = OrderedDict()


def _first_in_a_while(key: tuple[str, ...]) -> bool:
    """Whether `key` was not posted within `REPEAT_SECONDS` (and remember that it is now)."""
    now = time.monotonic()
    last = _posted.pop(key, None)
    _posted[key] = now if last is None or now - last >= REPEAT_SECONDS else last
    while len(_posted) > REMEMBERED:
        _posted.popitem(last=False)
    return last is None or now - last >= REPEAT_SECONDS


async def post_event(kube: KubeClient, body: Any, kind: str, reason: str, message: str) -> None:
    """Post one Event about `body` (`kind` is Normal or Warning); cluster-scoped objects' go to `default`.

    The message names the object (`KVPool gpu-pool: ...`), so it reads on its own wherever Events are
    forwarded."""
    metadata = body["metadata"]
    name = f"{metadata['namespace']}/{metadata['name']}" if metadata.get("namespace") else metadata["name"]
    message = f"{body['kind']} {name}: {message}"
    key = (metadata.get("uid") or f"{metadata.get('namespace')}/{metadata['name']}", kind, reason, message)
    if not _first_in_a_while(key):
        return
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{metadata['name']}.", "namespace": metadata.get("namespace") or "default"},
        "involvedObject": {
            "apiVersion": body["apiVersion"],
            "kind": body["kind"],
            "name": metadata["name"],
            "namespace": metadata.get("namespace"),
            "uid": metadata.get("uid"),
        },
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


async def post_transitions(
    kube: KubeClient, body: Any, before: list[dict[str, Any]], after: list[dict[str, Any]]
) -> None:
    """An Event for every watched condition whose status or reason changed."""
    for condition in transitions(before, after):
        trouble = TROUBLE.get(condition["type"])
        if trouble is None:
            continue
        message = condition["message"] or condition["type"]
        if condition["status"] == trouble and condition["reason"] not in NORMAL_REASONS:
            await post_event(kube, body, "Warning", condition["reason"], message)
        elif condition["type"] in ("Ready", "StorageBound"):
            await post_event(kube, body, "Normal", condition["reason"], message)
