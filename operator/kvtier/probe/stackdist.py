"""Exact LRU stack distances with prefix semantics.

The stack distance of a block at a request's lookup is its 1-based position in the LRU stack
just before the request: the smallest capacity at which an LRU (kvsim's is :mod:`kvtier.sim.cache`)
holds it. Touching a request's blocks from last to first is a plain sequence of single-block
LRU accesses, so the inclusion property holds and one stack serves every capacity at once.

With prefix semantics a request hits block k at capacity C only if it hits blocks 0..k-1 too,
so the *effective* distance of block k is the maximum of the distances of blocks 0..k: block k
hits at capacity C exactly when its effective distance is <= C. Hits at C = number of accesses
with effective distance <= C, for every C, from one pass.

Distances are counted over a timeline of touch slots: every touch takes the next slot, and a
block's previous slot loses its mark. The marks below slot p are p minus the slots below p that
lost theirs, counted at three levels (slot bits, 512-slot and 32,768-slot counters), so a touch
costs O(1) and a lookup O(sqrt-ish) in C-level slices. A block whose slot is right below the
previous block's (they were touched together, as a prompt's prefix is) is one deeper, with no
count at all. The timeline is renumbered when it fills up, so memory is proportional to the
tracked blocks, not to the stream length.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Hashable, Iterable, Sequence

#: The distance of a block the stack does not hold (never seen, or beyond a bounded tracker).
INFINITE = math.inf

Distance = int | float  # an int >= 1, or INFINITE

_MIN_TIMELINE = 1024
_FINE = 9  # log2 of the slots per fine counter
_COARSE = 15  # log2 of the slots per coarse counter
_FINE_PER_COARSE = 1 << (_COARSE - _FINE)
#: The timeline holds this many times the tracked blocks after a renumbering: it is renumbered
#: (O(tracked)) once every (this - 1) x tracked touches.
_GROWTH = 4


class StackDistanceTracker:
    """Effective LRU stack distances of a request stream (block ids: ints, or any hashable such as hex digests).

    With ``max_blocks`` only the top ``max_blocks`` blocks of the stack are tracked (memory is
    bounded); a deeper block's distance is reported as INFINITE. Distances up to ``max_blocks``
    are still exact, so the hit-ratio curve is exact for every capacity <= ``max_blocks``.
    """

    __slots__ = ("_last", "_owner", "_unmarked", "_fine", "_coarse", "_size", "_now", "_oldest", "max_blocks")

    def __init__(self, max_blocks: int | None = None) -> None:
        if max_blocks is not None and max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
        self.max_blocks = max_blocks
        self._reset([], _MIN_TIMELINE)

    def _reset(self, order: list[Hashable], size: int) -> None:
        """A timeline of ``size`` slots whose first ``len(order)`` hold ``order`` (least recent first)."""
        tracked = len(order)
        # Tracked block -> slot of its last touch.
        self._last: dict[Hashable, int] = dict(zip(order, range(tracked)))
        self._owner: list[Hashable | None] = order + [None] * (size - tracked)
        # 1 at every slot below _now without a mark (its block was touched again, or forgotten).
        self._unmarked = bytearray(size)
        self._fine = [0] * ((size >> _FINE) + 1)
        self._coarse = [0] * ((size >> _COARSE) + 1)
        self._size = size
        self._now = tracked
        self._oldest = 0  # no mark below this slot

    def __len__(self) -> int:
        """Distinct blocks tracked."""
        return len(self._last)

    def _depth_at(self, slot: int) -> int:
        """Stack position (1-based) of the block last touched at ``slot``: the marks at or above it."""
        fine_index = slot >> _FINE
        coarse_index = slot >> _COARSE
        unmarked = (
            sum(self._coarse[:coarse_index])
            + sum(self._fine[coarse_index * _FINE_PER_COARSE : fine_index])
            + self._unmarked.count(1, fine_index << _FINE, slot)
        )
        return len(self._last) - slot + unmarked

    def access(self, blocks: Sequence[Hashable]) -> list[Distance]:
        """One request: returns each block's effective distance, then touches the blocks."""
        count = len(blocks)
        if self._now + count > self._size:
            self._renumber(count)
        last = self._last
        distances: list[Distance] = []
        effective = 0
        previous_slot = previous = -2
        for block in blocks:
            slot = last.get(block)
            if slot is None:
                # Every later block of the request misses at every capacity too.
                distances.extend([INFINITE] * (count - len(distances)))
                break
            # Touched right before the previous block: exactly one deeper.
            distance = previous + 1 if slot == previous_slot - 1 else self._depth_at(slot)
            previous_slot, previous = slot, distance
            if distance > effective:
                effective = distance
            distances.append(effective)
        now = self._now
        owner, unmarked, fine, coarse = self._owner, self._unmarked, self._fine, self._coarse
        get = last.get
        for block in reversed(blocks):
            slot = get(block)
            if slot is not None:
                unmarked[slot] = 1
                fine[slot >> _FINE] += 1
                coarse[slot >> _COARSE] += 1
            last[block] = now
            owner[now] = block
            now += 1
        self._now = now
        if self.max_blocks is not None and len(last) > self.max_blocks:
            self._forget(len(last) - self.max_blocks)
        return distances

    def _forget(self, count: int) -> None:
        """Drop the ``count`` least recently touched blocks (the bottom of the stack)."""
        last, owner, unmarked, fine, coarse = self._last, self._owner, self._unmarked, self._fine, self._coarse
        slot = self._oldest
        for _ in range(count):
            slot = unmarked.find(0, slot)
            del last[owner[slot]]
            owner[slot] = None
            unmarked[slot] = 1
            fine[slot >> _FINE] += 1
            coarse[slot >> _COARSE] += 1
        self._oldest = slot

    def _renumber(self, incoming: int) -> None:
        """Give the tracked blocks slots 0..n-1 (keeping their order) on a timeline with room to grow."""
        now = self._now
        marked = self._unmarked[:now].translate(_INVERT)
        order = list(itertools.compress(self._owner[:now], marked))
        self._reset(order, max(_MIN_TIMELINE, _GROWTH * (len(order) + incoming)))


