"""Request traces in the Mooncake JSONL format, read as a stream.

One JSON object a line: ``timestamp`` (milliseconds, or seconds with ``timestamp_unit="s"``),
``input_length`` and ``output_length`` (tokens) and ``hash_ids`` (one prefix-chained id per
block of the prompt). Arrival times are ``timestamp`` in seconds, multiplied by ``time_scale``,
then shifted by ``time_shift_seconds`` (the scenario format's ``timeScale`` / ``timeShiftSeconds``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

TimestampUnit = Literal["ms", "s"]

#: Bits reserved for a trace's own block ids; a namespace (one per tenant) occupies the bits above.
NAMESPACE_BITS = 40
_ID_LIMIT = 1 << NAMESPACE_BITS
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0}


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a trace: its arrival in virtual seconds and its prompt's block ids."""

    arrival: float
    input_tokens: int
    output_tokens: int
    blocks: tuple[int, ...]


def namespaced(block_id: int, namespace: int) -> int:
    """The global id of a trace block id inside a tenant's namespace."""
    return (namespace << NAMESPACE_BITS) | block_id


def iter_trace(
    path: str | os.PathLike[str],
    *,
    timestamp_unit: TimestampUnit = "ms",
    time_scale: float = 1.0,
    time_shift_seconds: float = 0.0,
    namespace: int = 0,
) -> Iterator[Request]:
    """Yield a trace's requests in file order; block ids are placed in ``namespace``.

    Raises ``ValueError`` naming the file and line for a malformed record.
    """
    if timestamp_unit not in _UNIT_SECONDS:
        raise ValueError(f"timestamp_unit must be 'ms' or 's', got {timestamp_unit!r}")
    if namespace < 0:
        raise ValueError(f"namespace must be >= 0, got {namespace}")
    factor = _UNIT_SECONDS[timestamp_unit] * time_scale
    offset = namespace << NAMESPACE_BITS
    loads = json.loads
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = loads(line)
                ids = record["hash_ids"]
                request = Request(
                    arrival=float(record["timestamp"]) * factor + time_shift_seconds,
                    input_tokens=int(record["input_length"]),
                    output_tokens=int(record["output_length"]),
                    blocks=tuple(ids) if not offset else tuple(offset | i for i in ids),
                )
                if ids and not (min(ids) >= 0 and max(ids) < _ID_LIMIT and all(type(i) is int for i in ids)):
                    raise ValueError(f"hash_ids must be integers in [0, 2**{NAMESPACE_BITS})")
            except (ValueError, KeyError, TypeError) as error:
                raise ValueError(f"{os.fspath(path)}:{number}: not a trace record: {error}") from error
            yield request


def load_trace(
    path: str | os.PathLike[str],
    *,
    timestamp_unit: TimestampUnit = "ms",
    time_scale: float = 1.0,
    time_shift_seconds: float = 0.0,
    namespace: int = 0,
) -> list[Request]:
    """All of a trace's requests, sorted by arrival (stable, so ties keep file order)."""
    requests = list(
        iter_trace(
            path,
            timestamp_unit=timestamp_unit,
            time_scale=time_scale,
            time_shift_seconds=time_shift_seconds,
            namespace=namespace,
        )
    )
    requests.sort(key=lambda request: request.arrival)
    return requests
