"""PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge patch.

Strategic merge patch, as implemented here:

* Maps merge recursively; a `null` value deletes the key (as in a merge patch).
* Lists of objects merge by key when the field name is in :data:`MERGE_KEYS` and the items carry
  that key (`containers`, `initContainers`, `ephemeralContainers`, `volumes`, `env`,
  `imagePullSecrets`, `hostAliases`, `resourceClaims` by `name`; `volumeMounts` by `mountPath`;
  `volumeDevices` by `devicePath`; `ports` by `containerPort` (container ports) or `port` (service
  ports); `conditions` and node `addresses` by `type`; `ownerReferences` by `uid`;
  `topologySpreadConstraints` by `topologyKey`).  Patch items whose key is absent from the target
  are appended in patch order; existing items keep their position.
* Lists of scalars named `finalizers` merge as a set union (patchStrategy `merge`).
* Every other list is replaced wholesale (what the real server does for lists without a
  `patchStrategy`, e.g. `args`, `command`, `tolerations`, `volumeClaimTemplates`).
* Directives: `$patch: delete` removes a map or a keyed list item, `$patch: replace` on a map or
  as a list item replaces the whole map/list, `$deleteFromPrimitiveList/<field>` removes scalars,
  `$setElementOrder/<field>` and `$retainKeys` (sent by `kubectl apply`) are accepted and ignored.

The merge key table applies by field name anywhere in the object, which matches the real
per-type metadata for every kind the emulator serves.  Strategic merge patch on custom resources
is refused with 415, like the real server.
"""

from __future__ import annotations

import copy
from typing import Any

from .errors import StatusError, bad_request

MERGE_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "volumes": ("name",),
    "env": ("name",),
    "imagePullSecrets": ("name",),
    "hostAliases": ("ip",),
    "resourceClaims": ("name",),
    "volumeMounts": ("mountPath",),
    "volumeDevices": ("devicePath",),
    "ports": ("containerPort", "port"),
    "conditions": ("type",),
    "addresses": ("type",),
    "ownerReferences": ("uid",),
    "topologySpreadConstraints": ("topologyKey",),
}
SET_LISTS = {"finalizers"}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# -- RFC 6902 ---------------------------------------------------------------------------------


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"invalid JSON pointer: {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _resolve(doc: Any, parts: list[str], path: str) -> Any:
    for part in parts:
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            raise _patch_error(f"path {path!r} not found")
    return doc


def _patch_error(message: str) -> StatusError:
    # The real server answers a failing JSON patch with 422 (e.g. a failed `test`) or 500.
    return StatusError(422, "Invalid", f"the server rejected our request due to an error in our request: {message}")


def _add(doc: Any, parts: list[str], value: Any, path: str, replace: bool) -> Any:
    if not parts:
        return value
    parent = _resolve(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise _patch_error(f"replace operation does not apply: doc is missing key: {path}")
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-" and not replace:
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent) - (1 if replace else 0):
            if replace:
                parent[int(last)] = value
            else:
                parent.insert(int(last), value)
        else:
            raise _patch_error(f"array index out of range: {path}")
    else:
        raise _patch_error(f"path {path!r} not found")
    return doc


def _remove(doc: Any, parts: list[str], path: str) -> Any:
    if not parts:
        raise _patch_error("cannot remove the whole document")
    parent = _resolve(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise _patch_error(f"remove operation does not apply: doc is missing path: {path}")


def json_patch(target: Any, operations: Any) -> Any:
    """Apply an RFC 6902 operation list (add, remove, replace, move, copy, test)."""
    if not isinstance(operations, list):
        raise bad_request("json patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"invalid json patch operation: {op!r}")
        kind, path = op["op"], op["path"]
        parts = _pointer(path)
        if kind in ("add", "replace"):
            if "value" not in op:
                raise bad_request(f"{kind} operation missing value")
            doc = _add(doc, parts, copy.deepcopy(op["value"]), path, replace=kind == "replace")
        elif kind == "remove":
            _remove(doc, parts, path)
        elif kind in ("move", "copy"):
            source = op.get("from")
            if source is None:
                raise bad_request(f"{kind} operation missing from")
            from_parts = _pointer(source)
            if kind == "move":
                value = _remove(doc, from_parts, source)
            else:
                value = copy.deepcopy(_resolve(doc, from_parts, source))
            doc = _add(doc, parts, value, path, replace=False)
        elif kind == "test":
            if _resolve(doc, parts, path) != op.get("value"):
                raise _patch_error(f"testing value {path} failed")
        else:
            raise bad_request(f"unknown json patch operation: {kind!r}")
    return doc


# -- strategic merge patch --------------------------------------------------------------------


def _merge_key(field_name: str, items: list[Any]) -> str | None:
    for key in MERGE_KEYS.get(field_name, ()):
        if items and all(isinstance(i, dict) and key in i for i in items):
            return key
    return None


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Apply a strategic merge patch to a map (see the module docstring for the rules)."""
    if not isinstance(patch, dict):
        raise bad_request("strategic merge patch must be a JSON object")
    return _smp_map(target if isinstance(target, dict) else {}, patch)


def _smp_map(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    if patch.get("$patch") == "replace":
        return {k: v for k, v in copy.deepcopy(patch).items() if k != "$patch"}
    result = dict(target)
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            if not isinstance(value, list):
                raise bad_request(f"{key} must be a list")
            drop = set(map(repr, value))
            if isinstance(result.get(name), list):
                result[name] = [v for v in result[name] if repr(v) not in drop]
            continue
        if value is None or (isinstance(value, dict) and value.get("$patch") == "delete"):
            result.pop(key, None)
        elif isinstance(value, dict):
            current = result.get(key)
            result[key] = _smp_map(current if isinstance(current, dict) else {}, value)
        elif isinstance(value, list):
            result[key] = _smp_list(key, result.get(key), value)
        else:
            result[key] = value
    return result


def _smp_list(name: str, current: Any, patch: list[Any]) -> list[Any]:
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in patch):
        return [copy.deepcopy(i) for i in patch if not (isinstance(i, dict) and i.get("$patch") == "replace")]
    current = current if isinstance(current, list) else []
    if name in SET_LISTS and all(not isinstance(i, (dict, list)) for i in patch):
        return list(current) + [i for i in patch if i not in current]
    key = _merge_key(name, [i for i in patch if not (isinstance(i, dict) and set(i) == {"$patch"})])
    if key is None or not all(isinstance(i, dict) and key in i for i in current):
        return [copy.deepcopy(i) for i in patch]
    result = list(current)
    for item in patch:
        index = next((n for n, existing in enumerate(result) if existing.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if index is not None:
                result.pop(index)
        elif index is None:
            result.append(_smp_map({}, item))
        else:
            result[index] = _smp_map(result[index], item)
    return result
