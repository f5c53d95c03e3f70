"""The API server's validation of kvtier's custom resources, as a library: `kvtier validate` and the
embedded API server run this same code, so they report the same errors with the same field paths.

The pipeline is the real server's for a CRD's structural schema, in its order: drop `null`s of
non-nullable fields, prune unknown fields (unless `x-kubernetes-preserve-unknown-fields`), apply
`default`s (recursively, including inside defaulted objects), validate (types, int-or-string, enum,
formats, bounds, lengths, pattern, required, items/properties counts, list-type set/map uniqueness,
allOf/anyOf/oneOf/not), and finally the `x-kubernetes-validations` CEL rules
(:func:`kvtier.api.cel.validate_rules`), which run only when the structural validation passed
(rules may assume well-typed input). Errors are apimachinery `field.Error`s
(:class:`kvtier.api.fielderrors.FieldError`; object names are checked there too, as the server checks them).
"""

from __future__ import annotations

import base64
import binascii
import copy
import ipaddress
import re
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

from kvtier.api.fielderrors import FieldError

_ROOT_FIELDS = ("apiVersion", "kind", "metadata")

_FORMATS: dict[str, Callable[[Any], bool]] = {}


def _format(name: str) -> Callable[[Callable[[Any], bool]], Callable[[Any], bool]]:
    def register(fn: Callable[[Any], bool]) -> Callable[[Any], bool]:
        _FORMATS[name] = fn
        return fn

    return register


_DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
_DATE = re.compile(r"^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_DURATION = re.compile(r"^-?(\d+(\.\d+)?(ns|us|µs|ms|s|m|h|d|w))+$")
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", re.I)
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")

_format("date-time")(lambda v: bool(_DATE_TIME.match(v)))
_format("datetime")(lambda v: bool(_DATE_TIME.match(v)))
_format("date")(lambda v: bool(_DATE.match(v)))
_format("uuid")(lambda v: bool(_UUID.match(v)))
_format("duration")(lambda v: bool(_DURATION.match(v)))
_format("hostname")(lambda v: bool(_HOSTNAME.match(v)))
_format("email")(lambda v: bool(_EMAIL.match(v)))
_format("int32")(lambda v: -(2**31) <= v < 2**31)
_format("int64")(lambda v: -(2**63) <= v < 2**63)


@_format("byte")
def _is_base64(v: str) -> bool:
    try:
        base64.b64decode(v, validate=True)
        return True
    except (binascii.Error, ValueError):
        return False


def _parses(parser: Callable[[str], Any]) -> Callable[[str], bool]:
    def check(v: str) -> bool:
        try:
            parser(v)
            return True
        except ValueError:
            return False

    return check


_format("ipv4")(_parses(ipaddress.IPv4Address))
_format("ipv6")(_parses(ipaddress.IPv6Address))
_format("cidr")(_parses(lambda v: ipaddress.ip_network(v, strict=False)))
_format("uri")(lambda v: bool(urllib.parse.urlparse(v).scheme))


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _type_ok(expected: str, value: Any) -> bool:
    actual = _type_name(value)
    if expected == "number":
        return actual in ("integer", "number")
    if expected == "integer" and isinstance(value, float) and value.is_integer():
        return True
    return actual == expected


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# -- pruning and defaulting -------------------------------------------------------------------


def prune_and_default(schema: dict[str, Any], value: Any, path: str, unknown: list[str]) -> Any:
    """Return a copy of `value` with nulls dropped, unknown fields pruned and defaults applied.

    Paths of pruned fields are appended to `unknown` (for `fieldValidation=Strict/Warn`).
    """
    if isinstance(value, dict):
        return _prune_map(schema, value, path, unknown, root=not path)
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            return [prune_and_default(items, v, f"{path}[{i}]", unknown) for i, v in enumerate(value)]
        return copy.deepcopy(value)
    return value


def _prune_map(schema: dict[str, Any], value: dict[str, Any], path: str, unknown: list[str], root: bool) -> Any:
    if schema.get("type") not in (None, "object") and not schema.get("x-kubernetes-int-or-string"):
        return copy.deepcopy(value)  # wrong type: left for validation to report
    properties: dict[str, Any] = schema.get("properties") or {}
    additional = schema.get("additionalProperties")
    preserve = schema.get("x-kubernetes-preserve-unknown-fields", False)
    keep_meta = root or schema.get("x-kubernetes-embedded-resource", False)
    result: dict[str, Any] = {}
    for key, item in value.items():
        sub = properties.get(key)
        if sub is None and isinstance(additional, dict):
            sub = additional
        if keep_meta and key in _ROOT_FIELDS:  # ObjectMeta is never pruned, whatever the schema says
            result[key] = copy.deepcopy(item)
            continue
        if item is None and not (sub or {}).get("nullable", False):
            continue
        if sub is not None:
            result[key] = prune_and_default(sub, item, _child(path, key), unknown)
        elif preserve or additional is True:
            result[key] = copy.deepcopy(item)
        else:
            unknown.append(_child(path, key))
    for key, sub in properties.items():
        if key not in result and "default" in sub and not (keep_meta and key in _ROOT_FIELDS):
            result[key] = prune_and_default(sub, copy.deepcopy(sub["default"]), _child(path, key), unknown)
    return result


# -- validation -------------------------------------------------------------------------------


def validate_value(schema: dict[str, Any], value: Any, path: str, errors: list[FieldError]) -> None:
    """Append a FieldError for every violation of `schema` by `value` at `path`."""
    if value is None:
        if not schema.get("nullable", False):
            expected = schema.get("type") or "object"
            errors.append(
                FieldError(
                    path,
                    "Invalid value",
                    f'{path} in body must be of type {expected}: "null"',
                    "null",
                    type_invalid=True,
                )
            )
        return
    expected = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(value, (int, str)) or isinstance(value, bool):
            errors.append(
                FieldError(
                    path,
                    "Invalid value",
                    f'{path} in body must be of type integer,string: "{_type_name(value)}"',
                    _type_name(value),
                    type_invalid=True,
                )
            )
            return
    elif expected and not _type_ok(expected, value):
        got = _type_name(value)
        errors.append(
            FieldError(
                path, "Invalid value", f'{path} in body must be of type {expected}: "{got}"', got, type_invalid=True
            )
        )
        return

    for sub in schema.get("allOf") or []:
        validate_value(sub, value, path, errors)
    _combinators(schema, value, path, errors)

    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(_quote(v) for v in schema["enum"])
        errors.append(FieldError(path, "Unsupported value", f"supported values: {allowed}", value))

    if isinstance(value, str):
        _validate_string(schema, value, path, errors)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        _validate_number(schema, value, path, errors)
    elif isinstance(value, list):
        _validate_list(schema, value, path, errors)
    elif isinstance(value, dict):
        _validate_map(schema, value, path, errors)


def _quote(v: Any) -> str:
    return f'"{v}"' if isinstance(v, str) else str(v)


def _combinators(schema: dict[str, Any], value: Any, path: str, errors: list[FieldError]) -> None:
    def passes(sub: dict[str, Any]) -> bool:
        trial: list[FieldError] = []
        validate_value(sub, value, path, trial)
        return not trial

    if "anyOf" in schema and not any(passes(s) for s in schema["anyOf"]):
        errors.append(FieldError(path, "Invalid value", "must validate at least one schema (anyOf)", value))
    if "oneOf" in schema and sum(passes(s) for s in schema["oneOf"]) != 1:
        errors.append(FieldError(path, "Invalid value", "must validate one and only one schema (oneOf)", value))
    if "not" in schema and passes(schema["not"]):
        errors.append(FieldError(path, "Invalid value", "must not validate the schema (not)", value))


def _validate_string(schema: dict[str, Any], value: str, path: str, errors: list[FieldError]) -> None:
    fmt = schema.get("format")
    if fmt in _FORMATS and fmt not in ("int32", "int64") and not _FORMATS[fmt](value):
        errors.append(
            FieldError(
                path, "Invalid value", f'{path} in body must be of type {fmt}: "{value}"', value, type_invalid=True
            )
        )
    if "minLength" in schema and len(value) < schema["minLength"]:
        errors.append(
            FieldError(
                path, "Invalid value", f"{path} in body should be at least {schema['minLength']} chars long", value
            )
        )
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        errors.append(FieldError(path, "Too long", f"may not be more than {schema['maxLength']} bytes", value))
    if "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(FieldError(path, "Invalid value", f"{path} in body should match '{schema['pattern']}'", value))


def _validate_number(schema: dict[str, Any], value: float, path: str, errors: list[FieldError]) -> None:
    fmt = schema.get("format")
    if fmt in ("int32", "int64") and not _FORMATS[fmt](value):
        errors.append(
            FieldError(
                path, "Invalid value", f'{path} in body must be of type {fmt}: "{value}"', value, type_invalid=True
            )
        )
    if "maximum" in schema:
        limit = schema["maximum"]
        if schema.get("exclusiveMaximum") is True and value >= limit:
            errors.append(FieldError(path, "Invalid value", f"{path} in body should be less than {limit}", value))
        elif value > limit:
            errors.append(
                FieldError(path, "Invalid value", f"{path} in body should be less than or equal to {limit}", value)
            )
    if "minimum" in schema:
        limit = schema["minimum"]
        if schema.get("exclusiveMinimum") is True and value <= limit:
            errors.append(FieldError(path, "Invalid value", f"{path} in body should be greater than {limit}", value))
        elif value < limit:
            errors.append(
                FieldError(path, "Invalid value", f"{path} in body should be greater than or equal to {limit}", value)
            )
    step = schema.get("multipleOf")
    if step and (value / step) != int(value / step):
        errors.append(FieldError(path, "Invalid value", f"{path} in body should be a multiple of {step}", value))


def _validate_list(schema: dict[str, Any], value: list[Any], path: str, errors: list[FieldError]) -> None:
    if "minItems" in schema and len(value) < schema["minItems"]:
        errors.append(
            FieldError(
                path, "Invalid value", f"{path} in body should have at least {schema['minItems']} items", len(value)
            )
        )
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        errors.append(FieldError(path, "Too many", f"must have at most {schema['maxItems']} items", len(value)))
    list_type = schema.get("x-kubernetes-list-type")
    if schema.get("uniqueItems") or list_type == "set":
        seen: list[Any] = []
        for i, item in enumerate(value):
            if item in seen:
                errors.append(FieldError(f"{path}[{i}]", "Duplicate value", value=item))
            seen.append(item)
    elif list_type == "map":
        keys = schema.get("x-kubernetes-list-map-keys") or []
        seen_keys: set[str] = set()
        for i, item in enumerate(value):
            if isinstance(item, dict):
                ident = repr(tuple(item.get(k) for k in keys))
                if ident in seen_keys:
                    errors.append(FieldError(f"{path}[{i}]", "Duplicate value", value={k: item.get(k) for k in keys}))
                seen_keys.add(ident)
    items = schema.get("items")
    if isinstance(items, dict):
        for i, item in enumerate(value):
            validate_value(items, item, f"{path}[{i}]", errors)


def _validate_map(schema: dict[str, Any], value: dict[str, Any], path: str, errors: list[FieldError]) -> None:
    for name in schema.get("required") or []:
        if name not in value:
            errors.append(FieldError(_child(path, name), "Required value"))
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        errors.append(
            FieldError(
                path,
                "Invalid value",
                f"{path} in body should have at least {schema['minProperties']} properties",
                len(value),
            )
        )
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        errors.append(FieldError(path, "Too many", f"must have at most {schema['maxProperties']} items", len(value)))
    properties = schema.get("properties") or {}
    additional = schema.get("additionalProperties")
    embedded = not path or schema.get("x-kubernetes-embedded-resource", False)
    for key, item in value.items():
        if embedded and key in _ROOT_FIELDS:
            if key == "metadata" and isinstance(item, dict):  # a schema may restrict only these two
                meta = (properties.get("metadata") or {}).get("properties") or {}
                for field in ("name", "generateName"):
                    if field in meta and field in item:
                        validate_value(meta[field], item[field], _child(_child(path, "metadata"), field), errors)
            continue
        sub = properties.get(key)
        if sub is None and isinstance(additional, dict):
            validate_value(additional, item, _child(path, key), errors)
        elif sub is not None:
            validate_value(sub, item, _child(path, key), errors)


# -- custom resources -------------------------------------------------------------------------


def _value_at(obj: Any, path: str) -> Any:
    for part in re.findall(r"[^.\[\]]+", path):
        if isinstance(obj, dict):
            obj = obj.get(part)
        elif isinstance(obj, list) and part.isdigit() and int(part) < len(obj):
            obj = obj[int(part)]
        else:
            return None
    return obj


def cel_errors(schema: dict[str, Any], obj: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    """Failed `x-kubernetes-validations` rules, each blaming its field."""
    from kvtier.api.cel import validate_rules

    return [
        FieldError(failure.field, "Invalid value", failure.message, failure.value_type or _value_at(obj, failure.field))
        for failure in validate_rules(schema, obj, old)
    ]


#: How Go names the type of a decoded JSON value (`%T` of unstructured content).
_GO_TYPE_NAMES = {
    str: "string",
    float: "float64",
    bool: "bool",
    list: "[]interface {}",
    dict: "map[string]interface {}",
}


def scale_errors(spec_replicas_path: str | None, obj: dict[str, Any]) -> list[FieldError]:
    """The scale subresource's check of a create or update (apiextensions-apiserver's `ValidateScaleSpec`):
    the replica count at `specReplicasPath` (as written there, `.spec.replicas`) is a non-negative int32."""
    if not spec_replicas_path:
        return []
    value: Any = obj
    for part in spec_replicas_path.lstrip(".").split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return []
    if isinstance(value, bool) or not isinstance(value, int):
        type_name = _GO_TYPE_NAMES.get(type(value), "unknown")
        detail = f"{spec_replicas_path} accessor error: {value} is of the type {type_name}, expected int64"
        return [FieldError(spec_replicas_path, "Invalid value", detail, 0)]
    if value < 0:
        return [FieldError(spec_replicas_path, "Invalid value", "should be a non-negative integer", value)]
    if value > 2**31 - 1:
        return [FieldError(spec_replicas_path, "Invalid value", f"should be less than or equal to {2**31 - 1}", value)]
    return []


def _has_rules(schema: Any) -> bool:
    if isinstance(schema, dict):
        return "x-kubernetes-validations" in schema or any(_has_rules(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_has_rules(v) for v in schema)
    return False


#: What the server adds when it skips the CEL rules because of earlier errors (`field.Invalid(nil, nil, ...)`).
RULES_NOT_CHECKED = FieldError(
    "<nil>",
    "Invalid value",
    "some validation rules were not checked because the object "
    "was invalid; correct the existing errors to complete validation",
    None,
)


#: Errors after which the server does not evaluate the CEL rules (the object lacks the shape they were
#: written for): apiextensions-apiserver's `hasBlockingErr` (NotSupported, Required, TooLong, TooMany, TypeInvalid).
_BLOCKING = ("Unsupported value", "Required value", "Too long", "Too many")


def blocks_rules(error: FieldError) -> bool:
    """Whether kube-apiserver skips the CEL rules after this error."""
    return error.type_invalid or error.kind in _BLOCKING


def process_custom(
    schema: dict[str, Any] | None,
    obj: dict[str, Any],
    old: dict[str, Any] | None,
    earlier: Sequence[FieldError] = (),
    spec_replicas_path: str | None = None,
) -> tuple[dict[str, Any], list[FieldError], list[str]]:
    """Prune, default and validate a custom resource: (new object, errors, pruned field paths).

    As the server's `customResourceStrategy.Validate`: the schema, then the scale subresource's replica
    count (`spec_replicas_path`, for kinds that have one), then the CEL rules unless an error so far
    (`earlier`: the metadata checks', then these) is a blocking one (`blocks_rules`); then one fieldless
    error says they were skipped. Bounds, patterns and duplicates do not block them.
    """
    if not schema:
        return obj, [], []
    unknown: list[str] = []
    result = prune_and_default(schema, obj, "", unknown)
    errors: list[FieldError] = []
    validate_value({**schema, "type": "object"}, result, "", errors)
    errors += scale_errors(spec_replicas_path, result)
    if not _has_rules(schema):
        return result, errors, unknown
    if any(blocks_rules(error) for error in [*earlier, *errors]):
        errors.append(RULES_NOT_CHECKED)
    else:
        errors += cel_errors(schema, result, old)
    return result, errors, unknown
