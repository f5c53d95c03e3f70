"""A forgiving, bounded parser of the Prometheus text exposition format.

``parse_exposition(body, *, max_bytes=MAX_BYTES, max_series=MAX_SERIES) -> Page``

It never raises (any ``bytes`` or ``str``): every line it cannot read is skipped and reported as
a :class:`Problem` (line number, what), so a caller can say why a series is missing. What it
reads it reads exactly: a sample either keeps the number on the wire or is dropped, never
approximated. In detail:

- Samples ``name{label="value",...} value [timestamp]``: names may hold colons
  (``vllm:kv_cache_usage_perc``); label values may hold commas, braces, ``=`` and the escapes
  ``\\\\``, ``\\"`` and ``\\n``; values are Go-style floats (``NaN``, ``+Inf``, ``-Inf``,
  exponents); an OpenMetrics exemplar (`` # {...} ...``) after the value is ignored.
- ``# TYPE`` lines are recorded in :attr:`Page.types` wherever they appear (also after the
  samples); ``# HELP``, other comments and ``# EOF`` are skipped; missing HELP/TYPE is fine.
- A repeated series (same name and label set, in any label order) keeps its first value.
- Invalid UTF-8 is decoded with replacement characters (and reported); a line with a NUL byte
  or any other garbage is skipped.
- The last line is kept only when it ends with a newline: a body cut short mid-line would
  otherwise yield a wrong number (``12`` of ``1234``). Every exporter ends its page with one.
- Bounds: only the first ``max_bytes`` bytes (up to the last full line) and the first
  ``max_series`` series are read; :attr:`Page.truncated` says so.
- ``names``, when given, are the only sample names (as on the wire) read: a line of another name is
  skipped unread, neither a sample, a series nor a problem. A line that does not start with a name
  is still read and reported.

Samples are indexed by their name on the wire (``x_total``, ``x_bucket``, ``x_sum``...):
:meth:`Page.samples_of` lists them and :meth:`Page.sum` adds up the ones whose labels match.
Label dicts are shared between samples with the same label text: treat them as read-only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Container, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

#: Default bound on the bytes read from one page (a vLLM page is tens of KiB).
MAX_BYTES = 4 << 20
#: Default bound on the series read from one page (vLLM serves a few hundred per engine).
MAX_SERIES = 20_000

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
_NAME_ONLY = re.compile(_NAME)
# Possessive quantifiers: linear time on any input, no catastrophic backtracking.
_QUOTED = r'"(?:[^"\\]++|\\.)*+"'
_SAMPLE = re.compile(
    rf"[ \t]*({_NAME})(?:\{{((?:[^\"}}]++|{_QUOTED})*+)\}}[ \t]*|[ \t]+)"
    r"([^ \t\r]+)(?:[ \t]+([^ \t\r#]+))?(?:[ \t]+#.*)?[ \t\r]*",
    re.DOTALL,
)
# One label and the comma after it (or the end of the body); pairs must follow each other exactly.
_LABEL_PAIR = re.compile(rf'[ \t]*({_LABEL_NAME})[ \t]*=[ \t]*"((?:[^"\\]++|\\.)*+)"[ \t]*(?:,|\Z)', re.DOTALL)
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)
_UNESCAPED = {"\\": "\\", '"': '"', "n": "\n"}
_TYPES = frozenset(
    {"counter", "gauge", "histogram", "summary", "untyped", "unknown", "info", "stateset", "gaugehistogram"}
)


class Sample(NamedTuple):
    """One sample as written: ``labels`` is read-only, ``timestamp`` is in the page's own unit."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None