_INVERT = bytes([1, 0]) + bytes(254)


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

    def hits_at_each(self, capacities: Iterable[float]) -> list[float]:
        """:meth:`hits` at every capacity (a :class:`~kvtier.rebalance.estimator.HitsByCapacity`)."""
        return [self.hits(capacity) for capacity in capacities]

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

    With ``bounds`` (ascending, the last at least ``max_blocks``) the histogram is *binned*: a
    distance counts at the smallest bound >= it, so the curve is exact at the bounds only, and a
    decay step scales a few bins instead of every distance seen. ``distance_sum`` is the
    decayed sum of the exact finite distances either way.
    """

    __slots__ = ("tracker", "histogram", "decay", "bounds", "distance_sum")

    def __init__(self, max_blocks: int, decay: float = 1.0, bounds: Sequence[int] | None = None) -> None:
        if not 0 < decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        if bounds is not None and (not bounds or list(bounds) != sorted(set(bounds)) or bounds[-1] < max_blocks):
            raise ValueError("bounds must ascend, distinct, up to at least max_blocks")
        self.tracker = StackDistanceTracker(max_blocks)
        self.histogram = DistanceHistogram()
        self.decay = decay
        self.bounds = tuple(bounds) if bounds is not None else None
        self.distance_sum = 0.0

    def access(self, blocks: Sequence[Hashable]) -> list[Distance]:
        distances = self.tracker.access(blocks)
        # Effective distances never decrease along a request: the INFINITE ones are its tail.
        finite = bisect.bisect_left(distances, INFINITE)
        bounds = self.bounds
        if bounds is None:
            self.histogram.add(distances)
        else:
            histogram = self.histogram
            counts = histogram.counts
            index = position = 0
            while position < finite:  # ascending: one run of distances per bound they count at
                index = bisect.bisect_left(bounds, distances[position], index)
                bound = bounds[index]
                end = bisect.bisect_right(distances, bound, position, finite)
                counts[bound] = counts.get(bound, 0) + (end - position)
                position = end
            histogram.cold += len(distances) - finite
            histogram._cumulative = None
        self.distance_sum += sum(distances[:finite])
        return distances

    def tick(self, intervals: int = 1) -> None:
        """End ``intervals`` intervals: older accesses weigh ``decay ** intervals`` times less."""
        if self.decay != 1 and intervals > 0:
            factor = self.decay**intervals
            self.histogram.scale(factor)
            self.distance_sum *= factor


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
