"""CustomResourceDefinition checks: what the real server refuses when a CRD is written.

A CRD that passes :func:`crd_errors` is safe for the rest of the emulator to trust: names and
versions are well formed, every schema node has the right shape (a structural schema, with
compilable patterns and CEL rules), printer columns and scale paths are usable.
"""

from __future__ import annotations

import re
from typing import Any

from .errors import FieldError

_TYPES = {"string", "integer", "number", "boolean", "object", "array"}
_COLUMN_TYPES = {"string", "integer", "number", "boolean", "date"}
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
_NUMBERS = ("minimum", "maximum", "multipleOf")
_FLAGS = (
    "nullable",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "uniqueItems",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource",
)
_STRINGS = ("format", "description", "title", "x-kubernetes-list-type", "x-kubernetes-map-type")


def _one_of(value: Any, allowed: set[str]) -> bool:
    return isinstance(value, str) and value in allowed


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _metadata_schema_errors(root: Any, path: str, out: list[FieldError]) -> None:
    """As kube-apiserver: the root's `metadata` may say only `type: object` and restrict name and generateName."""
    properties = root.get("properties") if isinstance(root, dict) else None
    metadata = properties.get("metadata") if isinstance(properties, dict) else None
    if not isinstance(metadata, dict):
        return
    rest = {key: value for key, value in metadata.items() if key not in ("type", "properties")}
    restricted = metadata.get("properties") or {}
    if (
        rest
        or metadata.get("type", "object") != "object"
        or not isinstance(restricted, dict)
        or set(restricted) - {"name", "generateName"}
    ):
        out.append(
            FieldError(
                f"{path}.properties[metadata]",
                "Forbidden",
                "must not specify anything other than name and generateName, but metadata is implicitly specified",
            )
        )


def _schema_errors(node: Any, path: str, out: list[FieldError]) -> None:
    if not isinstance(node, dict):
        out.append(FieldError(path, "Invalid value", "must be a schema object", node))
        return
    if "type" in node and not _one_of(node["type"], _TYPES):
        out.append(
            FieldError(
                f"{path}.type",
                "Unsupported value",
                "supported values: " + ", ".join(f'"{t}"' for t in sorted(_TYPES)),
                node["type"],
            )
        )
    for key in _COUNTS:
        if key in node and not (isinstance(node[key], int) and not isinstance(node[key], bool) and node[key] >= 0):
            out.append(FieldError(f"{path}.{key}", "Invalid value", "must be a non-negative integer", node[key]))
    for key in _NUMBERS:
        if key in node and not _is_number(node[key]):
            out.append(FieldError(f"{path}.{key}", "Invalid value", "must be a number", node[key]))
    for key in _FLAGS:
        if key in node and not isinstance(node[key], bool):
            out.append(FieldError(f"{path}.{key}", "Invalid value", "must be a boolean", node[key]))
    for key in _STRINGS:
        if key in node and not isinstance(node[key], str):
            out.append(FieldError(f"{path}.{key}", "Invalid value", "must be a string", node[key]))
    for key in ("required", "x-kubernetes-list-map-keys"):
        if key in node and not (isinstance(node[key], list) and all(isinstance(v, str) for v in node[key])):
            out.append(FieldError(f"{path}.{key}", "Invalid value", "must be a list of strings", node[key]))
    if "enum" in node and not isinstance(node["enum"], list):
        out.append(FieldError(f"{path}.enum", "Invalid value", "must be a list", node["enum"]))
    if "pattern" in node:
        try:
            re.compile(node["pattern"])
        except (re.error, TypeError) as exc:
            out.append(
                FieldError(
                    f"{path}.pattern", "Invalid value", f"must be a valid regular expression: {exc}", node["pattern"]
                )
            )
    properties = node.get("properties", {})
    if not isinstance(properties, dict):
        out.append(FieldError(f"{path}.properties", "Invalid value", "must be a map of schemas", properties))
    else:
        for name, sub in properties.items():
            _schema_errors(sub, f"{path}.properties[{name}]", out)
    additional = node.get("additionalProperties", True)
    if not isinstance(additional, bool):
        _schema_errors(additional, f"{path}.additionalProperties", out)
    if "items" in node:
        _schema_errors(node["items"], f"{path}.items", out)
    if "not" in node:
        _schema_errors(node["not"], f"{path}.not", out)
    for key in ("allOf", "anyOf", "oneOf"):
        if key in node:
            if not isinstance(node[key], list):
                out.append(FieldError(f"{path}.{key}", "Invalid value", "must be a list of schemas", node[key]))
            else:
                for i, sub in enumerate(node[key]):
                    _schema_errors(sub, f"{path}.{key}[{i}]", out)
    _rule_errors(node.get("x-kubernetes-validations", []), f"{path}.x-kubernetes-validations", out, node)
    if "default" in node and not out:
        _default_errors(node, path, out)


