"""Validation problems as Kubernetes names them: a field path and what is wrong with it."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError


class FieldProblem(ValueError):
    """Raised by a cross-field validator to blame one field (relative to the model, `storage.min`)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Problem:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


def _path(parts: list[str | int]) -> str:
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def problems(error: ValidationError, prefix: tuple[str | int, ...] = ()) -> list[Problem]:
    """One :class:`Problem` per pydantic error, the path in wire names (`spec.engine.args[2]`)."""
    found = []
    for entry in error.errors(include_url=False):
        # Tagged-union and function-validator steps add loc parts that are not fields.
        loc: list[str | int] = [*prefix, *(p for p in entry["loc"] if not _is_internal(p))]
        message = entry["msg"]
        cause = (entry.get("ctx") or {}).get("error")
        if isinstance(cause, FieldProblem):
            loc.extend(int(part) if part.isdigit() else part for part in cause.field.split("."))
            message = cause.message
        elif entry["type"] == "value_error":
            message = message.removeprefix("Value error, ")
        elif entry["type"] == "extra_forbidden":
            message = "unknown field"
        elif entry["type"] == "missing":
            message = "required field is missing"
        found.append(Problem(_path(loc), message))
    return found


def _is_internal(part: str | int) -> bool:
    return isinstance(part, str) and (part.startswith("function-") or part.endswith("]"))
