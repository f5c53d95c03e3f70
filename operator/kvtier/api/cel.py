"""Kubernetes' CEL dialect for `x-kubernetes-validations`, evaluated with cel-python.

The standard CEL library comes from cel-python; on top of it this adds what kvtier's rules use
from the Kubernetes extension libraries: `quantity()`, `isQuantity()` and the quantity methods
(`compareTo`, `isGreaterThan`, `isLessThan`, `asInteger`, `sign`), `lowerAscii()` from the strings
library, and `fieldPath` reporting
the way the API server reports it. `oldSelf` is bound when an old object is given
(transition rules are skipped on create, as the API server does).
"""

from __future__ import annotations

import functools
from decimal import Decimal
from typing import Any, NamedTuple

import celpy
from celpy import celtypes

from kvtier.api.units import quantity_value


@functools.total_ordering
class KubernetesQuantity:
    """The value CEL's `quantity()` returns."""

    def __init__(self, value: Decimal):
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KubernetesQuantity) and self.value == other.value

    def __lt__(self, other: KubernetesQuantity) -> bool:
        return self.value < other.value

    def __hash__(self) -> int:
        return hash(self.value)


def _quantity(text: Any) -> KubernetesQuantity:
    return KubernetesQuantity(quantity_value(str(text)))


def _is_quantity(text: Any) -> celtypes.BoolType:
    try:
        quantity_value(str(text))
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _compare(left: KubernetesQuantity, right: KubernetesQuantity) -> celtypes.IntType:
    return celtypes.IntType((left.value > right.value) - (left.value < right.value))


def _as_integer(quantity: KubernetesQuantity) -> celtypes.IntType:
    if quantity.value != quantity.value.to_integral_value():
        raise ValueError("quantity is not an integer")
    return celtypes.IntType(int(quantity.value))


def _lower_ascii(text: celtypes.StringType) -> celtypes.StringType:
    """cel-go's `lowerAscii`: only A-Z change (`'ÄB'.lowerAscii() == 'Äb'`)."""
    return celtypes.StringType(text.translate(_ASCII_LOWER))


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")

KUBERNETES_FUNCTIONS: dict[str, Any] = {  # celpy's own annotation of functions is narrower than it accepts
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: celtypes.BoolType(a.value > b.value),
    "isLessThan": lambda a, b: celtypes.BoolType(a.value < b.value),
    "asInteger": _as_integer,
    "sign": lambda q: celtypes.IntType((q.value > 0) - (q.value < 0)),
    "lowerAscii": _lower_ascii,
}

_environment = celpy.Environment()


@functools.lru_cache(maxsize=1024)
def compile_rule(rule: str) -> celpy.Runner:
    """A compiled rule (cached: CRDs are validated far more often than they change)."""
    return _environment.program(_environment.compile(rule), functions=KUBERNETES_FUNCTIONS)


def _describe(error: BaseException) -> str:
    """An evaluation error in words: cel-python's errors carry (message, exception type, exception args)."""
    args = error.args
    if isinstance(error, celpy.CELEvalError) and len(args) >= 3 and args[2]:
        cause = args[2][0] if isinstance(args[2], tuple) else args[2]
        return str(cause)
    if args and isinstance(args[0], str):
        return args[0]
    return type(error).__name__


class RuleFailure(NamedTuple):
    """A failed rule: the field it blames (`fieldPath` if the rule names one) and its message.

    A rule that could not be evaluated blames the node it is written on, whatever its `fieldPath`, and
    shows the node's type as the value (`spec: Invalid value: "object": <error> evaluating rule: <message>`),
    as kube-apiserver does; `value_type` is that type then.
    """

    field: str
    message: str
    value_type: str | None = None


def _join(path: str, part: str | int) -> str:
    if isinstance(part, int):
        return f"{path}[{part}]"
    return f"{path}.{part}" if path else part


def _join_field_path(path: str, field_path: str) -> str:
    # fieldPath is written relative to the node: `.min`, `.engine.args`, `['key']`.
    return f"{path}{field_path}" if path else field_path.lstrip(".")


def validate_rules(schema: dict[str, Any], obj: Any, old: Any = None, *, path: str = "") -> list[RuleFailure]:
    """Evaluate every `x-kubernetes-validations` rule in `schema` against `obj` (and `old`)."""
    failures: list[RuleFailure] = []
    if obj is None:
        return failures
    if old is not None and obj == old and not _reads_old_self(schema):
        # Validation ratcheting (kube-apiserver's CRDValidationRatcheting, GA since 1.33): an update is not
        # refused for a value it leaves unchanged, so the rules on it need not run; transition rules still do.
        return failures
    for entry in schema.get("x-kubernetes-validations", ()):
        rule = entry["rule"]
        if "oldSelf" in rule and old is None:
            continue
        field = _join_field_path(path, entry["fieldPath"]) if entry.get("fieldPath") else path
        message = entry.get("message") or f"failed rule: {rule}"
        result: Any
        try:
            activation = {"self": celpy.json_to_cel(obj)}
            if old is not None:
                activation["oldSelf"] = celpy.json_to_cel(old)
            result = compile_rule(rule).evaluate(activation)
        except Exception as error:  # cel-python raises some evaluation errors instead of returning them
            result = error
        if isinstance(result, Exception):
            failures.append(
                RuleFailure(path, f"{_describe(result)} evaluating rule: {message}", schema.get("type", "object"))
            )
        elif not bool(result):
            failures.append(RuleFailure(field, message))
    if isinstance(obj, dict):
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            child = properties.get(key)
            where = _join(path, key)
            if child is None and isinstance(extra, dict):  # a map's value: `requests[cpu]`, as the server names it
                child, where = extra, f"{path}[{key}]"
            if child is not None:
                old_value = old.get(key) if isinstance(old, dict) else None
                failures += validate_rules(child, value, old_value, path=where)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(obj):
            failures += validate_rules(schema["items"], item, None, path=_join(path, index))
    return failures


_OLD_SELF: dict[int, tuple[dict[str, Any], bool]] = {}  # by id(schema), holding the schema so the id stays its own


def _reads_old_self(schema: dict[str, Any]) -> bool:
    """Whether a rule at or below this schema node is a transition rule (reads `oldSelf`)."""
    known = _OLD_SELF.get(id(schema))
    if known is not None and known[0] is schema:
        return known[1]

    def walk(node: Any) -> bool:
        if isinstance(node, dict):
            rules = node.get("x-kubernetes-validations")
            if isinstance(rules, list) and any(
                "oldSelf" in str(e.get("rule", "")) for e in rules if isinstance(e, dict)
            ):
                return True
            return any(walk(value) for value in node.values())
        return isinstance(node, list) and any(walk(value) for value in node)

    found = walk(schema)
    _OLD_SELF[id(schema)] = (schema, found)
    return found