def _default_errors(node: dict[str, Any], path: str, out: list[FieldError]) -> None:
    """A default must pass its own schema's rules (after nested defaulting), or kube-apiserver refuses the CRD."""
    from kvtier.api.cel import validate_rules
    from kvtier.api.schema import prune_and_default

    defaulted = prune_and_default(node, node["default"], "", [])
    for failure in validate_rules(node, defaulted):
        field = f"{path}.default" + (f".{failure.field.lstrip('.')}" if failure.field else "")
        out.append(FieldError(field, "Invalid value", failure.message, node["default"]))


_FIELD_PATH_STEP = re.compile(r"\.([A-Za-z_$][\w$-]*)|\[(\d+)\]|\['([^']*)'\]")


def _field_path_resolves(schema: dict[str, Any], field_path: str) -> bool:
    """A rule's fieldPath names a field its schema declares (`.a.b`, `[0]`, `['key']`), as kube-apiserver requires."""
    node, position = schema, 0
    while position < len(field_path):
        step = _FIELD_PATH_STEP.match(field_path, position)
        if step is None or not isinstance(node, dict):
            return False
        position = step.end()
        if step.group(2) is not None:
            node = node.get("items")
        else:
            name = step.group(1) or step.group(3)
            properties = node.get("properties")
            properties = properties if isinstance(properties, dict) else {}
            additional = node.get("additionalProperties")
            node = (
                properties.get(name) if name in properties else (additional if isinstance(additional, dict) else None)
            )
        if node is None:
            return False
    return position > 0


def _rule_errors(rules: Any, path: str, out: list[FieldError], schema: dict[str, Any]) -> None:
    if not isinstance(rules, list):
        out.append(FieldError(path, "Invalid value", "must be a list of rules", rules))
        return
    for i, rule in enumerate(rules):
        where = f"{path}[{i}]"
        if not isinstance(rule, dict) or not isinstance(rule.get("rule"), str):
            out.append(FieldError(f"{where}.rule", "Required value"))
            continue
        for key in ("message", "fieldPath", "messageExpression", "reason"):
            if key in rule and not isinstance(rule[key], str):
                out.append(FieldError(f"{where}.{key}", "Invalid value", "must be a string", rule[key]))
        if isinstance(rule.get("fieldPath"), str) and not _field_path_resolves(schema, rule["fieldPath"]):
            out.append(FieldError(f"{where}.fieldPath", "Invalid value", "must be a valid path", rule["fieldPath"]))
        try:
            from kvtier.api.cel import compile_rule
        except ImportError:
            continue
        try:
            compile_rule(rule["rule"])
        except Exception as exc:  # any compile failure rejects the CRD, like the real server
            out.append(FieldError(f"{where}.rule", "Invalid value", f"compilation failed: {exc}", rule["rule"]))


def _path_ok(value: Any, prefixes: tuple[str, ...]) -> bool:
    return isinstance(value, str) and value.startswith(prefixes) and all(value.split(".")[1:])


