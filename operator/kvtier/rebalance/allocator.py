"""The allocator: divide a pool's capacity between deployments by marginal gain (pure, no I/O).

Every deployment brings a :class:`Demand`: its demand curve (hits, in blocks or tokens, at every
quota of 0, 1, 2, ... capacity units), the value of one hit (so curves of deployments with
different block sizes or prefill speeds compare: hit tokens, or prefill seconds saved), a weight,
and ``min`` / ``max`` bounds. :func:`allocate` turns them and the pool's capacity into integer
quotas; :func:`predict` is its estimate of what a split is worth; :func:`limit_step` caps how much
one round moves.

Why concave hulls. LRU hit curves have cliffs: a working set that fits gains nothing until the
last of it fits, then everything (Talus, Beckmann & Sanchez, HPCA 2015). Greedy by the marginal
gain of one more unit stalls at the foot of a cliff, because the next unit gains nothing; greedy
on the curve's *upper concave hull* sees the average gain of climbing the whole cliff, and hull
segments are what it compares. An LRU partition cannot sit halfway up a hull segment and earn the
hull's value there (Talus would need shadow partitions, which LMCache's salts cannot express), so
the allocator only ever stops on real points of the curves, and the predicted value of its split
is exact, not the hull's optimism. Two searches, the better wins:

- the lookahead climb: from its current quota each deployment offers the point of its curve with
  the best average gain per unit *within the capacity still free* (the first vertex of the hull
  of that window, the nearest on ties); the best offer wins whole; repeat until nothing gains
  (UCP's lookahead, made fast by the hulls). On concave curves the offers are single units and
  this is the classic optimal greedy.
- one deployment aside: its quota searched exhaustively while the others share the rest in the
  order greedy on their full hulls hands units out (one walk gives their split for every
  remainder). This catches what any greedy misses: a deployment whose value sits behind a long
  convex stretch, outbid unit by unit by steeper curves until the stretch no longer fits. With
  two deployments it is exhaustive, so exact on any curves.

Both are monotone in the free capacity, so more capacity never lowers the predicted total.
Cost: O(n * C) time and memory for n deployments and C units (about 0.1 s for 3 deployments and
13,531 units); pick units accordingly (blocks, or GiB for a whole array).

Curves are made non-decreasing by a running maximum: an LRU never hits less with more room, so a
dip is estimation noise. Beyond its last point a curve is flat. Capacity left once nothing gains
goes back toward the current split (no needless moves), then evenly, within ``max``.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate


@dataclass(frozen=True)
class Demand:
    """What a share of the pool is worth to one deployment."""

    curve: Sequence[float]
    """Hits at a quota of c units, c = 0 .. len - 1 (flat beyond the last point)."""
    hit_value: float = 1.0
    """Value of one hit of the curve, e.g. prefill seconds saved per hit block."""
    weight: float = 1.0
    min_units: int = 0
    max_units: int | None = None
    """None: no bound but the pool."""
    _values: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.curve:
            raise ValueError("a demand curve needs at least the point at 0 units")
        if self.hit_value < 0 or self.weight < 0:
            raise ValueError("hit_value and weight must be >= 0")
        if self.min_units < 0 or (self.max_units is not None and self.max_units < self.min_units):
            raise ValueError(f"bounds must satisfy 0 <= min <= max, got {self.min_units}, {self.max_units}")
        scale = self.hit_value * self.weight
        object.__setattr__(self, "_values", tuple([scale * hits for hits in accumulate(self.curve, max)]))

    def value(self, units: int) -> float:
        """Weighted value of a quota of ``units`` (by the non-decreasing curve)."""
        values = self._values
        return values[min(units, len(values) - 1)]

    def bounded(self, units: int) -> int:
        """``units`` clamped into [min, max]."""
        units = max(units, self.min_units)
        return units if self.max_units is None else min(units, self.max_units)


def predict(demands: Mapping[str, Demand], quotas: Mapping[str, int]) -> float:
    """The allocator's estimate of a split's total value (missing deployments count at 0 units)."""
    return sum(demand.value(quotas.get(name, 0)) for name, demand in demands.items())


def feasible(demands: Mapping[str, Demand], quotas: Mapping[str, int], capacity: int) -> bool:
    """Whether ``quotas`` gives every deployment a quota within its bounds and fits the capacity."""
    return (
        set(quotas) == set(demands)
        and all(demand.bounded(quotas[name]) == quotas[name] for name, demand in demands.items())
        and sum(quotas.values()) <= capacity
    )


def upper_concave_hull(values: Sequence[float], start: int = 0, end: int | None = None) -> list[int]:
    """Vertices (indices) of the upper concave hull of the points (x, values[x]) for start <= x <= end.

    Points on a hull segment are kept as vertices, so the first vertex after ``start`` is the
    *nearest* point of best average slope from it.
    """
    end = len(values) - 1 if end is None else end
    hull: list[int] = []
    heights: list[float] = []
    size = 0
    for x in range(start, end + 1):
        y = values[x]
        while size >= 2:
            x0, y0 = hull[size - 2], heights[size - 2]
            # Drop the last vertex when it lies strictly below the chord from x0 to x.
            if (heights[size - 1] - y0) * (x - x0) < (y - y0) * (hull[size - 1] - x0):
                hull.pop()
                heights.pop()
                size -= 1
            else:
                break
        hull.append(x)
        heights.append(y)
        size += 1
    return hull


class _Climber:
    """One deployment's walk up its curve: offers the best-slope point reachable with the free capacity."""

    __slots__ = ("values", "at", "top", "hull", "next")

    def __init__(self, demand: Demand, capacity: int, full_hull: list[int]) -> None:
        """``full_hull``: the hull from the minimum to the top of the curve (:func:`_top`)."""
        self.values = demand._values
        self.at = demand.min_units
        limit = _top(demand)
        self.top = min(limit, self.at + capacity)
        if self.top <= self.at:
            self.hull = [self.at]
        else:
            self.hull = full_hull if self.top == limit else upper_concave_hull(self.values, self.at, self.top)
        self.next = 1  # index in hull of the vertex after `at`

    def offer(self, free: int) -> tuple[float, int] | None:
        """(gain per unit, units) of the best climb within ``free`` units, or None when nothing gains."""
        at = self.at
        if self.next >= len(self.hull) or self.hull[self.next] - at > free:
            top = min(self.top, at + free)
            if top <= at:
                return None
            self.hull = upper_concave_hull(self.values, at, top)
            self.next = 1
        target = self.hull[self.next]
        gain = self.values[target] - self.values[at]
        if gain <= 0:
            return None
        return gain / (target - at), target - at

    def climb(self, units: int) -> None:
        self.at += units
        self.next += 1


