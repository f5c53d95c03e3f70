"""Kubernetes quantities (`10Ti`, `500Gi`, `12500000000`) and Go durations (`60s`, `1h30m`).

Both are kept as plain numbers inside the models (bytes as `int`, durations as `float`
seconds) and written back in their wire form, so arithmetic never sees a suffix.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

from kvtier.api.rules import Rule, cel_literal, cel_rules

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}

#: Any Kubernetes quantity (`resource.Quantity`): `500m`, `64Gi`, `1e3`, `-2`.
KUBERNETES_QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
#: A resource request or limit: any quantity but a negative one (the API server refuses those in a pod).
RESOURCE_QUANTITY_PATTERN = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
#: Longest quantity string accepted (bounds the cost of the CEL rules that read quantities).
MAX_QUANTITY_LENGTH = 64
_KUBERNETES_QUANTITY_RE = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<binary>[KMGTPE]i)|(?P<decimal>[numkMGTPE])|[eE](?P<exponent>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)))?$"
)


#: Exponents beyond this are out of any quantity's range (and would overflow Decimal's context).
_MAX_EXPONENT = 1000


def quantity_value(text: str) -> Decimal:
    """The exact value of any Kubernetes quantity string."""
    match = _KUBERNETES_QUANTITY_RE.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a Kubernetes quantity")
    number = Decimal(match["number"])
    if match["binary"]:
        return number * _BINARY[match["binary"]]
    if match["decimal"]:
        return number * _DECIMAL[match["decimal"]]
    if match["exponent"]:
        exponent = Decimal(match["exponent"])
        if abs(exponent) > _MAX_EXPONENT:  # resource.Quantity refuses these too, rather than overflow
            raise ValueError(f"{text!r} is out of range for a Kubernetes quantity")
        return number * Decimal(10) ** exponent
    return number


#: A non-negative byte quantity: digits, an optional fraction, an optional binary or decimal suffix.
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?([KMGTPE]i|[kMGTPE])?$"
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)

#: Longest duration string accepted (bounds the cost of the CEL rules that read durations).
MAX_DURATION_LENGTH = 32
#: A Go duration made of positive parts: `90s`, `5m`, `1h30m`, `1.5h`.
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
_DURATION_RE = re.compile(DURATION_PATTERN)
_DURATION_PART_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_DURATION_UNIT_SECONDS = {"ms": Decimal("0.001"), "s": Decimal(1), "m": Decimal(60), "h": Decimal(3600)}


def unless_malformed(rule: str, *, quantities: tuple[str, ...] = (), durations: tuple[str, ...] = ()) -> str:
    """`rule` behind a CEL guard: it holds when any of the named fields is not well formed (that field's
    own rule or pattern refuses it), so `quantity()` and `duration()` only ever see what they can read.

    Unguarded, kube-apiserver reports a malformed value twice (its field's error, and the rule's evaluation
    error on the node), and `quantity('1e99999999999')` parses to a number of a billion digits whose
    comparison outlasts the request (a Timeout instead of a 422; found on the real control plane).
    """
    checks = [f"string({q}).matches({cel_literal(QUANTITY_PATTERN)})" for q in quantities]
    checks += [f"{d}.matches({cel_literal(DURATION_PATTERN)})" for d in durations]
    return f"!({' && '.join(checks)}) || {rule}" if checks else rule


def parse_quantity(value: Any) -> int:
    """Bytes in a Kubernetes quantity, rounded up like `resource.Quantity.Value()`."""
    if isinstance(value, bool):
        raise ValueError("must be a quantity such as 500Gi or 12500000000, not a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"must not be negative, got {value}")
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"must be a non-negative finite number, got {value}")
        return math.ceil(value)
    if not isinstance(value, str):
        raise ValueError(f"must be a quantity such as 500Gi or 12500000000, got {type(value).__name__}")
    if len(value) > MAX_QUANTITY_LENGTH:
        raise ValueError(f"may not be more than {MAX_QUANTITY_LENGTH} bytes")
    if not _QUANTITY_RE.match(value.strip()):
        raise ValueError(f"{value!r} is not a non-negative quantity such as 500Gi, 1.5Ti or 12500000000")
    return math.ceil(quantity_value(value))


def format_quantity(value: int) -> str:
    """The shortest exact wire form of a byte count: `10Ti`, `500G`, `12345`."""
    if value == 0:
        return "0"
    for suffix, multiplier in reversed(_BINARY.items()):
        if value % multiplier == 0:
            return f"{value // multiplier}{suffix}"
    for suffix in ("E", "P", "T", "G", "M", "k"):
        multiplier = int(_DECIMAL[suffix])
        if value % multiplier == 0:
            return f"{value // multiplier}{suffix}"
    return str(value)


#: Bytes of one GiB (LMCache's `*_gb` sizes and its quota API's `limit_gb` are GiB).
GIB = 2**30


def gib(value: int) -> float:
    """Bytes as the plain GiB float that LMCache's size keys and flags expect."""
    return value / GIB


def parse_duration(value: Any) -> float:
    """Seconds in a Go duration string (a bare number is taken as seconds)."""
    if isinstance(value, bool):
        raise ValueError("must be a duration such as 60s or 5m, not a boolean")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"must be a non-negative duration, got {value}")
        return float(value)
    if isinstance(value, str) and len(value) > MAX_DURATION_LENGTH:
        raise ValueError(f"may not be more than {MAX_DURATION_LENGTH} bytes")
    if not isinstance(value, str) or not _DURATION_RE.match(value.strip()):
        raise ValueError(f"{value!r} is not a duration such as 60s, 5m or 1h30m")
    try:
        total = sum(Decimal(n) * _DURATION_UNIT_SECONDS[u] for n, u in _DURATION_PART_RE.findall(value))
    except InvalidOperation as error:  # pragma: no cover - the pattern admits only decimals
        raise ValueError(f"{value!r} is not a duration") from error
    return float(total)


def format_duration(seconds: float) -> str:
    """Go-style wire form: `90s` -> `1m30s`, `0.5` -> `500ms`."""
    millis = round(seconds * 1000)
    if millis % 1000:
        return f"{millis}ms"
    whole = millis // 1000
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else "", f"{secs}s" if secs else ""]
    return "".join(parts) or "0s"


#: Bytes on the wire as an int-or-string quantity; the CEL rule keeps a real API server as strict as pydantic.
Quantity = Annotated[
    int,
    BeforeValidator(parse_quantity),
    PlainSerializer(format_quantity, return_type=str, when_used="json"),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            # Bounds the CEL rule's estimated cost: a real API server refuses a CRD whose rules could exceed
            # its budget, and these quantities sit in lists (pool namespaces, the ledger).
            "maxLength": MAX_QUANTITY_LENGTH,
            **cel_rules(
                Rule(
                    f"string(self).matches({cel_literal(QUANTITY_PATTERN)})",
                    "must be a non-negative quantity such as 500Gi, 1.5Ti or 12500000000",
                )
            ),
        }
    ),
]

#: Seconds on the wire as a Go duration string.
Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "pattern": DURATION_PATTERN, "maxLength": MAX_DURATION_LENGTH}),
]


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """A count in words for messages people read: `1 deployment`, `3 deployments`, `no deployment`."""
    if count == 0:
        return f"no {noun}"
    return f"{count} {noun if count == 1 else plural or noun + 's'}"