def _version_errors(version: Any, path: str, out: list[FieldError]) -> None:
    if not isinstance(version, dict) or not isinstance(version.get("name"), str) or not version.get("name"):
        out.append(FieldError(f"{path}.name", "Required value"))
        return
    for key in ("served", "storage"):
        if key in version and not isinstance(version[key], bool):
            out.append(FieldError(f"{path}.{key}", "Invalid value", "must be a boolean", version[key]))
    schema = version.get("schema")
    if schema is not None:
        if not isinstance(schema, dict):
            out.append(FieldError(f"{path}.schema", "Invalid value", "must be an object", schema))
        elif "openAPIV3Schema" in schema:
            _schema_errors(schema["openAPIV3Schema"], f"{path}.schema.openAPIV3Schema", out)
            _metadata_schema_errors(schema["openAPIV3Schema"], f"{path}.schema.openAPIV3Schema", out)
    subresources = version.get("subresources") or {}
    if not isinstance(subresources, dict):
        out.append(FieldError(f"{path}.subresources", "Invalid value", "must be an object", subresources))
    elif "scale" in subresources:
        scale = subresources["scale"]
        where = f"{path}.subresources.scale"
        if not isinstance(scale, dict):
            out.append(FieldError(where, "Invalid value", "must be an object", scale))
        else:
            if not _path_ok(scale.get("specReplicasPath"), (".spec.",)):
                out.append(
                    FieldError(
                        f"{where}.specReplicasPath",
                        "Invalid value",
                        "should be a json path under .spec",
                        scale.get("specReplicasPath"),
                    )
                )
            if not _path_ok(scale.get("statusReplicasPath"), (".status.",)):
                out.append(
                    FieldError(
                        f"{where}.statusReplicasPath",
                        "Invalid value",
                        "should be a json path under .status",
                        scale.get("statusReplicasPath"),
                    )
                )
            selector = scale.get("labelSelectorPath")
            if selector is not None and not _path_ok(selector, (".spec.", ".status.")):
                out.append(
                    FieldError(
                        f"{where}.labelSelectorPath",
                        "Invalid value",
                        "should be a json path under either .spec or .status",
                        selector,
                    )
                )
    columns = version.get("additionalPrinterColumns", [])
    if not isinstance(columns, list):
        out.append(FieldError(f"{path}.additionalPrinterColumns", "Invalid value", "must be a list", columns))
        return
    for i, column in enumerate(columns):
        where = f"{path}.additionalPrinterColumns[{i}]"
        if not isinstance(column, dict):
            out.append(FieldError(where, "Invalid value", "must be an object", column))
            continue
        if not isinstance(column.get("name"), str) or not column["name"]:
            out.append(FieldError(f"{where}.name", "Required value"))
        if not _one_of(column.get("type"), _COLUMN_TYPES):
            out.append(
                FieldError(
                    f"{where}.type",
                    "Unsupported value",
                    "supported values: " + ", ".join(f'"{t}"' for t in sorted(_COLUMN_TYPES)),
                    column.get("type"),
                )
            )
        if not isinstance(column.get("jsonPath"), str) or not column["jsonPath"].lstrip("{").startswith("."):
            out.append(
                FieldError(f"{where}.jsonPath", "Invalid value", "must be a simple json path", column.get("jsonPath"))
            )
        if "priority" in column and not isinstance(column["priority"], int):
            out.append(FieldError(f"{where}.priority", "Invalid value", "must be an integer", column["priority"]))


def crd_errors(crd: dict[str, Any]) -> list[FieldError]:
    """Everything wrong with a CustomResourceDefinition (empty when it can be served)."""
    out: list[FieldError] = []
    spec = crd.get("spec") if isinstance(crd.get("spec"), dict) else {}
    names = spec.get("names") if isinstance(spec.get("names"), dict) else {}
    for field_name, value in (
        ("spec.group", spec.get("group")),
        ("spec.names.plural", names.get("plural")),
        ("spec.names.kind", names.get("kind")),
    ):
        if not isinstance(value, str) or not value:
            out.append(FieldError(field_name, "Required value"))
    for key in ("singular", "listKind"):
        if key in names and not isinstance(names[key], str):
            out.append(FieldError(f"spec.names.{key}", "Invalid value", "must be a string", names[key]))
    for key in ("shortNames", "categories"):
        if key in names and not (isinstance(names[key], list) and all(isinstance(v, str) for v in names[key])):
            out.append(FieldError(f"spec.names.{key}", "Invalid value", "must be a list of strings", names[key]))
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        out.append(
            FieldError(
                "spec.scope", "Unsupported value", 'supported values: "Cluster", "Namespaced"', spec.get("scope")
            )
        )
    if crd["metadata"]["name"] != f"{names.get('plural')}.{spec.get('group')}":
        out.append(
            FieldError(
                "metadata.name", "Invalid value", 'must be spec.names.plural+"."+spec.group', crd["metadata"]["name"]
            )
        )
    versions = spec.get("versions")
    if not isinstance(versions, list) or not versions:
        out.append(FieldError("spec.versions", "Required value", "must have at least one version"))
        return out
    for i, version in enumerate(versions):
        _version_errors(version, f"spec.versions[{i}]", out)
    if sum(1 for v in versions if isinstance(v, dict) and v.get("storage") is True) != 1:
        out.append(
            FieldError(
                "spec.versions", "Invalid value", "must have exactly one version marked as storage version", "array"
            )
        )
    return out