def allocate(demands: Mapping[str, Demand], capacity: int, current: Mapping[str, int] | None = None) -> dict[str, int]:
    """Integer quotas (capacity units) that maximise the predicted value, within bounds and capacity.

    Every deployment first gets its ``min``. The split is the better (ties: the first) of the
    lookahead climb and, for each deployment in name order, the best quota for it with the rest
    shared by :func:`_hull_order` (see :func:`_best_with_one_aside`); then the capacity nobody
    gains from is spread. If ``current`` is a feasible split its estimate beats, it is returned
    unchanged. Raises ``ValueError`` when the minimums exceed the capacity.
    """
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    free = capacity - sum(demand.min_units for demand in demands.values())
    if free < 0:
        raise ValueError(f"the deployments' minimums need {capacity - free} units, the pool has {capacity}")
    # Each deployment's hull above its minimum, built once for both searches.
    hulls: dict[str, list[int]] = {}
    for name, demand in demands.items():
        top = _top(demand)
        hulls[name] = upper_concave_hull(demand._values, demand.min_units, top) if top > demand.min_units else []
    best = _climb(demands, free, hulls)
    best_value = predict(demands, best)
    segments = _hull_segments(demands, hulls)
    for name in sorted(demands):
        candidate = _best_with_one_aside(demands, free, name, segments)
        value = predict(demands, candidate)
        if value > best_value:
            best, best_value = candidate, value
    _spread(demands, best, capacity - sum(best.values()), current)
    if current is not None and feasible(demands, current, capacity) and predict(demands, current) > best_value:
        return dict(current)
    return best


