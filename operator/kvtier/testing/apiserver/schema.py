"""Validation of stored built-in objects; custom resources go through `kvtier.api.schema`, which
`kvtier validate` runs too.

Built-in kinds are validated against the real Kubernetes JSON schemas shipped with
kubernetes-validate (the strict variant, so unknown fields are found and then dropped like the
real server's decoder does), with one compiled validator cached per kind.
"""

from __future__ import annotations

import re
from typing import Any

from kvtier.api.fielderrors import FieldError, name_errors  # noqa: F401 - the server's errors and name checks are the API's
from kvtier.api.schema import _child, process_custom  # noqa: F401 - the server's pipeline

# -- built-in kinds ---------------------------------------------------------------------------


class BuiltinValidator:
    """Validate built-in objects against kubernetes-validate's JSON schemas, compiled once per kind."""

    _cache: dict[tuple[str, str], Any] = {}
    _registry: Any = None

    def _validator(self, api_version: str, kind: str) -> Any:
        key = (api_version, kind)
        if key not in self._cache:
            self._cache[key] = self._compile(api_version, kind)
        return self._cache[key]

    @classmethod
    def _compile(cls, api_version: str, kind: str) -> Any:
        import jsonschema
        from kubernetes_validate import utils
        from referencing import Registry, Resource

        version = utils.latest_version()
        schema_dir = f"kubernetes-json-schema/v{version}-local-strict"
        gv = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
        try:
            schema = utils.schema_contents(f"{schema_dir}/{kind.lower()}-{gv}.json", version)
        except (FileNotFoundError, OSError):
            return None
        if cls._registry is None:
            definitions = utils.schema_contents(f"{schema_dir}/_definitions.json", version)
            cls._registry = Resource.from_contents(definitions) @ Registry()
        registry = Resource.from_contents(schema) @ cls._registry
        return jsonschema.validators.Draft202012Validator(schema, registry=registry)

    def validate(self, obj: dict[str, Any]) -> tuple[list[FieldError], list[tuple[str | int, ...]]]:
        """(field errors, paths of unknown fields) of a built-in object."""
        validator = self._validator(obj.get("apiVersion", ""), obj.get("kind", ""))
        if validator is None:
            return [], []
        errors, unknown = [], []
        for error in validator.iter_errors(obj):
            parts = [str(p) for p in error.absolute_path]
            path = ".".join(p if not p.isdigit() else f"[{p}]" for p in parts).replace(".[", "[")
            if error.validator == "additionalProperties":
                names = re.findall(r"'([^']+)'", error.message.split("(", 1)[-1])
                unknown.extend(tuple(error.absolute_path) + (name,) for name in names)
            elif error.validator == "required":
                missing = re.match(r"'([^']+)'", error.message)
                name = missing.group(1) if missing else "?"
                errors.append(FieldError(_child(path, name), "Required value"))
            else:
                errors.append(FieldError(path, "Invalid value", error.message, error.instance))
        return errors, unknown


def drop_path(obj: Any, path: tuple[str | int, ...]) -> None:
    """Delete the field at `path` (map keys and list indexes) if it exists."""
    for part in path[:-1]:
        if isinstance(obj, dict):
            obj = obj.get(part)
        elif isinstance(obj, list) and isinstance(part, int) and part < len(obj):
            obj = obj[part]
        else:
            return
    if isinstance(obj, dict):
        obj.pop(path[-1], None)


def dotted(path: tuple[str | int, ...]) -> str:
    return ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in path).replace(".[", "[")
