"""Server-side apply and `metadata.managedFields`, simplified.

Ownership is tracked per field manager as a set of *leaf* paths (a scalar, an atomic list or an
empty map) under everything except `apiVersion`, `kind`, `status` and `metadata` (of which only
`labels` and `annotations` are tracked).  A path is a tuple of FieldsV1 elements: `f:<name>` for
map keys and `k:{"name":"x"}` for an item of a keyed list.  Lists are keyed by
`x-kubernetes-list-type: map` + `x-kubernetes-list-map-keys` for custom resources, by the strategic
merge keys of :mod:`.patch` for built-ins; other lists are atomic (one leaf).

Apply (`application/apply-patch+yaml`):
* a leaf of the applied configuration conflicts (409, one cause per field) when another manager
  owns it and the live value differs; with `force=true` ownership moves to the applier instead;
* leaves the manager applied before but no longer applies are removed from the object unless
  another manager also owns them (keyed-list items left with only their keys are removed too);
* the configuration is merged into the live object (maps recursively, keyed lists by key, atomic
  lists and scalars replaced); the manager then owns exactly the applied leaves (operation Apply).

Every other write (create, update, patch) gives its manager (`fieldManager`, or the user agent up
to the first `/`) the leaves it changed (operation Update) and takes them away from other managers.
Unlike the real server, status is never tracked and FieldsV1 carries leaves only (no `.` entries).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from .errors import StatusError
from .patch import MERGE_KEYS

Path = tuple[str, ...]
# Given the field names leading to a list (e.g. ("spec", "template", "spec", "containers")) and
# its items, the list's key fields, or None for an atomic list.
ListKeys = Callable[[tuple[str, ...], list[Any]], list[str] | None]

_TRACKED_METADATA = ("labels", "annotations")


def builtin_list_keys(names: tuple[str, ...], items: list[Any]) -> list[str] | None:
    for key in MERGE_KEYS.get(names[-1] if names else "", ()):
        if items and all(isinstance(i, dict) and key in i for i in items):
            return [key]
    return None


def schema_list_keys(schema: dict[str, Any] | None) -> ListKeys:
    """List keys from a CRD schema's `x-kubernetes-list-type: map` declarations."""

    def keys(names: tuple[str, ...], items: list[Any]) -> list[str] | None:
        node = schema
        for name in names:
            if not isinstance(node, dict):
                return None
            if node.get("type") == "array":
                node = node.get("items")
            node = ((node or {}).get("properties") or {}).get(name) or (node or {}).get("additionalProperties")
        if isinstance(node, dict) and node.get("x-kubernetes-list-type") == "map":
            return list(node.get("x-kubernetes-list-map-keys") or []) or None
        return None

    return keys


def _item_key(item: dict[str, Any], keys: list[str]) -> str:
    return "k:" + json.dumps({k: item.get(k) for k in keys}, sort_keys=True, separators=(",", ":"))


def leaves(obj: dict[str, Any], list_keys: ListKeys) -> dict[Path, Any]:
    """Every tracked leaf path of an object, with its value."""
    out: dict[Path, Any] = {}
    for key, value in obj.items():
        if key in ("apiVersion", "kind", "status"):
            continue
        if key == "metadata":
            for mkey in _TRACKED_METADATA:
                if isinstance(value.get(mkey), dict):
                    _walk(value[mkey], ("f:metadata", f"f:{mkey}"), ("metadata", mkey), list_keys, out)
            continue
        _walk(value, (f"f:{key}",), (key,), list_keys, out)
    return out


def _walk(value: Any, path: Path, names: tuple[str, ...], list_keys: ListKeys, out: dict[Path, Any]) -> None:
    if isinstance(value, dict) and value:
        for key, item in value.items():
            _walk(item, path + (f"f:{key}",), names + (key,), list_keys, out)
        return
    if isinstance(value, list) and value:
        keys = list_keys(names, value)
        if keys and all(isinstance(i, dict) for i in value):
            for item in value:
                ipath = path + (_item_key(item, keys),)
                for field_name, sub in item.items():
                    _walk(sub, ipath + (f"f:{field_name}",), names + (field_name,), list_keys, out)
            return
    out[path] = value


# -- managedFields encoding -------------------------------------------------------------------


