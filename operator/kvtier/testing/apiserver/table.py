"""Server-side printing: `meta.k8s.io` Tables for `kubectl get`.

Custom resources get a Name column followed by their CRD's `additionalPrinterColumns` (or Name
and Age when the CRD declares none); built-ins get the columns of :mod:`.printers` (Name and Age
for kinds it does not list).  Column JSONPaths support the simple forms CRDs use (`.a.b`,
`.a[0].b`, `.a['k.x']`, a filter `.a[?(@.type=="Ready")].b` taking the first match, optionally
wrapped in `{}`); `date` columns are rendered as ages like the real server (`5s`, `3m20s`, `2d4h`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from . import printers
from .resources import ResourceType

_NAME_COLUMN = {
    "name": "Name",
    "type": "string",
    "format": "name",
    "priority": 0,
    "description": "Name must be unique within a namespace.",
}

_SEGMENT = re.compile(
    r"\.([^.\[\]]+)|\[(\d+)\]|\['([^']*)'\]|\[\"([^\"]*)\"\]"
    r"|\[\?\(@\.([A-Za-z0-9_]+)\s*==\s*(?:\"([^\"]*)\"|'([^']*)')\)\]"
)


def jsonpath(obj: Any, path: str) -> Any:
    """Evaluate a simple JSONPath; None when any step is missing."""
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    pos = 0
    while pos < len(path):
        m = _SEGMENT.match(path, pos)
        if not m:
            return None
        pos = m.end()
        name, index, quoted, dquoted, field, wanted, swanted = m.groups()
        key = name if name is not None else (quoted if quoted is not None else dquoted)
        if field is not None:  # a filter, `[?(@.type=="Ready")]`: the first matching element
            value = wanted if wanted is not None else swanted
            obj = (
                next((item for item in obj if isinstance(item, dict) and str(item.get(field)) == value), None)
                if isinstance(obj, list)
                else None
            )
        elif key is not None:
            obj = obj.get(key) if isinstance(obj, dict) else None
        else:
            i = int(index)
            obj = obj[i] if isinstance(obj, list) and i < len(obj) else None
        if obj is None:
            return None
    return obj


def columns(rt: ResourceType) -> list[dict[str, Any]]:
    """Column definitions: Name, then the printer columns (each keeps its jsonPath or cell function)."""
    if rt.custom:
        declared = rt.printer_columns or [printers.AGE]
    else:
        declared = printers.COLUMNS.get(rt.storage_key, [printers.AGE])
    result = []
    for col in declared:
        column = {
            "name": col["name"],
            "type": col.get("type", "string"),
            "format": col.get("format", ""),
            "description": col.get("description", ""),
            "priority": col.get("priority", 0),
        }
        if "cell" in col:
            column["cell"] = col["cell"]
        else:
            column["jsonPath"] = col.get("jsonPath", "")
        result.append(column)
    if rt.storage_key in printers.NAME_LAST and not rt.custom:
        return result + [{**_NAME_COLUMN, "priority": 1}]
    return [dict(_NAME_COLUMN)] + result


def _cell(col: dict[str, Any], obj: dict[str, Any]) -> Any:
    if "cell" in col:
        return col["cell"](obj)
    if "jsonPath" not in col:
        return obj["metadata"]["name"]
    value = jsonpath(obj, col["jsonPath"])
    if value is None:
        return None
    kind = col["type"]
    if kind == "date":
        return printers.age(value)
    if kind == "integer" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    if kind == "number" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    if kind == "boolean" and isinstance(value, bool):
        return value
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value) if not isinstance(value, bool) else ("true" if value else "false")


def _row_object(obj: dict[str, Any], include: str) -> dict[str, Any] | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}


def table(
    rt: ResourceType,
    objects: list[dict[str, Any]],
    resource_version: str,
    include: str = "Metadata",
    list_meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A `meta.k8s.io/v1` Table of `objects`."""
    cols = columns(rt)
    rows = []
    for obj in objects:
        row: dict[str, Any] = {"cells": [_cell(c, obj) for c in cols]}
        row_obj = _row_object(obj, include)
        if row_obj is not None:
            row["object"] = row_obj
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version, **(list_meta or {})},
        "columnDefinitions": [{k: v for k, v in c.items() if k not in ("jsonPath", "cell")} for c in cols],
        "rows": rows,
    }