def _top(demand: Demand) -> int:
    """The highest quota (units) a deployment's curve and ``max`` allow."""
    top = len(demand._values) - 1
    return top if demand.max_units is None else min(demand.max_units, top)


def _climb(demands: Mapping[str, Demand], free: int, hulls: Mapping[str, list[int]]) -> dict[str, int]:
    """The lookahead climb: the best offer by gain per unit wins whole (ties: the name sorting first)."""
    order = {name: rank for rank, name in enumerate(sorted(demands))}
    climbers = {name: _Climber(demand, free, hulls[name]) for name, demand in demands.items()}
    offers: list[tuple[float, int, str, int]] = []
    for name, climber in climbers.items():
        _push(offers, climber.offer(free), order[name], name)
    while offers and free:
        _, _, name, units = heapq.heappop(offers)
        climber = climbers[name]
        if units > free:  # stale: the offer was made when more was free; ask again
            _push(offers, climber.offer(free), order[name], name)
            continue
        climber.climb(units)
        free -= units
        _push(offers, climber.offer(free), order[name], name)
    return {name: climber.at for name, climber in climbers.items()}


Segment = tuple[float, int, str, int]


def _hull_segments(demands: Mapping[str, Demand], hulls: Mapping[str, list[int]]) -> dict[str, list[Segment]]:
    """Each deployment's hull segments above its minimum that gain: ``(-gain per unit, rank, name, units)``."""
    segments: dict[str, list[Segment]] = {}
    for rank, name in enumerate(sorted(demands)):
        values, hull = demands[name]._values, hulls[name]
        segments[name] = [
            ((values[a] - values[b]) / (b - a), rank, name, b - a)
            for a, b in zip(hull, hull[1:])
            if values[b] > values[a]
        ]
    return segments


def _hull_runs(segments: Mapping[str, list[Segment]], units: int) -> list[tuple[str, int]]:
    """The first ``units`` units above the minimums, in the order greedy on the full hulls hands them out.

    Hull segments of all deployments merged by gain per unit (ties: name order), each
    deployment's own segments in order; only segments that gain. Each run ``(name, length)``
    gives the next ``length`` units to ``name``, so the first R units of the runs are the split
    of R free units, for every R <= ``units``.
    """
    runs: list[tuple[str, int]] = []
    for _, _, name, length in heapq.merge(*segments.values(), key=lambda segment: segment[:2]):
        if units <= 0:
            break
        runs.append((name, min(length, units)))
        units -= length
    return runs


def _best_with_one_aside(
    demands: Mapping[str, Demand], free: int, aside: str, segments: Mapping[str, list[Segment]]
) -> dict[str, int]:
    """The best quota for ``aside`` while the others share the rest in hull order.

    Greedy on hulls stalls where one deployment's value sits behind a long convex stretch (a
    conversation trace whose sessions only pay back together): searching that deployment's quota
    exhaustively, with the others' split for every remainder read off one ordered walk, finds it.
    """
    others = {name: demand for name, demand in demands.items() if name != aside}
    runs = _hull_runs({name: segments[name] for name in sorted(others)}, free)
    quotas = {name: demand.min_units for name, demand in others.items()}
    # rest[r]: the others' value with r free units (a run never climbs past the top of its curve).
    rest = [predict(others, quotas)]
    append = rest.append
    running = rest[0]
    for name, length in runs:
        values = others[name]._values
        held = quotas[name]
        for unit in range(held + 1, held + length + 1):
            running = running + values[unit] - values[unit - 1]
            append(running)
        quotas[name] = held + length
    demand = demands[aside]
    low = demand.min_units
    high = low + free if demand.max_units is None else min(demand.max_units, low + free)
    values, top = demand._values, len(demand._values) - 1
    last = len(rest) - 1
    totals = [values[min(units, top)] + rest[min(free - (units - low), last)] for units in range(low, high + 1)]
    best_units = low + totals.index(max(totals))  # the smallest quota of the best
    split = {name: demand.min_units for name, demand in others.items()}
    given = free - (best_units - low)
    for name, length in runs:
        if given <= 0:
            break
        split[name] += min(length, given)
        given -= length
    split[aside] = best_units
    return {name: split[name] for name in demands}