def decode_managed(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """managedFields entries with their FieldsV1 turned into a set of leaf paths (`_paths`)."""
    entries = []
    for entry in obj.get("metadata", {}).get("managedFields") or []:
        if not isinstance(entry, dict) or not entry.get("manager"):
            continue
        paths: set[Path] = set()
        _collect(entry.get("fieldsV1") or {}, (), paths)
        entries.append({**entry, "_paths": paths})
    return entries


def _collect(node: dict[str, Any], prefix: Path, out: set[Path]) -> None:
    for key, sub in node.items():
        if key == ".":
            continue
        if isinstance(sub, dict) and any(k != "." for k in sub):
            _collect(sub, prefix + (key,), out)
        else:
            out.add(prefix + (key,))


def encode_managed(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    result = []
    for entry in entries:
        if not entry["_paths"]:
            continue
        tree: dict[str, Any] = {}
        for path in sorted(entry["_paths"]):
            node = tree
            for part in path:
                node = node.setdefault(part, {})
        clean = {k: v for k, v in entry.items() if k != "_paths"}
        clean.update(fieldsType="FieldsV1", fieldsV1=tree)
        result.append(clean)
    return result


def _entry(entries: list[dict[str, Any]], manager: str, operation: str, api_version: str, now: str) -> dict[str, Any]:
    for entry in entries:
        if entry["manager"] == manager and entry.get("operation") == operation and not entry.get("subresource"):
            entry["time"] = now
            entry["apiVersion"] = api_version
            return entry
    entry = {"manager": manager, "operation": operation, "apiVersion": api_version, "time": now, "_paths": set()}
    entries.append(entry)
    return entry


def record_update(old: dict[str, Any] | None, new: dict[str, Any], manager: str, list_keys: ListKeys, now: str) -> None:
    """Give `manager` the leaves a non-apply write changed; store managedFields on `new`."""
    entries = decode_managed(old or {}) if new["metadata"].get("managedFields") is None else decode_managed(new)
    before = leaves(old, list_keys) if old else {}
    after = leaves(new, list_keys)
    changed = {p for p, v in after.items() if p not in before or before[p] != v}
    removed = set(before) - set(after)
    if changed or removed:
        for entry in entries:
            entry["_paths"] -= changed | removed
        if changed:
            _entry(entries, manager, "Update", new["apiVersion"], now)["_paths"] |= changed
    new["metadata"]["managedFields"] = encode_managed(entries)


# -- apply ------------------------------------------------------------------------------------


def _get(obj: Any, path: Path) -> tuple[bool, Any]:
    for part in path:
        if part.startswith("f:") and isinstance(obj, dict) and part[2:] in obj:
            obj = obj[part[2:]]
        elif part.startswith("k:") and isinstance(obj, list):
            want = json.loads(part[2:])
            found = [i for i in obj if isinstance(i, dict) and all(i.get(k) == v for k, v in want.items())]
            if not found:
                return False, None
            obj = found[0]
        else:
            return False, None
    return True, obj


def _remove(obj: dict[str, Any], path: Path) -> None:
    """Delete a leaf; prune maps emptied by it and keyed items left with only their keys."""
    trail: list[tuple[Any, Any]] = []
    node: Any = obj
    for part in path:
        if part.startswith("f:") and isinstance(node, dict) and part[2:] in node:
            trail.append((node, part[2:]))
            node = node[part[2:]]
        elif part.startswith("k:") and isinstance(node, list):
            want = json.loads(part[2:])
            index = next(
                (n for n, i in enumerate(node) if isinstance(i, dict) and all(i.get(k) == v for k, v in want.items())),
                None,
            )
            if index is None:
                return
            trail.append((node, index))
            node = node[index]
        else:
            return
    for depth in range(len(trail) - 1, -1, -1):
        container, key = trail[depth]
        if depth == len(trail) - 1:
            container.pop(key) if isinstance(container, dict) else container.pop(key)
            continue
        child = container[key]
        want = json.loads(path[depth][2:]) if path[depth].startswith("k:") else None
        emptied = child == {} or (want is not None and isinstance(child, dict) and set(child) <= set(want))
        if not emptied or (depth == 0 and key == "metadata"):
            break
        container.pop(key)


def _merge(live: Any, config: Any, names: tuple[str, ...], list_keys: ListKeys) -> Any:
    if isinstance(config, dict) and isinstance(live, dict):
        result = dict(live)
        for key, value in config.items():
            result[key] = _merge(live.get(key), value, names + (key,), list_keys)
        return result
    if isinstance(config, list) and isinstance(live, list) and config:
        keys = list_keys(names, config)
        if keys and all(isinstance(i, dict) for i in config + live):
            result = list(live)
            for item in config:
                ident = _item_key(item, keys)
                index = next((n for n, i in enumerate(result) if _item_key(i, keys) == ident), None)
                if index is None:
                    result.append(copy.deepcopy(item))
                else:
                    result[index] = _merge(result[index], item, names, list_keys)
            return result
    return copy.deepcopy(config)


def _is_key_field(path: Path) -> bool:
    return len(path) >= 2 and path[-2].startswith("k:") and path[-1][2:] in json.loads(path[-2][2:])


def _readable(path: Path) -> str:
    return "." + ".".join(p[2:] if p.startswith("f:") else f"[{p[2:]}]" for p in path)


def server_side_apply(
    live: dict[str, Any] | None,
    config: dict[str, Any],
    manager: str,
    force: bool,
    list_keys: ListKeys,
    now: str,
) -> dict[str, Any]:
    """Merge an applied configuration into the live object (None: create) and update ownership."""
    entries = decode_managed(live) if live else []
    applied = leaves(config, list_keys)
    conflicts: list[tuple[str, Path]] = []
    for entry in entries:
        if entry["manager"] == manager and entry.get("operation") == "Apply":
            continue
        for path in applied.keys() & entry["_paths"]:
            present, current = _get(live, path)
            if present and current != applied[path]:
                if force:
                    entry["_paths"].discard(path)
                else:
                    conflicts.append((entry["manager"], path))
    if conflicts:
        causes = [
            {"reason": "FieldManagerConflict", "message": f'conflict with "{m}"', "field": _readable(p)}
            for m, p in conflicts
        ]
        summary = "\n".join(f'- conflict with "{m}": {_readable(p)}' for m, p in conflicts)
        raise StatusError(
            409,
            "Conflict",
            f"Apply failed with {len(conflicts)} conflict{'s' if len(conflicts) > 1 else ''}: {summary}",
            details={"causes": causes},
        )
    result = copy.deepcopy(live) if live else {}
    mine = _entry(entries, manager, "Apply", config.get("apiVersion", ""), now)
    others = set().union(*(e["_paths"] for e in entries if e is not mine)) if len(entries) > 1 else set()
    # Key fields of keyed items go last: removing them first would orphan the item's other fields.
    for path in sorted(mine["_paths"] - set(applied) - others, key=_is_key_field):
        _remove(result, path)
    spec_config = {k: v for k, v in config.items() if k != "status"}
    result = _merge(result, spec_config, (), list_keys)
    mine["_paths"] = set(applied)
    result.setdefault("metadata", {})["managedFields"] = encode_managed(entries)
    return result
