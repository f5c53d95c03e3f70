"""Fault injection and the request log, both safe to use from test threads."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any

_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@dataclass
class RequestRecord:
    """One API request as the server understood it (Kubernetes verb, not HTTP method)."""

    verb: str  # get, list, watch, create, update, patch, delete, deletecollection, or the HTTP method for non-resource paths
    path: str
    group: str | None = None
    version: str | None = None
    resource: str | None = None
    subresource: str | None = None
    namespace: str | None = None
    name: str | None = None
    user_agent: str = ""
    query: dict[str, str] = field(default_factory=dict)
    content_type: str = ""
    status: int | None = None
    time: float = field(default_factory=time.time)


class RequestLog:
    """Every request the server received, in arrival order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[RequestRecord] = []

    def append(self, record: RequestRecord) -> None:
        with self._lock:
            self._records.append(record)

    def clear(self) -> None:
        with self._lock:
            self._records.clear()

    @property
    def records(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._records)

    def filter(self, **criteria: Any) -> list[RequestRecord]:
        """Records whose attributes equal all `criteria` (e.g. `verb="patch", resource="pods"`)."""
        return [r for r in self.records if all(getattr(r, k) == v for k, v in criteria.items())]

    def __iter__(self) -> Iterator[RequestRecord]:
        return iter(self.records)

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)


_MATCH_FIELDS = ("verb", "group", "resource", "subresource", "namespace", "name")


@dataclass
class FaultRule:
    """Requests matching every non-None selector get the fault, `times` times (None: forever).

    Faults: `status` answers with that error code (a Status with `reason`/`message`, and a
    `Retry-After` header when `retry_after` is set); `delay` sleeps before answering (combined with
    `status`, or alone); `drop_watch_after` ends a matching watch stream after that many seconds.
    """

    verb: str | None = None
    group: str | None = None
    resource: str | None = None
    subresource: str | None = None
    namespace: str | None = None
    name: str | None = None
    status: int | None = None
    reason: str | None = None
    message: str | None = None
    retry_after: float | None = None
    delay: float = 0.0
    drop_watch_after: float | None = None
    times: int | None = 1
    hits: int = 0

    def matches(self, record: RequestRecord) -> bool:
        return all(getattr(self, f) is None or getattr(self, f) == getattr(record, f) for f in _MATCH_FIELDS)

    @property
    def exhausted(self) -> bool:
        return self.times is not None and self.hits >= self.times

    @property
    def status_reason(self) -> str:
        return self.reason or _REASONS.get(self.status or 500, "InternalError")


class FaultInjector:
    """The active fault rules; the first matching, not yet exhausted rule applies."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = []

    def add(self, **kwargs: Any) -> FaultRule:
        names = {f.name for f in fields(FaultRule)}
        unknown = set(kwargs) - names
        if unknown:
            raise TypeError(f"unknown fault rule fields: {sorted(unknown)}")
        rule = FaultRule(**kwargs)
        with self._lock:
            self._rules.append(rule)
        return rule

    def remove(self, rule: FaultRule) -> None:
        with self._lock:
            if rule in self._rules:
                self._rules.remove(rule)

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    @property
    def rules(self) -> list[FaultRule]:
        with self._lock:
            return list(self._rules)

    def take(self, record: RequestRecord) -> FaultRule | None:
        """The rule that applies to this request, counting the hit."""
        with self._lock:
            for rule in self._rules:
                if not rule.exhausted and rule.matches(record):
                    rule.hits += 1
                    return rule
        return None
