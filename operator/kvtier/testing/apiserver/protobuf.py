"""Decoding of the Kubernetes protobuf bodies kubectl's generators send (`kubectl create namespace`,
`create configmap`, `create secret`, `create serviceaccount`).

The emulator speaks JSON; typed client-go clients in kubectl nevertheless encode a few requests
as `application/vnd.kubernetes.protobuf` (the `k8s\\x00` envelope around a `runtime.Unknown`).
This module knows the field numbers of ObjectMeta and of those four kinds only; any other
protobuf body is refused with 415.
"""

from __future__ import annotations

import base64
from typing import Any

MAGIC = b"k8s\x00"

# field number -> (json name, type); types: str, int, bool, map_str, map_bytes,
# repeated_str, or a nested schema dict (repeated when wrapped in a list).
_OWNER_REFERENCE = {
    1: ("kind", "str"),
    3: ("name", "str"),
    4: ("uid", "str"),
    5: ("apiVersion", "str"),
    6: ("controller", "bool"),
    7: ("blockOwnerDeletion", "bool"),
}
_OBJECT_META = {
    1: ("name", "str"),
    2: ("generateName", "str"),
    3: ("namespace", "str"),
    5: ("uid", "str"),
    6: ("resourceVersion", "str"),
    7: ("generation", "int"),
    11: ("labels", "map_str"),
    12: ("annotations", "map_str"),
    13: ("ownerReferences", [_OWNER_REFERENCE]),
    14: ("finalizers", "repeated_str"),
}
KINDS: dict[tuple[str, str], dict[int, Any]] = {
    ("v1", "Namespace"): {1: ("metadata", _OBJECT_META), 2: ("spec", {1: ("finalizers", "repeated_str")})},
    ("v1", "ConfigMap"): {
        1: ("metadata", _OBJECT_META),
        2: ("data", "map_str"),
        3: ("binaryData", "map_bytes"),
        4: ("immutable", "bool"),
    },
    ("v1", "Secret"): {
        1: ("metadata", _OBJECT_META),
        2: ("data", "map_bytes"),
        3: ("type", "str"),
        4: ("stringData", "map_str"),
        5: ("immutable", "bool"),
    },
    ("v1", "ServiceAccount"): {1: ("metadata", _OBJECT_META), 4: ("automountServiceAccountToken", "bool")},
}


class ProtobufError(ValueError):
    pass


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ProtobufError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def fields(data: bytes) -> list[tuple[int, Any]]:
    """The (field number, value) pairs of a message: ints for varints, bytes for length-delimited."""
    out: list[tuple[int, Any]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            out.append((number, value))
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise ProtobufError("truncated field")
            out.append((number, data[pos : pos + length]))
            pos += length
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
    return out


def _message(data: bytes, schema: dict[int, Any]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for number, value in fields(data):
        if number not in schema:
            continue
        name, kind = schema[number]
        if isinstance(kind, dict):
            obj[name] = _message(value, kind)
        elif isinstance(kind, list):
            obj.setdefault(name, []).append(_message(value, kind[0]))
        elif kind == "str":
            if value:  # client-go writes unset strings as empty ones
                obj[name] = value.decode()
        elif kind in ("int", "bool"):
            obj[name] = bool(value) if kind == "bool" else value
        elif kind == "repeated_str":
            obj.setdefault(name, []).append(value.decode())
        elif kind in ("map_str", "map_bytes"):
            entry = dict(fields(value))
            raw = entry.get(2, b"")
            text = base64.b64encode(raw).decode() if kind == "map_bytes" else raw.decode()
            obj.setdefault(name, {})[entry.get(1, b"").decode()] = text
    return obj


def decode(body: bytes) -> dict[str, Any]:
    """A JSON-shaped object from a Kubernetes protobuf body; ProtobufError when unsupported."""
    if not body.startswith(MAGIC):
        raise ProtobufError("missing the k8s protobuf envelope")
    try:
        unknown = dict(fields(body[len(MAGIC) :]))
        type_meta = dict(fields(unknown.get(1, b"")))
        api_version = type_meta.get(1, b"").decode()
        kind = type_meta.get(2, b"").decode()
    except (ValueError, TypeError, AttributeError) as exc:
        raise ProtobufError(f"malformed protobuf envelope: {exc}") from None
    schema = KINDS.get((api_version, kind))
    if schema is None:
        raise ProtobufError(f"protobuf is not supported for {kind} {api_version}")
    try:
        return {"apiVersion": api_version, "kind": kind, **_message(unknown.get(2, b""), schema)}
    except (ValueError, TypeError, AttributeError) as exc:  # wrong wire types, bad UTF-8
        raise ProtobufError(f"malformed protobuf body: {exc}") from None