def _push(offers: list[tuple[float, int, str, int]], offer: tuple[float, int] | None, rank: int, name: str) -> None:
    if offer is not None:
        gain, units = offer
        heapq.heappush(offers, (-gain, rank, name, units))


def _spread(
    demands: Mapping[str, Demand], quotas: dict[str, int], free: int, current: Mapping[str, int] | None
) -> None:
    """Hand out capacity that gains nothing: back toward ``current`` first, then evenly, within ``max``."""

    def room(name: str) -> float:
        bound = demands[name].max_units
        return float("inf") if bound is None else bound - quotas[name]

    if current is not None:
        for name in sorted(demands):
            extra = int(min(free, room(name), max(0, current.get(name, 0) - quotas[name])))
            quotas[name] += extra
            free -= extra
    open_ = [name for name in sorted(demands) if room(name) > 0]
    while free and open_:
        share, extra = divmod(free, len(open_))
        for index, name in enumerate(open_):
            given = int(min(room(name), share + (1 if index < extra else 0)))
            quotas[name] += given
            free -= given
        open_ = [name for name in open_ if room(name) > 0]


def moved_units(before: Mapping[str, int], after: Mapping[str, int]) -> int:
    """Units that change hands between two splits: the sum of the quotas' increases."""
    return sum(max(0, after.get(name, 0) - before.get(name, 0)) for name in after)


def limit_step(current: Mapping[str, int], target: Mapping[str, int], max_step_units: int) -> dict[str, int]:
    """Move from ``current`` toward ``target`` by at most ``max_step_units`` of increases.

    The increases (all of them if they fit in the step) are shared among the growing deployments
    in proportion to how far each is from its target, and funded by the shrinking ones in the same
    proportion (rounded up), so every quota lands between its current and target values (bounds
    that hold for both hold for the result) and the total never exceeds the larger of the two
    totals (never over capacity). With nothing to grow, shrinks are applied in full.
    """
    if max_step_units < 0:
        raise ValueError(f"max_step_units must be >= 0, got {max_step_units}")
    names = sorted(set(current) | set(target))
    delta = {name: target.get(name, 0) - current.get(name, 0) for name in names}
    growth = sum(change for change in delta.values() if change > 0)
    shrink = -sum(change for change in delta.values() if change < 0)
    step = min(growth, max_step_units)
    funded = shrink if growth == 0 else min(shrink, -(-shrink * step // growth))
    grown = apportion({name: change for name, change in delta.items() if change > 0}, step)
    shrunk = apportion({name: -change for name, change in delta.items() if change < 0}, funded)
    return {name: current.get(name, 0) + grown.get(name, 0) - shrunk.get(name, 0) for name in names}


def apportion(weights: Mapping[str, int], total: int) -> dict[str, int]:
    """``total`` units in integer shares proportional to ``weights`` (largest remainders; ties by name)."""
    whole = sum(weights.values())
    if not whole:
        return {}
    shares = {name: weight * total // whole for name, weight in weights.items()}
    left = total - sum(shares.values())
    by_remainder = sorted(weights, key=lambda name: (-(weights[name] * total % whole), name))
    for name in by_remainder[:left]:
        shares[name] += 1
    return shares
