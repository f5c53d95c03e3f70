"""Label and field selectors (the `labelSelector` / `fieldSelector` query parameters)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import bad_request

Predicate = Callable[[dict[str, Any]], bool]

_REQUIREMENT = re.compile(
    r"""\s*(?:
        (?P<not>!)\s*(?P<nkey>[\w./-]+)                                   # !key
      | (?P<skey>[\w./-]+)\s*(?P<setop>in|notin)\s*\((?P<values>[^)]*)\)  # key in (a,b)
      | (?P<key>[\w./-]+)\s*(?P<op>==|=|!=)\s*(?P<value>[\w./-]*)        # key=value
      | (?P<ekey>[\w./-]+)                                              # key
    )\s*(?:,|$)""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class _Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and labels[self.key] in self.values
        # "!=" and "notin" match objects without the label too.
        return not present or labels[self.key] not in self.values


def parse_label_selector(text: str | None) -> Predicate | None:
    """Parse a label selector string; None when it selects everything."""
    if not text or not text.strip():
        return None
    requirements: list[_Requirement] = []
    pos = 0
    while pos < len(text):
        m = _REQUIREMENT.match(text, pos)
        if not m or m.end() == pos:
            raise bad_request(f"unable to parse requirement: invalid label selector: {text!r}")
        pos = m.end()
        if m.group("nkey"):
            requirements.append(_Requirement(m.group("nkey"), "!exists"))
        elif m.group("skey"):
            values = frozenset(v.strip() for v in m.group("values").split(",") if v.strip())
            requirements.append(_Requirement(m.group("skey"), m.group("setop"), values))
        elif m.group("key"):
            op = "!=" if m.group("op") == "!=" else "="
            requirements.append(_Requirement(m.group("key"), op, frozenset([m.group("value")])))
        else:
            requirements.append(_Requirement(m.group("ekey"), "exists"))

    def predicate(obj: dict[str, Any]) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(r.matches(labels) for r in requirements)

    return predicate


def selector_to_string(selector: dict[str, Any] | None) -> str:
    """Render a LabelSelector object (matchLabels / matchExpressions) as a selector string."""
    if not selector:
        return ""
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        op, key, values = expr.get("operator"), expr.get("key"), expr.get("values") or []
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
    return ",".join(parts)


# Field selectors the real server supports beyond metadata.name / metadata.namespace.
_EXTRA_FIELDS = {
    "pods": {
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    },
    "events": {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
        "regarding.kind",
        "regarding.name",
        "regarding.namespace",
        "regarding.uid",
    },
    "secrets": {"type"},
    "nodes": {"spec.unschedulable"},
    "namespaces": {"status.phase"},
}


def _field_value(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_field_selector(text: str | None, plural: str) -> Predicate | None:
    """Parse a field selector (`a=b`, `a==b`, `a!=b`, comma-separated); None selects everything."""
    if not text or not text.strip():
        return None
    allowed = {"metadata.name", "metadata.namespace"} | _EXTRA_FIELDS.get(plural, set())
    terms: list[tuple[str, bool, str]] = []
    for term in text.split(","):
        m = re.fullmatch(r"\s*([\w.]+)\s*(==|=|!=)\s*(.*?)\s*", term)
        if not m:
            raise bad_request(f"invalid field selector: {term!r}")
        path, op, value = m.groups()
        if path not in allowed:
            raise bad_request(f"field label not supported: {path}")
        terms.append((path, op != "!=", value))

    def predicate(obj: dict[str, Any]) -> bool:
        return all((_field_value(obj, path) == value) == equal for path, equal, value in terms)

    return predicate


def combine(*predicates: Predicate | None) -> Predicate | None:
    active = [p for p in predicates if p is not None]
    if not active:
        return None
    if len(active) == 1:
        return active[0]
    return lambda obj: all(p(obj) for p in active)
