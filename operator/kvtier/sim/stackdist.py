"""Exact LRU stack distances with prefix semantics.

The stack distance of a block at a request's lookup is its 1-based position in the LRU stack
just before the request: the smallest capacity at which an LRU (see :mod:`kvtier.sim.cache`)
holds it. Touching a request's blocks from last to first is a plain sequence of single-block
LRU accesses, so the inclusion property holds and one stack serves every capacity at once.

With prefix semantics a request hits block k at capacity C only if it hits blocks 0..k-1 too,
so the *effective* distance of block k is the maximum of the distances of blocks 0..k: block k
hits at capacity C exactly when its effective distance is <= C. Hits at C = number of accesses
with effective distance <= C, for every C, from one pass.

Distances are counted with a Fenwick tree over touch times (one mark at each tracked block's
last touch): O(log n) per access. The timeline is renumbered when it fills up, so memory is
proportional to the tracked blocks, not to the stream length.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence

#: The distance of a block the stack does not hold (never seen, or beyond a bounded tracker).
INFINITE = math.inf

Distance = int | float  # an int >= 1, or INFINITE

_MIN_TIMELINE = 1024


class StackDistanceTracker:
    """Effective LRU stack distances of a request stream (block ids: ints, or any hashable such as hex digests).

    With ``max_blocks`` only the top ``max_blocks`` blocks of the stack are tracked (memory is
    bounded); a deeper block's distance is reported as INFINITE. Distances up to ``max_blocks``
    are still exact, so the hit-ratio curve is exact for every capacity <= ``max_blocks``.
    """

    __slots__ = ("_last", "_tree", "_size", "_now", "max_blocks")

    def __init__(self, max_blocks: int | None = None) -> None:
        if max_blocks is not None and max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
        self.max_blocks = max_blocks
        # Tracked block -> time of its last touch, least recently touched first.
        self._last: OrderedDict[Hashable, int] = OrderedDict()
        # Fenwick tree (1-based) over times 0..size-1: position t+1 counts a mark at time t.
        self._size = _MIN_TIMELINE
        self._tree = [0] * (self._size + 1)
        self._now = 0

    def __len__(self) -> int:
        """Distinct blocks tracked."""
        return len(self._last)

    def access(self, blocks: Sequence[Hashable]) -> list[Distance]:
        """One request: returns each block's effective distance, then touches the blocks."""
        if self._now + len(blocks) > self._size:
            self._renumber(len(blocks))
        last = self._last
        tree = self._tree
        size = self._size
        depth = len(last)
        distances: list[Distance] = []
        effective = 0
        for block in blocks:
            time = last.get(block)
            if time is None:
                # Every later block of the request misses at every capacity too.
                distances.extend([INFINITE] * (len(blocks) - len(distances)))
                break
            # Marks at times < time; the block's position is the count of marks at or after it.
            below = 0
            index = time
            while index:
                below += tree[index]
                index &= index - 1
            if depth - below > effective:
                effective = depth - below
            distances.append(effective)
        now = self._now
        pop = last.pop
        for block in reversed(blocks):
            time = pop(block, None)
            if time is not None:
                index = time + 1
                while index <= size:
                    tree[index] -= 1
                    index += index & -index
            last[block] = now
            index = now + 1
            while index <= size:
                tree[index] += 1
                index += index & -index
            now += 1
        self._now = now
        if self.max_blocks is not None and len(last) > self.max_blocks:
            self._forget(len(last) - self.max_blocks)
        return distances

    def _forget(self, count: int) -> None:
        """Drop the ``count`` least recently touched blocks (the bottom of the stack)."""
        last = self._last
        tree = self._tree
        size = self._size
        for _ in range(count):
            _, time = last.popitem(last=False)
            index = time + 1
            while index <= size:
                tree[index] -= 1
                index += index & -index

    def _renumber(self, incoming: int) -> None:
        """Give the tracked blocks times 0..n-1 (keeping their order) on a timeline with room to grow."""
        tracked = len(self._last)
        self._last = OrderedDict(zip(self._last, range(tracked)))
        size = max(_MIN_TIMELINE, 2 * (tracked + incoming))
        # Linear-time build of a tree with one mark at each of the positions 1..tracked.
        self._tree = [0] + [max(0, min(i, tracked) - (i - (i & -i))) for i in range(1, size + 1)]
        self._size = size
        self._now = tracked


