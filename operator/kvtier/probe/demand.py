"""The probe's demand curve: a decaying window of exact LRU stack distances, as Prometheus metrics.

:class:`DemandProbe` feeds lookup-hash log lines through a
:class:`~kvtier.probe.stackdist.WindowedStackDistance` and exports the metrics listed in
:mod:`kvtier.probe`. :func:`hit_curve` turns a scraped stack-distance histogram back into a
hit curve (what the rebalancer's estimator consumes).

Decay runs on the log's own clock: the window ticks every ``tick_seconds`` of lookup
timestamps (and of the wall clock passed to :meth:`DemandProbe.advance`), each tick multiplying
older weights by ``0.5 ** (tick_seconds / window_seconds)``: ``window_seconds`` is the half-life
of an access's weight, 0 keeps every access at weight 1. Re-reading the same log therefore
rebuilds the same curve, and a restarted probe picks up where it was.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from kvtier.probe.stackdist import WindowedStackDistance
from kvtier.probe.tail import parse_lookup

STACK_DISTANCE_CHUNKS = "kvtier_probe_stack_distance_chunks"
STACK_DISTANCE_BYTES = "kvtier_probe_stack_distance_bytes"


def bucket_bounds(max_chunks: int, per_octave: int = 1) -> list[int]:
    """Histogram bounds in chunks: ``per_octave`` geometric steps per doubling (rounded, distinct)
    below ``max_chunks``, then ``max_chunks``. With 1 per octave: the powers of 2."""
    if max_chunks < 1 or per_octave < 1:
        raise ValueError("max_chunks and per_octave must be >= 1")
    bounds: list[int] = []
    step = 0
    while (bound := round(2 ** (step / per_octave))) < max_chunks:
        if not bounds or bound > bounds[-1]:
            bounds.append(bound)
        step += 1
    return bounds + [max_chunks]


class DemandProbe:
    """Lookup lines in, stack-distance histogram and counters out (a Prometheus collector)."""

    def __init__(
        self,
        max_chunks: int = 1 << 18,
        *,
        chunk_bytes: int = 0,
        window_seconds: float = 0.0,
        tick_seconds: float = 15.0,
        dedup_request_ids: int = 4096,
        buckets_per_octave: int = 2,
    ) -> None:
        if window_seconds < 0 or tick_seconds <= 0 or chunk_bytes < 0 or dedup_request_ids < 0:
            raise ValueError("window >= 0, tick > 0, chunk bytes >= 0 and dedup size >= 0 are required")
        decay = 0.5 ** (tick_seconds / window_seconds) if window_seconds else 1.0
        self.bounds = bucket_bounds(max_chunks, buckets_per_octave)
        # Binned at the histogram's bounds: exact where it is exported, and cheap to decay.
        self.window = WindowedStackDistance(max_chunks, decay, bounds=self.bounds)
        self.max_chunks = max_chunks
        self.chunk_bytes = chunk_bytes
        self.window_seconds = window_seconds
        self.tick_seconds = tick_seconds
        self.lookups = 0
        self.chunks = 0
        self.garbage_lines = 0
        self.duplicate_lookups = 0
        #: Decay ticks applied so far: weights at two scrapes differ by ``decay ** (ticks difference)``.
        self.decay_ticks = 0
        self.last_timestamp: float | None = None
        self._next_tick: float | None = None
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._dedup = dedup_request_ids

    @property
    def tracked_chunks(self) -> int:
        return len(self.window.tracker)

    def feed(self, line: bytes) -> None:
        """One log line: a lookup is added to the window; a repeated request id or garbage is counted."""
        if not line.strip():
            return
        lookup = parse_lookup(line)
        if lookup is None:
            self.garbage_lines += 1
            return
        if self._dedup:
            if lookup.request_id in self._recent:
                self.duplicate_lookups += 1
                return
            self._recent[lookup.request_id] = None
            if len(self._recent) > self._dedup:
                self._recent.popitem(last=False)
        self.record(lookup.timestamp, lookup.chunk_hashes)

    def record(self, timestamp: float, chunk_hashes: Sequence[Hashable]) -> None:
        """One lookup (already parsed and deduplicated) at ``timestamp``: its chunks enter the window.

        Any injective spelling of the hashes gives the same histogram (a replay passes block ids).
        """
        self.advance(timestamp)
        self.window.access(chunk_hashes)
        self.lookups += 1
        self.chunks += len(chunk_hashes)
        if self.last_timestamp is None or timestamp > self.last_timestamp:
            self.last_timestamp = timestamp

    def advance(self, now: float) -> None:
        """Let time pass up to ``now`` (unix seconds): the ticks due decay the window."""
        if self._next_tick is None:
            self._next_tick = now + self.tick_seconds
        elif now >= self._next_tick:
            ticks = math.floor((now - self._next_tick) / self.tick_seconds) + 1
            self.window.tick(ticks)
            self.decay_ticks += ticks
            self._next_tick += ticks * self.tick_seconds

    def buckets(self) -> tuple[list[float], float, float]:
        """Cumulative weights at each bound of :attr:`bounds`, the total weight, and the sum of finite distances."""
        histogram = self.window.histogram
        bounds = self.bounds
        counts = [0.0] * len(bounds)
        for bound, weight in histogram.counts.items():
            counts[bisect.bisect_left(bounds, bound)] += weight
        running = 0.0
        for index, weight in enumerate(counts):
            running += weight
            counts[index] = running
        return counts, running + histogram.cold, self.window.distance_sum

    def collect(self) -> Iterator[Metric]:
        counts, total, distance_sum = self.buckets()
        yield _histogram(
            STACK_DISTANCE_CHUNKS,
            "LRU stack distance of every chunk looked up, in chunks "
            "(le=C: chunks an LRU of C chunks would hit); decayed weights.",
            self.bounds,
            counts,
            total,
            distance_sum,
        )
        if self.chunk_bytes:
            yield _histogram(
                STACK_DISTANCE_BYTES,
                "LRU stack distance of every chunk looked up, in bytes of cache; decayed weights.",
                [bound * self.chunk_bytes for bound in self.bounds],
                counts,
                total,
                distance_sum * self.chunk_bytes,
            )
        for name, doc, value in (
            ("kvtier_probe_lookups", "Lookups read from the log.", self.lookups),
            ("kvtier_probe_chunks", "Chunks looked up.", self.chunks),
            ("kvtier_probe_garbage_lines", "Log lines that are not lookups (skipped).", self.garbage_lines),
            (
                "kvtier_probe_duplicate_lookups",
                "Lookups of a request id seen just before (skipped).",
                self.duplicate_lookups,
            ),
            ("kvtier_probe_decay_ticks", "Decay ticks applied to the histogram's weights so far.", self.decay_ticks),
        ):
            counter = CounterMetricFamily(name, doc)
            counter.add_metric([], value)
            yield counter
        gauges = [
            ("kvtier_probe_tracked_chunks", "Chunks in the tracked LRU stack.", self.tracked_chunks),
            ("kvtier_probe_max_chunks", "Depth of the tracked stack: the curve is exact up to it.", self.max_chunks),
            ("kvtier_probe_chunk_bytes", "Bytes of KV cache per chunk (0: unknown).", self.chunk_bytes),
            ("kvtier_probe_window_seconds", "Half-life of an access's weight (0: no decay).", self.window_seconds),
            ("kvtier_probe_tick_seconds", "Seconds of log time between two decay ticks.", self.tick_seconds),
        ]
        if self.last_timestamp is not None:
            gauges.append(
                (
                    "kvtier_probe_last_lookup_timestamp_seconds",
                    "Timestamp of the newest lookup read.",
                    self.last_timestamp,
                )
            )
        for name, doc, value in gauges:
            yield GaugeMetricFamily(name, doc, value=value)


def _histogram(
    name: str, doc: str, bounds: Iterable[float], counts: list[float], total: float, distance_sum: float
) -> HistogramMetricFamily:
    buckets = [(floatToGoString(bound), count) for bound, count in zip(bounds, counts)]
    buckets.append(("+Inf", total))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=distance_sum)


@dataclass(frozen=True)
class HitCurve:
    """Hits as a function of cache capacity, from a stack-distance histogram.

    ``capacities`` are the finite bucket bounds (chunks or bytes, ascending), ``hits`` the
    weight hitting at each, ``total`` the weight of every access. Exact at the bounds, linear
    in between (from 0 hits at capacity 0), flat beyond the last bound (what the probe did not track).
    """

    capacities: tuple[float, ...]
    hits: tuple[float, ...]
    total: float

    def hits_at(self, capacity: float) -> float:
        if capacity <= 0 or not self.capacities:
            return 0.0
        index = bisect.bisect_left(self.capacities, capacity)
        if index == len(self.capacities):
            return self.hits[-1]
        high, high_hits = self.capacities[index], self.hits[index]
        low, low_hits = (self.capacities[index - 1], self.hits[index - 1]) if index else (0.0, 0.0)
        return low_hits + (high_hits - low_hits) * (capacity - low) / (high - low)

    def hits_at_each(self, capacities: Iterable[float]) -> list[float]:
        """:meth:`hits_at` of every capacity, ascending (one walk over the bounds, the same values)."""
        bounds, hits = self.capacities, self.hits
        capacities = list(capacities)
        position = bisect.bisect_right(capacities, 0)
        values = [0.0] * position
        if not bounds:
            return values + [0.0] * (len(capacities) - position)
        low = low_hits = 0.0
        for high, high_hits in zip(bounds, hits):
            # The capacities in (low, high]: linear between the two bounds.
            end = bisect.bisect_right(capacities, high, position)
            values.extend(
                [
                    low_hits + (high_hits - low_hits) * (capacity - low) / (high - low)
                    for capacity in capacities[position:end]
                ]
            )
            position, low, low_hits = end, high, high_hits
        values.extend([hits[-1]] * (len(capacities) - position))
        return values

    def hit_ratio(self, capacity: float) -> float:
        """Fraction of accesses that hit at ``capacity`` (0 with no accesses)."""
        return self.hits_at(capacity) / self.total if self.total else 0.0


def hit_curve(buckets: Iterable[tuple[float, float]]) -> HitCurve:
    """A :class:`HitCurve` from a histogram's ``(le, cumulative weight)`` pairs (any order; needs ``+Inf``).

    Raises ``ValueError`` for a histogram that is not one: no ``+Inf`` bucket, negative or
    non-finite weights, or weights falling as ``le`` grows (beyond float rounding).
    """
    pairs = sorted((float(bound), float(weight)) for bound, weight in buckets)
    if not pairs or pairs[-1][0] != math.inf:
        raise ValueError("a histogram needs a +Inf bucket")
    if any(not math.isfinite(weight) or weight < 0 or math.isnan(bound) or bound <= 0 for bound, weight in pairs):
        raise ValueError("bucket bounds must be > 0 and weights finite and >= 0")
    capacities, hits = [], []
    running = 0.0
    for bound, weight in pairs:
        if weight < running * (1 - 1e-9) - 1e-9:
            raise ValueError(f"bucket le={bound} holds less than a smaller bucket")
        running = max(running, weight)
        if bound != math.inf:
            capacities.append(bound)
            hits.append(running)
    return HitCurve(tuple(capacities), tuple(hits), running)


def scraped_hit_curve(text: str, name: str = STACK_DISTANCE_CHUNKS) -> HitCurve:
    """The hit curve of histogram ``name`` in a Prometheus text page (``ValueError`` if absent or malformed)."""
    for family in text_string_to_metric_families(text):
        if family.name == name and family.type == "histogram":
            return hit_curve(
                (sample.labels["le"], sample.value) for sample in family.samples if sample.name == f"{name}_bucket"
            )
    raise ValueError(f"no histogram {name} in the page")
