"""The allocator's promises, as properties over random demand curves, plus the cases that motivate it."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.rebalance.allocator import (
    Demand,
    allocate,
    feasible,
    limit_step,
    moved_units,
    predict,
    upper_concave_hull,
)

NAMES = ["a", "b", "c", "d"]


def _concave(increments):
    """A non-decreasing concave curve from non-negative increments (sorted largest first)."""
    curve = [0]
    for step in sorted(increments, reverse=True):
        curve.append(curve[-1] + step)
    return curve


any_curve = st.lists(st.integers(0, 50), min_size=1, max_size=14)
concave_curve = st.lists(st.integers(0, 50), max_size=13).map(_concave)


@st.composite
def problems(draw, curves=any_curve, max_tenants=4):
    """(demands, capacity): random curves, weights, values of a hit and bounds that fit the capacity."""
    count = draw(st.integers(1, max_tenants))
    demands = {}
    for name in NAMES[:count]:
        low = draw(st.integers(0, 4))
        high = draw(st.one_of(st.none(), st.integers(low, low + 15)))
        demands[name] = Demand(
            draw(curves),
            hit_value=draw(st.sampled_from([0.0, 0.5, 1.0, 3.0])),
            weight=draw(st.sampled_from([1.0, 2.0])),
            min_units=low,
            max_units=high,
        )
    capacity = sum(d.min_units for d in demands.values()) + draw(st.integers(0, 30))
    return demands, capacity


@st.composite
def current_split(draw, demands, capacity):
    """A random feasible split of at most ``capacity``."""
    quotas = {name: d.min_units for name, d in demands.items()}
    free = capacity - sum(quotas.values())
    for name, demand in demands.items():
        room = free if demand.max_units is None else min(free, demand.max_units - quotas[name])
        extra = draw(st.integers(0, room))
        quotas[name] += extra
        free -= extra
    return quotas


def _brute_force(demands, capacity):
    """The best predicted value over every feasible integer split."""
    names = list(demands)
    ranges = [
        range(
            demands[n].min_units,
            capacity + 1 if demands[n].max_units is None else min(capacity, demands[n].max_units) + 1,
        )
        for n in names
    ]
    return max(
        predict(demands, dict(zip(names, split))) for split in itertools.product(*ranges) if sum(split) <= capacity
    )


@settings(max_examples=300, deadline=None)
@given(problems())
def test_never_over_capacity_and_within_bounds(problem):
    demands, capacity = problem
    quotas = allocate(demands, capacity)
    assert set(quotas) == set(demands)
    assert all(isinstance(units, int) for units in quotas.values())
    assert feasible(demands, quotas, capacity)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_never_worse_than_the_current_split_by_its_own_estimate(data):
    demands, capacity = data.draw(problems())
    current = data.draw(current_split(demands, capacity))
    quotas = allocate(demands, capacity, current)
    assert feasible(demands, quotas, capacity)
    assert predict(demands, quotas) >= predict(demands, current)


@settings(max_examples=300, deadline=None)
@given(problems(), st.integers(1, 10))
def test_more_capacity_never_lowers_the_predicted_total(problem, more):
    demands, capacity = problem
    values = [predict(demands, allocate(demands, c)) for c in (capacity, capacity + 1, capacity + more)]
    assert values == sorted(values)


@settings(max_examples=200, deadline=None)
@given(problems(curves=concave_curve, max_tenants=3))
def test_optimal_on_concave_curves(problem):
    demands, capacity = problem
    assert predict(demands, allocate(demands, capacity)) == pytest.approx(_brute_force(demands, capacity))


@settings(max_examples=200, deadline=None)
@given(problems(max_tenants=3))
def test_on_any_curves_as_good_as_the_best_split_for_two(problem):
    """With two deployments the one-aside search is exhaustive: exact on any curves."""
    demands, capacity = problem
    if len(demands) > 2:
        demands = dict(list(demands.items())[:2])
        capacity = max(capacity, sum(d.min_units for d in demands.values()))
    assert predict(demands, allocate(demands, capacity)) == pytest.approx(_brute_force(demands, capacity))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-20, 50), min_size=1, max_size=20))
def test_upper_concave_hull_covers_every_point(values):
    hull = upper_concave_hull(values)
    assert hull[0] == 0 and hull[-1] == len(values) - 1 and hull == sorted(set(hull))
    for x0, x1 in zip(hull, hull[1:]):
        for x in range(x0, x1 + 1):  # no point above a chord
            assert values[x] * (x1 - x0) <= values[x0] * (x1 - x) + values[x1] * (x - x0) + 1e-9
    slopes = [(values[x1] - values[x0]) / (x1 - x0) for x0, x1 in zip(hull, hull[1:])]
    assert all(s >= t - 1e-9 for s, t in zip(slopes, slopes[1:]))  # concave


def test_a_cliff_is_climbed_whole():
    """A working set of 10 units is worth nothing until it fits (Talus' cliff); greedy by one unit would never start."""
    cliff = Demand([0] * 10 + [100])
    gentle = Demand([0, 9, 17, 24, 30, 35, 39, 42, 44, 45, 45])
    assert allocate({"cliff": cliff, "gentle": gentle}, 10) == {"cliff": 10, "gentle": 0}
    # With 9 units the cliff is out of reach: the gentle one takes them all.
    assert allocate({"cliff": cliff, "gentle": gentle}, 9) == {"cliff": 0, "gentle": 9}


def test_one_deployment_behind_a_long_convex_stretch_still_gets_its_share():
    """Two steep concave curves would win every unit on gain per unit; the best split gives the third its stretch."""
    steep = Demand([min(10 * c, 60 + c) for c in range(21)])
    stretch = Demand([3 * c for c in range(20)] + [100])
    demands = {"x": steep, "y": steep, "z": stretch}
    quotas = allocate(demands, 28)
    assert quotas == {"x": 6, "y": 2, "z": 20}
    assert predict(demands, quotas) == 180  # climbing by gain per unit alone: x 6, y 6, z 16 -> 168


def test_the_value_of_a_hit_makes_curves_comparable():
    # The same hit curve; tenant b's hits save twice the prefill seconds.
    curve = [0, 10, 15, 18, 20]
    demands = {"a": Demand(curve, hit_value=1.0), "b": Demand(curve, hit_value=2.0)}
    assert allocate(demands, 4) == {"a": 1, "b": 3}
    weighted = {"a": Demand(curve, weight=2.0), "b": Demand(curve, hit_value=2.0)}
    assert predict(weighted, {"a": 2, "b": 2}) == 60


def test_ties_are_broken_by_name_whatever_the_order():
    curve = [0, 5, 10, 15]
    forward = allocate({"a": Demand(curve), "b": Demand(curve)}, 3)
    backward = allocate({"b": Demand(curve), "a": Demand(curve)}, 3)
    assert forward == backward == {"a": 3, "b": 0}


def test_minimums_first_maximums_never_exceeded_and_spare_capacity_spread():
    demands = {"a": Demand([0, 10, 20], min_units=1, max_units=2), "b": Demand([0, 1], min_units=3, max_units=None)}
    quotas = allocate(demands, 10)
    assert quotas["a"] == 2 and quotas["b"] == 8  # b gains nothing above 1 unit, but spare capacity is not wasted
    # Capacity that gains nothing goes back to its current holders first (no needless moves).
    flat = {"a": Demand([0, 1]), "b": Demand([0, 1])}
    assert allocate(flat, 10, current={"a": 7, "b": 3}) == {"a": 7, "b": 3}
    with pytest.raises(ValueError, match="minimums"):
        allocate(demands, 3)
    with pytest.raises(ValueError):
        Demand([])
    with pytest.raises(ValueError):
        Demand([0, 1], min_units=3, max_units=2)


def test_dips_in_a_curve_are_noise():
    demand = Demand([0, 5, 3, 4, 8])
    assert [demand.value(c) for c in range(7)] == [0, 5, 5, 5, 8, 8, 8]


@st.composite
def steps(draw):
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4, unique=True))
    current = {name: draw(st.integers(0, 40)) for name in names}
    target = {name: draw(st.integers(0, 40)) for name in names}
    return current, target, draw(st.integers(0, 60))


@settings(max_examples=300, deadline=None)
@given(steps())
def test_limit_step_moves_at_most_the_step_toward_the_target(case):
    current, target, max_step = case
    result = limit_step(current, target, max_step)
    assert moved_units(current, result) <= max_step
    for name in result:
        assert min(current[name], target[name]) <= result[name] <= max(current[name], target[name])
    assert sum(result.values()) <= max(sum(current.values()), sum(target.values()))
    if moved_units(current, target) <= max_step:
        assert result == target


def test_limit_step_shares_the_step():
    assert limit_step({"a": 100, "b": 0, "c": 0}, {"a": 0, "b": 60, "c": 40}, 50) == {"a": 50, "b": 30, "c": 20}
    assert limit_step({"a": 10, "b": 0}, {"a": 4, "b": 0}, 0) == {"a": 4, "b": 0}  # shrinks alone are not moves
    with pytest.raises(ValueError):
        limit_step({}, {}, -1)
