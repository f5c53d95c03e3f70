"""Cross-field rules written once as CEL for the API server (`x-kubernetes-validations`).

The pydantic validators implement the same rules in Python so `kvtier validate` answers
offline; `tests/unit/test_api_invalid.py` holds both to the same verdicts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def cel_literal(text: str) -> str:
    """A CEL single-quoted string literal holding `text` exactly."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass(frozen=True)
class Rule:
    """One `x-kubernetes-validations` entry; `field_path` is relative to the node (`.min`)."""

    rule: str
    message: str
    field_path: str | None = None
    reason: str | None = None

    def as_schema(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"rule": self.rule, "message": self.message}
        if self.field_path:
            entry["fieldPath"] = self.field_path
        if self.reason:
            entry["reason"] = self.reason
        return entry


def cel_rules(*rules: Rule) -> dict[str, Any]:
    """`json_schema_extra` for a model whose node carries these rules."""
    return {"x-kubernetes-validations": [rule.as_schema() for rule in rules]}
