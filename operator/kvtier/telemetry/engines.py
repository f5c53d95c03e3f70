"""One replica's engine pages (vLLM, LMCache, probe) as a :class:`Snapshot` of the facts kvtier uses.

``replica_snapshot(vllm=None, lmcache=None, probe=None, quota=None) -> Snapshot``

The pages are :class:`~kvtier.telemetry.exposition.Page` objects (``None``: not scraped);
``quota`` is the decoded JSON of the LMCache MP quota API (``GET /quota`` or
``GET /quota/{salt}``), if read. Every name spelling in use is accepted:

- a counter is read as ``<name>_total`` (prometheus_client, OpenTelemetry) or bare ``<name>``;
- vLLM's old and new names: ``vllm:kv_cache_usage_perc`` / ``vllm:gpu_cache_usage_perc``,
  ``vllm:prefix_cache_*`` / ``vllm:gpu_prefix_cache_*``;
- LMCache MP instruments as its OpenTelemetry exporter spells them, unit included
  (``lmcache_mp_lookup_hit_tokens_total``, ``lmcache_mp_l1_memory_usage_bytes``), and the
  in-process ``lmcache:`` names, on the LMCache page or on the vLLM page (the in-process connector
  serves them from vLLM's process).

A series split over label sets (``engine``, ``cache_salt``, ``worker_id``...) is summed; the
HBM watermark, a ratio, is averaged over the engines. A series that is not served, or holds a
negative or non-finite counter, gives ``None``: never a made-up 0. What was skipped is in
:attr:`Snapshot.problems`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from kvtier.api.units import GIB
from kvtier.probe.demand import STACK_DISTANCE_BYTES, STACK_DISTANCE_CHUNKS
from kvtier.telemetry.exposition import Page, Sample

#: Page problems carried into a snapshot, per page (the rest are counted).
PROBLEMS_PER_PAGE = 5

# Names as the engines spell them, newest first; counters without the ``_total`` suffix.
WATERMARK = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PROMPT_TOKENS = ("vllm:prompt_tokens",)
PROMPT_TOKENS_BY_SOURCE = ("vllm:prompt_tokens_by_source",)
PREFIX_QUERIES = ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries")
PREFIX_HITS = ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits")
EXTERNAL_QUERIES = ("vllm:external_prefix_cache_queries",)
EXTERNAL_HITS = ("vllm:external_prefix_cache_hits",)
PREEMPTIONS = ("vllm:num_preemptions",)
TTFT = ("vllm:time_to_first_token_seconds",)
# LMCache MP: OpenTelemetry instruments on a Prometheus page, so the unit is part of the name
# (``lmcache_mp.lookup_requested`` in tokens -> ``lmcache_mp_lookup_requested_tokens_total``).
LMCACHE_REQUESTED = ("lmcache_mp_lookup_requested_tokens", "lmcache:num_requested_tokens")
LMCACHE_HIT = ("lmcache_mp_lookup_hit_tokens", "lmcache:num_hit_tokens")
LMCACHE_HIT_L1 = ("lmcache_mp_lookup_hit_l1_tokens",)
LMCACHE_HIT_L2 = ("lmcache_mp_lookup_hit_l2_tokens",)
CPU_USED = ("lmcache_mp_l1_memory_usage_bytes", "lmcache:local_cache_usage")
STORAGE_USED = ("lmcache_mp_l2_usage_bytes", "lmcache:local_storage_usage")
LMCACHE_LOOKUPS = ("lmcache_mp_lookups_requests", "lmcache:num_lookup_requests")
PROBE_LAST_LOOKUP = ("kvtier_probe_last_lookup_timestamp_seconds",)
PROBE_LOOKUPS = ("kvtier_probe_lookups",)
PROBE_DECAY_TICKS = ("kvtier_probe_decay_ticks",)
PROBE_TICK_SECONDS = ("kvtier_probe_tick_seconds",)
PROBE_WINDOW_SECONDS = ("kvtier_probe_window_seconds",)


@dataclass(frozen=True)
class Buckets:
    """A cumulative histogram: ``(le, count)`` pairs by ascending ``le``, the last one ``+Inf``.

    No pairs: a histogram the page declares but has not observed anything in yet (count 0).
    """

    pairs: tuple[tuple[float, float], ...]
    sum: float | None = None

    @property
    def count(self) -> float:
        return self.pairs[-1][1] if self.pairs else 0.0

    @property
    def bounds(self) -> tuple[float, ...]:
        return tuple(bound for bound, _ in self.pairs)


@dataclass(frozen=True)
class Snapshot:
    """One replica at one scrape. Counters are cumulative (tokens unless named otherwise), gauges instant.

    ``None`` means the engine did not serve the series. Fields and their sources:

    - ``hbm_watermark``: vLLM's KV-cache usage, 0..1, mean over its engines.
    - ``prompt_tokens``: ``vllm:prompt_tokens`` (else the sum of ``prompt_tokens_by_source``).
    - ``prompt_tokens_by_source``: ``local_compute`` / ``local_cache_hit`` / ``external_kv_transfer``.
    - ``prefix_cache_queries`` / ``prefix_cache_hits``: tokens looked up in / found in HBM.
    - ``external_queries`` / ``external_hits``: tokens asked of / loaded through the KV connector.
    - ``preemptions``: requests preempted (a count). ``ttft``: the TTFT histogram (seconds).
    - ``lmcache_requested`` / ``lmcache_hit``: tokens asked of / found by LMCache (MP or in-process).
    - ``lmcache_hit_l1`` / ``lmcache_hit_l2``: of those, found in L1 (CPU) / L2 (storage); MP only.
    - ``cpu_used_bytes``, ``storage_used_bytes``, ``storage_quota_bytes``: LMCache's tiers (the
      quota API's sums over salts; in-process ``lmcache:local_*_usage``).
    - ``lmcache_lookups``: lookups LMCache answered (a count).
    - ``demand_chunks`` / ``demand_bytes``: the probe's stack-distance histograms (instant values,
      see :mod:`kvtier.probe`); ``demand_last_lookup``: the unix time of its newest lookup.
    - ``probe_lookups``, ``probe_decay_ticks`` (counters), ``probe_tick_seconds``,
      ``probe_window_seconds``: what the rebalancer needs to take the histogram's increments
      between two scrapes (:func:`kvtier.rebalance.estimator.probe_reading_of`).
    """

    hbm_watermark: float | None = None
    prompt_tokens: float | None = None
    prompt_tokens_by_source: Mapping[str, float] | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    external_queries: float | None = None
    external_hits: float | None = None
    preemptions: float | None = None
    ttft: Buckets | None = None
    lmcache_requested: float | None = None
    lmcache_hit: float | None = None
    lmcache_hit_l1: float | None = None
    lmcache_hit_l2: float | None = None
    lmcache_lookups: float | None = None
    cpu_used_bytes: float | None = None
    storage_used_bytes: float | None = None
    storage_quota_bytes: float | None = None
    demand_chunks: Buckets | None = None
    demand_bytes: Buckets | None = None
    demand_last_lookup: float | None = None
    probe_lookups: float | None = None
    probe_decay_ticks: float | None = None
    probe_tick_seconds: float | None = None
    probe_window_seconds: float | None = None
    problems: tuple[str, ...] = field(default=(), compare=False)


#: The counters of a :class:`Snapshot` (what windows turn into increases).
COUNTERS = (
    "prompt_tokens",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "external_queries",
    "external_hits",
    "preemptions",
    "lmcache_requested",
    "lmcache_hit",
    "lmcache_hit_l1",
    "lmcache_hit_l2",
    "lmcache_lookups",
)

# How a snapshot reads each family (see :class:`_Reader`): a counter as ``<name>_total`` or bare, a
# gauge as named, a histogram as ``<name>_bucket`` and ``<name>_sum``.
_COUNTER_FAMILIES = (
    PROMPT_TOKENS,
    PROMPT_TOKENS_BY_SOURCE,
    PREFIX_QUERIES,
    PREFIX_HITS,
    EXTERNAL_QUERIES,
    EXTERNAL_HITS,
    PREEMPTIONS,
    LMCACHE_REQUESTED,
    LMCACHE_HIT,
    LMCACHE_HIT_L1,
    LMCACHE_HIT_L2,
    LMCACHE_LOOKUPS,
    PROBE_LOOKUPS,
    PROBE_DECAY_TICKS,
)
_GAUGE_FAMILIES = (WATERMARK, CPU_USED, STORAGE_USED, PROBE_LAST_LOOKUP, PROBE_TICK_SECONDS, PROBE_WINDOW_SECONDS)
_HISTOGRAM_FAMILIES = (TTFT, (STACK_DISTANCE_CHUNKS,), (STACK_DISTANCE_BYTES,))

#: Every sample name (as on the wire) a snapshot reads: the scraper parses these and skips the rest
#: of a page (a vLLM page serves many more).
SERIES_READ = frozenset(
    [f"{base}{suffix}" for family in _COUNTER_FAMILIES for base in family for suffix in ("_total", "")]
    + [name for family in _GAUGE_FAMILIES for name in family]
    + [f"{name}{suffix}" for family in _HISTOGRAM_FAMILIES for name in family for suffix in ("_bucket", "_sum")]
)

#: How each field is spelled on the wire, for messages that say which series is missing.
SOURCES = {
    "hbm_watermark": WATERMARK,
    "prompt_tokens": PROMPT_TOKENS,
    "prompt_tokens_by_source": PROMPT_TOKENS_BY_SOURCE,
    "prefix_cache_queries": PREFIX_QUERIES,
    "prefix_cache_hits": PREFIX_HITS,
    "external_queries": EXTERNAL_QUERIES,
    "external_hits": EXTERNAL_HITS,
    "preemptions": PREEMPTIONS,
    "ttft": TTFT,
    "lmcache_requested": LMCACHE_REQUESTED,
    "lmcache_hit": LMCACHE_HIT,
    "lmcache_hit_l1": LMCACHE_HIT_L1,
    "lmcache_hit_l2": LMCACHE_HIT_L2,
    "cpu_used_bytes": CPU_USED,
    "storage_used_bytes": (*STORAGE_USED, "quota API current_usage_gb"),
    "storage_quota_bytes": ("quota API limit_gb",),
    "demand_chunks": (STACK_DISTANCE_CHUNKS,),
    "demand_bytes": (STACK_DISTANCE_BYTES,),
    "demand_last_lookup": PROBE_LAST_LOOKUP,
    "lmcache_lookups": LMCACHE_LOOKUPS,
    "probe_lookups": PROBE_LOOKUPS,
    "probe_decay_ticks": PROBE_DECAY_TICKS,
    "probe_tick_seconds": PROBE_TICK_SECONDS,
    "probe_window_seconds": PROBE_WINDOW_SECONDS,
}


def describe(field_name: str) -> str:
    """The wire names of a snapshot field, for a stale reason (``a / b``)."""
    return " / ".join(SOURCES.get(field_name, (field_name,)))


class _Reader:
    """Looks series up in several pages (the first page serving a name wins) and notes what it skipped."""

    def __init__(self, pages: Sequence[tuple[str, Page | None]]) -> None:
        self.pages = [(what, page) for what, page in pages if page is not None]
        self.problems: list[str] = []
        for what, page in self.pages:
            for problem in page.problems[:PROBLEMS_PER_PAGE]:
                self.problems.append(f"{what} page: {problem}")
            if len(page.problems) > PROBLEMS_PER_PAGE:
                self.problems.append(f"{what} page: {len(page.problems) - PROBLEMS_PER_PAGE} more problems")

    def samples(self, names: Iterable[str]) -> tuple[str, list[Sample]] | None:
        for name in names:
            for _, page in self.pages:
                found = page.samples.get(name)
                if found:
                    return name, found
        return None

    def declared(self, names: Iterable[str], kind: str) -> bool:
        """Whether a page declares one of ``names`` (``# TYPE``) as ``kind``."""
        return any(page.types.get(name) == kind for name in names for _, page in self.pages)

    def _counter_samples(self, bases: Sequence[str]) -> list[Sample] | None:
        names = [name for base in bases for name in (f"{base}_total", base)]
        found = self.samples(names)
        if found is None:
            # A labelled counter has no series until it is first incremented: declared means 0.
            return [] if self.declared(names, "counter") else None
        name, samples = found
        if any(not math.isfinite(sample.value) or sample.value < 0 for sample in samples):
            self.problems.append(f"{name}: a negative or non-finite counter value: ignored")
            return None
        return samples

    def counter(self, bases: Sequence[str]) -> float | None:
        """Sum of a counter over its label sets; None if absent or invalid."""
        samples = self._counter_samples(bases)
        return None if samples is None else math.fsum(sample.value for sample in samples)

    def counter_by(self, bases: Sequence[str], label: str) -> dict[str, float] | None:
        """A counter summed by the value of one label."""
        samples = self._counter_samples(bases)
        if samples is None:
            return None
        split: dict[str, float] = {}
        for sample in samples:
            key = sample.labels.get(label, "")
            split[key] = split.get(key, 0.0) + sample.value
        return split

    def gauge(self, names: Sequence[str], *, mean: bool = False) -> float | None:
        found = self.samples(names)
        if found is None:
            return None
        name, samples = found
        values = [sample.value for sample in samples]
        if any(math.isnan(value) for value in values):
            self.problems.append(f"{name}: NaN: ignored")
            return None
        total = math.fsum(values)
        return total / len(values) if mean else total

    def histogram(self, names: Sequence[str]) -> Buckets | None:
        """Bucket counts summed over label sets that share the same bounds; None when not a histogram."""
        found = self.samples(f"{name}_bucket" for name in names)
        if found is None:
            return Buckets(()) if self.declared(names, "histogram") else None
        name, samples = found
        groups: dict[frozenset[tuple[str, str]], dict[float, float]] = {}
        for sample in samples:
            try:
                bound = float(sample.labels["le"])
            except (KeyError, ValueError):
                self.problems.append(f"{name}: a bucket without a numeric le: histogram ignored")
                return None
            key = frozenset(item for item in sample.labels.items() if item[0] != "le")
            groups.setdefault(key, {})[bound] = sample.value
        bounds = {frozenset(group) for group in groups.values()}
        if len(bounds) != 1:
            self.problems.append(f"{name}: label sets with different buckets: histogram ignored")
            return None
        totals = {bound: math.fsum(group[bound] for group in groups.values()) for bound in next(iter(bounds))}
        pairs = tuple(sorted(totals.items()))
        if pairs[-1][0] != math.inf or any(math.isnan(bound) for bound, _ in pairs):
            self.problems.append(f"{name}: no +Inf bucket: histogram ignored")
            return None
        counts = [count for _, count in pairs]
        if any(not math.isfinite(count) or count < 0 for count in counts) or any(
            later < earlier for earlier, later in zip(counts, counts[1:])
        ):
            self.problems.append(f"{name}: bucket counts are not cumulative: histogram ignored")
            return None
        sum_name = name[: -len("_bucket")] + "_sum"
        sum_found = self.samples((sum_name,))
        total = math.fsum(sample.value for sample in sum_found[1]) if sum_found else None
        return Buckets(pairs, total)


def quota_usage(quota: Any) -> tuple[float | None, float | None]:
    """``(quota bytes, used bytes)`` summed over the salts of a quota API answer; Nones if unreadable.

    Takes ``GET /quota`` as LMCache 0.5.6 answers it (``{"users": {salt: {"limit_gb",
    "current_usage_gb"}}}``, one entry per salt with a quota) or one ``GET /quota/{salt}`` entry
    (``{"limit_gb", "current_usage_gb", "exists"}``); a salt without a quota (``exists`` false)
    adds its usage but no limit.
    """
    if isinstance(quota, Mapping) and "users" in quota:
        users = quota["users"]
        if not isinstance(users, Mapping) or not users:
            return None, None
        entries = list(users.values())
    else:
        entries = [quota]
    limit = used = 0.0
    limits = False
    for entry in entries:
        if not isinstance(entry, Mapping):
            return None, None
        entry_limit, entry_used = entry.get("limit_gb"), entry.get("current_usage_gb")
        if not (_is_size(entry_limit) and _is_size(entry_used)):
            return None, None
        used += entry_used
        if entry.get("exists", True):
            limit += entry_limit
            limits = True
    return (limit * GIB if limits else None), used * GIB


def _is_size(value: Any) -> TypeGuard[float]:
    return type(value) in (int, float) and math.isfinite(value) and value >= 0


def replica_snapshot(
    vllm: Page | None = None, lmcache: Page | None = None, probe: Page | None = None, quota: Any = None
) -> Snapshot:
    """The :class:`Snapshot` of one replica's pages (see the module docstring); never raises."""
    reader = _Reader((("vllm", vllm), ("lmcache", lmcache), ("probe", probe)))
    engines = _Reader((("lmcache", lmcache), ("vllm", vllm)))  # LMCache names: its own page first
    engines.problems = reader.problems
    by_source = reader.counter_by(PROMPT_TOKENS_BY_SOURCE, "source")
    prompt = reader.counter(PROMPT_TOKENS)
    if prompt is None and by_source:
        prompt = math.fsum(by_source.values())
    quota_bytes, quota_used = quota_usage(quota) if quota is not None else (None, None)
    storage_used = engines.gauge(STORAGE_USED)
    return Snapshot(
        hbm_watermark=reader.gauge(WATERMARK, mean=True),
        prompt_tokens=prompt,
        prompt_tokens_by_source=by_source,
        prefix_cache_queries=reader.counter(PREFIX_QUERIES),
        prefix_cache_hits=reader.counter(PREFIX_HITS),
        external_queries=reader.counter(EXTERNAL_QUERIES),
        external_hits=reader.counter(EXTERNAL_HITS),
        preemptions=reader.counter(PREEMPTIONS),
        ttft=reader.histogram(TTFT),
        lmcache_requested=engines.counter(LMCACHE_REQUESTED),
        lmcache_hit=engines.counter(LMCACHE_HIT),
        lmcache_hit_l1=engines.counter(LMCACHE_HIT_L1),
        lmcache_hit_l2=engines.counter(LMCACHE_HIT_L2),
        lmcache_lookups=engines.counter(LMCACHE_LOOKUPS),
        cpu_used_bytes=engines.gauge(CPU_USED),
        storage_used_bytes=quota_used if quota_used is not None else storage_used,
        storage_quota_bytes=quota_bytes,
        demand_chunks=reader.histogram((STACK_DISTANCE_CHUNKS,)),
        demand_bytes=reader.histogram((STACK_DISTANCE_BYTES,)),
        demand_last_lookup=reader.gauge(PROBE_LAST_LOOKUP),
        probe_lookups=reader.counter(PROBE_LOOKUPS),
        probe_decay_ticks=reader.counter(PROBE_DECAY_TICKS),
        probe_tick_seconds=reader.gauge(PROBE_TICK_SECONDS),
        probe_window_seconds=reader.gauge(PROBE_WINDOW_SECONDS),
        problems=tuple(reader.problems),
    )