class Problem(NamedTuple):
    """Something the parser skipped: ``line`` is 1-based (0 for the page as a whole)."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}" if self.line else self.message


@dataclass
class Page:
    """A parsed page: samples by name on the wire, declared types by family name, problems."""

    samples: dict[str, list[Sample]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    #: True when the byte or series bound stopped the parse before the end of the body.
    truncated: bool = False
    #: Series read (each name and label set once).
    series: int = 0

    def samples_of(self, name: str) -> list[Sample]:
        return self.samples.get(name, [])

    def __contains__(self, name: object) -> bool:
        return name in self.samples

    def __iter__(self) -> Iterator[Sample]:
        for samples in self.samples.values():
            yield from samples

    def sum(self, name: str, **labels: str) -> float | None:
        """Sum of the samples of ``name`` whose labels include ``labels``; None when none match."""
        total = None
        for sample in self.samples.get(name, ()):
            if all(sample.labels.get(key) == value for key, value in labels.items()):
                total = sample.value if total is None else total + sample.value
        return total


def _unescape(value: str) -> str:
    return _ESCAPE.sub(lambda match: _UNESCAPED.get(match.group(1), match.group(0)), value)


def _number(text: str) -> float | None:
    """A Go-style float, or None (Python's ``float`` also takes ``1_000``, Prometheus does not)."""
    if "_" in text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _decode(body: bytes | bytearray | memoryview | str, problems: list[Problem]) -> str:
    if isinstance(body, str):
        return body
    raw = bytes(body)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        problems.append(Problem(line, "invalid UTF-8 (decoded with replacement characters)"))
        return raw.decode("utf-8", errors="replace")


def parse_exposition(
    body: bytes | bytearray | memoryview | str | None,
    *,
    max_bytes: int = MAX_BYTES,
    max_series: int = MAX_SERIES,
    names: Container[str] | None = None,
) -> Page:
    """Parse one page; never raises (see the module docstring for what is kept and what is reported)."""
    page = Page()
    problems = page.problems
    try:
        if body is None:
            problems.append(Problem(0, "empty page"))
            return page
        if not isinstance(body, (bytes, bytearray, memoryview, str)):
            problems.append(Problem(0, f"not a page: {type(body).__name__}"))
            return page
        size = len(body.encode("utf-8", errors="replace")) if isinstance(body, str) else len(body)
        if size > max_bytes:
            raw = body.encode("utf-8", errors="replace") if isinstance(body, str) else bytes(body)
            body = raw[: raw.rfind(b"\n", 0, max_bytes) + 1]  # whole lines only
            page.truncated = True
            problems.append(
                Problem(
                    0,
                    f"page of {size} bytes is over the limit of {max_bytes}: read the first "
                    f"{max_bytes} (up to the last full line)",
                )
            )
        _parse_lines(_decode(body, problems), page, max_series, names)
    except Exception as error:
        problems.append(Problem(0, f"parser error: {type(error).__name__}: {error}"))
    return page


def _parse_lines(text: str, page: Page, max_series: int, names: Container[str] | None) -> None:
    lines = text.split("\n")
    last = lines.pop()  # "" when the text ends with a newline
    if last.strip() and not page.truncated:
        page.problems.append(Problem(len(lines) + 1, "last line has no newline (cut short?): skipped"))
    samples = page.samples
    problems = page.problems
    seen: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    label_cache: dict[str, tuple[dict[str, str], frozenset[tuple[str, str]]] | None] = {"": ({}, frozenset())}
    match_sample = _SAMPLE.fullmatch
    match_name = _NAME_ONLY.match
    new_sample = tuple.__new__
    for number, line in enumerate(lines, 1):
        if not line:
            continue
        first = line[0]
        if first == "#" or (first in " \t\r" and line.lstrip()[:1] in ("#", "")):
            if line.startswith("# TYPE") or not line.startswith("# HELP"):
                _comment(line, number, page)
            continue
        if names is not None:
            head = match_name(line)
            if head is not None and head.group() not in names and line[head.end() : head.end() + 1] in ("{", " ", "\t"):
                continue  # a series nobody asked for: not read
        match = match_sample(line)
        if match is None:
            problems.append(Problem(number, f"not a sample: {line[:80]!r}"))
            continue
        name, label_text, value_text, timestamp_text = match.groups()
        if label_text is None:
            label_text = ""
        if label_text in label_cache:
            parsed = label_cache[label_text]
        else:
            parsed = label_cache[label_text] = _labels(label_text)
        if parsed is None:
            problems.append(Problem(number, f"malformed labels in {name}"))
            continue
        try:
            if "_" in value_text:
                raise ValueError
            value = float(value_text)
        except ValueError:
            problems.append(Problem(number, f"{name}: value {value_text[:40]!r} is not a number"))
            continue
        timestamp = None
        if timestamp_text is not None:
            timestamp = _number(timestamp_text)
            if timestamp is None or not math.isfinite(timestamp):
                problems.append(Problem(number, f"{name}: timestamp {timestamp_text[:40]!r} is not a number"))
                continue
        labels, key = parsed
        series = (name, key)
        if series in seen:
            problems.append(Problem(number, f"duplicate series {name}{{{label_text[:80]}}}: kept the first"))
            continue
        if page.series >= max_series:
            page.truncated = True
            problems.append(Problem(number, f"over the limit of {max_series} series: read no further"))
            return
        seen.add(series)
        page.series += 1
        sample = new_sample(Sample, (name, labels, value, timestamp))
        bucket = samples.get(name)
        if bucket is None:
            samples[name] = [sample]
        else:
            bucket.append(sample)


def _labels(text: str) -> tuple[dict[str, str], frozenset[tuple[str, str]]] | None:
    """The labels of a ``{...}`` body and their order-free identity; None when malformed or repeated."""
    labels = {}
    position = 0
    for match in _LABEL_PAIR.finditer(text):
        if match.start() != position:
            return None  # something between two pairs that is not a comma
        name, value = match.groups()
        if name in labels:
            return None
        labels[name] = _unescape(value) if "\\" in value else value
        position = match.end()
    if position != len(text) and text[position:].strip(" \t"):
        return None
    return labels, frozenset(labels.items())


def _comment(line: str, number: int, page: Page) -> None:
    parts = line.lstrip()[1:].split(None, 3)
    if len(parts) < 2 or parts[0] != "TYPE":
        return  # HELP, EOF or a plain comment
    if len(parts) != 3 or parts[2].lower() not in _TYPES or _NAME_ONLY.fullmatch(parts[1]) is None:
        page.problems.append(Problem(number, f"malformed TYPE line: {line[:80]!r}"))
        return
    name, kind = parts[1], parts[2].lower()
    previous = page.types.get(name)
    if previous is not None and previous != kind:
        page.problems.append(Problem(number, f"{name} declared {kind} after {previous}: kept {previous}"))
        return
    page.types[name] = kind
