"""Kubernetes-shaped conditions: set one, keep the others, move `lastTransitionTime` only on a change."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

ConditionStatus = Literal["True", "False", "Unknown"]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: list[dict[str, Any]],
    kind: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """A new list with condition `kind` set; its transition time changes only when its status does."""
    old = next((c for c in conditions if c.get("type") == kind), None)
    changed = old is None or old.get("status") != status
    entry: dict[str, Any] = {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": _now() if changed else old.get("lastTransitionTime", _now()),
    }
    if generation is not None:
        entry["observedGeneration"] = generation
    return [entry if c.get("type") == kind else c for c in conditions] if old else [*conditions, entry]


def find(conditions: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == kind), None)


def transitions(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Conditions whose status or reason differ from before (what deserves an Event)."""
    moved = []
    for condition in after:
        old = find(before, condition["type"])
        if old is None or (old.get("status"), old.get("reason")) != (condition["status"], condition["reason"]):
            moved.append(condition)
    return moved