class DistanceHistogram:
    """Weighted counts of effective stack distances: a hit-ratio curve over every capacity.

    ``counts`` maps a finite distance to its weight; INFINITE distances add to ``cold``.
    Weights are access counts (ints) until :meth:`scale` decays them.
    """

    __slots__ = ("counts", "cold", "_cumulative")

    def __init__(self) -> None:
        self.counts: dict[int, float] = {}
        self.cold: float = 0
        self._cumulative: tuple[list[int], list[float]] | None = None

    def add(self, distances: Iterable[Distance], weight: float = 1) -> None:
        counts = self.counts
        for distance in distances:
            if distance == INFINITE:
                self.cold += weight
            else:
                counts[distance] = counts.get(distance, 0) + weight
        self._cumulative = None

    def merge(self, other: DistanceHistogram) -> None:
        """Add another histogram's weights to this one."""
        counts = self.counts
        for distance, weight in other.counts.items():
            counts[distance] = counts.get(distance, 0) + weight
        self.cold += other.cold
        self._cumulative = None

    def scale(self, factor: float) -> None:
        """Multiply every weight by ``factor`` (a decay step of a decaying window)."""
        if factor < 0:
            raise ValueError(f"factor must be >= 0, got {factor}")
        self.counts = {distance: weight * factor for distance, weight in self.counts.items()}
        self.cold *= factor
        self._cumulative = None

    def copy(self) -> DistanceHistogram:
        other = DistanceHistogram()
        other.counts = dict(self.counts)
        other.cold = self.cold
        return other

    @property
    def total(self) -> float:
        """Weight of all accesses."""
        return sum(self.counts.values()) + self.cold

    @property
    def reused(self) -> float:
        """Weight of the accesses an infinite cache would hit."""
        return sum(self.counts.values())

    def hits(self, capacity: float) -> float:
        """Weight of the accesses that hit an LRU of ``capacity`` blocks."""
        if self._cumulative is None:
            distances = sorted(self.counts)
            running = 0
            cumulative = []
            for distance in distances:
                running += self.counts[distance]
                cumulative.append(running)
            self._cumulative = (distances, cumulative)
        distances, cumulative = self._cumulative
        position = bisect.bisect_right(distances, capacity)
        return cumulative[position - 1] if position else 0

    def hit_ratio(self, capacity: float) -> float:
        """Fraction of accesses that hit at ``capacity`` (0 for an empty histogram)."""
        total = self.total
        return self.hits(capacity) / total if total else 0.0

    def hit_curve(self, max_capacity: int) -> list[float]:
        """Hits at every capacity 0..max_capacity (``curve[c]`` = hits at c): what allocators consume."""
        curve = [0.0] * (max_capacity + 1)
        for distance, weight in self.counts.items():
            if distance <= max_capacity:
                curve[distance] += weight
        running = 0.0
        for capacity in range(max_capacity + 1):
            running += curve[capacity]
            curve[capacity] = running
        return curve


class WindowedStackDistance:
    """A bounded-memory, decaying demand curve of a live access stream (what the probe keeps).

    Tracks the top ``max_blocks`` of the LRU stack, so the curve is exact for capacities up to
    ``max_blocks``, and weighs every access by ``decay ** k`` where k is the number of
    :meth:`tick` calls since it happened (call ``tick`` once per interval): an exponentially
    decaying window that follows phase changes. ``decay=1`` keeps everything.
    """

    __slots__ = ("tracker", "histogram", "decay")

    def __init__(self, max_blocks: int, decay: float = 1.0) -> None:
        if not 0 < decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.tracker = StackDistanceTracker(max_blocks)
        self.histogram = DistanceHistogram()
        self.decay = decay

    def access(self, blocks: Sequence[Hashable]) -> list[Distance]:
        distances = self.tracker.access(blocks)
        self.histogram.add(distances)
        return distances

    def tick(self, intervals: int = 1) -> None:
        """End ``intervals`` intervals: older accesses weigh ``decay ** intervals`` times less."""
        if self.decay != 1 and intervals > 0:
            self.histogram.scale(self.decay**intervals)


def stream_histogram(requests: Iterable[Sequence[Hashable]], max_blocks: int | None = None) -> DistanceHistogram:
    """The distance histogram of a whole stream of requests (each a sequence of block ids)."""
    tracker = StackDistanceTracker(max_blocks)
    histogram = DistanceHistogram()
    for blocks in requests:
        histogram.add(tracker.access(blocks))
    return histogram


def epoch_histograms(
    requests: Iterable[tuple[float, Sequence[Hashable]]], epoch_seconds: float
) -> list[DistanceHistogram]:
    """Per-epoch histograms of distances computed on the whole stream.

    ``requests`` are ``(arrival seconds, blocks)`` in arrival order; epoch i holds the accesses
    of requests arriving in ``[i * epoch_seconds, (i + 1) * epoch_seconds)`` (arrivals before 0
    count in epoch 0), but every distance reflects the stack built by everything before it.
    """
    if epoch_seconds <= 0:
        raise ValueError(f"epoch_seconds must be > 0, got {epoch_seconds}")
    tracker = StackDistanceTracker()
    histograms: list[DistanceHistogram] = []
    for arrival, blocks in requests:
        epoch = max(0, math.floor(arrival / epoch_seconds))
        while len(histograms) <= epoch:
            histograms.append(DistanceHistogram())
        histograms[epoch].add(tracker.access(blocks))
    return histograms
