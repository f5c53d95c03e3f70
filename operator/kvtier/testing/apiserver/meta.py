"""What the API semantics share: patch content types, storage keys, write options, metadata checks, a CRD's status."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Any

from . import errors
from .errors import FieldError
from .resources import ResourceType
from .schema import name_errors

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
PATCH_TYPES = [JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, APPLY_PATCH]

CRD_KEY = ("apiextensions.k8s.io", "customresourcedefinitions")
NS_KEY = ("", "namespaces")
SVC_KEY = ("", "services")


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class WriteOptions:
    """Per-request options of a write (query parameters and derived values)."""

    manager: str = "unknown"
    dry_run: bool = False
    field_validation: str = "Warn"  # Ignore | Warn | Strict
    force: bool = False
    warnings: list[str] = field(default_factory=list)


def spec_part(rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
    skip = {"metadata", "status"} if rt.status else {"metadata"}
    return {k: v for k, v in obj.items() if k not in skip}


def set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    parts = [p for p in path.strip(".").split(".") if p]
    node = obj
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def get_path(obj: Any, path: str) -> Any:
    for part in [p for p in path.strip(".").split(".") if p]:
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


_META_TYPES: dict[str, type] = {
    "name": str,
    "generateName": str,
    "namespace": str,
    "uid": str,
    "resourceVersion": str,
    "generation": int,
    "creationTimestamp": str,
    "deletionTimestamp": str,
    "deletionGracePeriodSeconds": int,
    "labels": dict,
    "annotations": dict,
    "finalizers": list,
    "ownerReferences": list,
    "managedFields": list,
}


_GO_TYPES: dict[type, str] = {str: "string", int: "int64", dict: "map[string]string", list: "[]"}


def _json_type(value: Any) -> str:
    """encoding/json's name of a JSON value's type."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), "value")


def check_metadata_types(meta: dict[str, Any]) -> None:
    """Reject what the real server could not even decode into an ObjectMeta (400)."""
    for key, kind in _META_TYPES.items():
        value = meta.get(key)
        if value is None:
            continue
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if ok and kind is dict:
            ok = all(isinstance(v, str) for v in value.values())
        elif ok and key == "finalizers":
            ok = all(isinstance(v, str) for v in value)
        elif ok and key in ("ownerReferences", "managedFields"):
            ok = all(isinstance(v, dict) for v in value)
        if not ok:
            # As kube-apiserver words it (encoding/json's error on ObjectMeta), found on the real control plane.
            raise errors.bad_request(
                f"json: cannot unmarshal {_json_type(value)} into Go struct field "
                f"ObjectMeta.{key} of type {_GO_TYPES[kind]}"
            )
    for ref in meta.get("ownerReferences") or []:
        if not all(isinstance(ref.get(k), str) for k in ("apiVersion", "kind", "name", "uid")):
            raise errors.bad_request("metadata.ownerReferences: apiVersion, kind, name and uid must be strings")


def without_volatile(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in obj["metadata"].items() if k not in ("resourceVersion", "managedFields")}
    return {**obj, "metadata": meta}


def metadata_errors(rt: ResourceType, meta: dict[str, Any]) -> list[FieldError]:
    problems = (
        name_errors(meta["name"], label=rt.storage_key == NS_KEY)
        if meta.get("name")
        else [FieldError("metadata.name", "Required value", "name or generateName is required")]
    )
    for value in (meta.get("labels") or {}).values():
        if isinstance(value, str) and (
            len(value) > 63 or not re.match(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$", value)
        ):
            problems.append(
                FieldError(
                    "metadata.labels",
                    "Invalid value",
                    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.'",
                    value,
                )
            )
    return problems


def crd_status(crd: dict[str, Any], old_status: dict[str, Any] | None = None) -> dict[str, Any]:
    spec = crd.get("spec") if isinstance(crd.get("spec"), dict) else {}
    stamp = now()
    previous = {c.get("type"): c for c in (old_status or {}).get("conditions") or []}

    def condition(kind: str, reason: str, message: str) -> dict[str, Any]:
        before = previous.get(kind)
        when = before["lastTransitionTime"] if before and before.get("status") == "True" else stamp
        return {"type": kind, "status": "True", "reason": reason, "message": message, "lastTransitionTime": when}

    versions = spec.get("versions") if isinstance(spec.get("versions"), list) else []
    stored = [
        v["name"] for v in versions if isinstance(v, dict) and v.get("storage") and isinstance(v.get("name"), str)
    ]
    return {
        "acceptedNames": spec.get("names") or {},
        "conditions": [
            condition("NamesAccepted", "NoConflicts", "no conflicts found"),
            condition("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        ],
        "storedVersions": sorted(set((old_status or {}).get("storedVersions", [])) | set(stored)),
    }
