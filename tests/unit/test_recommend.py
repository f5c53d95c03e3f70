"""The pool's capacity recommendation (pure): `kvtier plan --live`'s computation in short, the recommended
capacity's threshold, what counts as a material change, and the undersized state machine."""

from datetime import UTC, datetime

import pytest

from kvtier.api.errors import problems
from kvtier.api.kvpool import CapacityPoint, KVPool, PoolRecommendation
from kvtier.rebalance.planlive import LIVE_BLOCK_BYTES, LivePool
from kvtier.rebalance.planner import CurveProfile, evaluate_curves, plan
from kvtier.rebalance.recommend import (
    GRID,
    SHOWN,
    Sizing,
    advance,
    divisible,
    grid_blocks,
    material,
    recommend,
    undersized,
)

GIB = 2**30
NOW = datetime(2026, 12, 4, tzinfo=UTC)


def curve(name, points, replicas=1, rate=1000.0, **fields):
    """A deployment's published curve: ``points`` in (GiB per replica, hit ratio)."""
    return CurveProfile(
        name, [(gib * GIB, ratio) for gib, ratio in points], replicas, rate, 327680, LIVE_BLOCK_BYTES, 1e-4, **fields
    )


def pool(profiles, capacity_gib=64, bandwidth=None):
    return LivePool("pool", capacity_gib * GIB, bandwidth, profiles)


def test_the_points_are_what_kvtier_plan_computes_at_those_capacities():
    live = pool(
        [
            curve("a/chat", [(8, 0.2), (32, 0.5)], replicas=2, rate=4000.0),
            curve("a/code", [(16, 0.1), (64, 0.6)], rate=1500.0),
        ],
        bandwidth=2e9,
    )
    recommendation = recommend(live, 0.02, NOW)
    blocks = [grid_blocks(live.capacity_blocks, factor) for factor in SHOWN]
    expected = plan(live.profiles, blocks, evaluate=evaluate_curves, block_bytes=LIVE_BLOCK_BYTES, read_bandwidth=2e9)
    assert [p.factor for p in recommendation.points] == list(SHOWN)
    for point, outcome in zip(recommendation.points, expected):
        assert point.capacity == outcome.capacity_bytes
        assert point.hit_ratio == pytest.approx(outcome.block_hit_ratio, abs=1e-4)
        assert point.gpu_seconds_saved_per_hour == pytest.approx(outcome.gpu_seconds_saved_per_hour, abs=1e-3)
        assert point.saturated == outcome.saturated
    assert recommendation.points[0].hit_ratio < recommendation.points[1].hit_ratio < recommendation.points[2].hit_ratio
    assert recommendation.deployments == 2 and recommendation.capacity == 64 * GIB


@pytest.mark.parametrize(
    ("plateau_gib", "factor"),
    [(64, 1.0), (128, 2.0), (32, 0.5), (16, 0.25)],
)
def test_the_recommendation_is_where_the_curve_stops_paying(plateau_gib, factor):
    # Linear up to the plateau, flat beyond: doubling any capacity at or past it gains nothing, doubling
    # any capacity below it gains at least a quarter of the plateau's hit ratio.
    recommendation = recommend(pool([curve("a/x", [(plateau_gib, 0.5)])]), 0.02, NOW)
    assert recommendation.recommended_capacity == grid_blocks(64 * GIB // LIVE_BLOCK_BYTES, factor) * LIVE_BLOCK_BYTES
    assert "doubling it adds 0.000" in recommendation.reason


def test_the_threshold_decides_how_far_a_slow_curve_is_followed():
    # The hit ratio keeps growing slowly up to 1024 GiB: each doubling from 64 GiB adds 0.05 x the doubled size / 64.
    slow = [curve("a/x", [(64, 0.5), (1024, 1.0)])]
    strict, loose = recommend(pool(slow), 0.005, NOW), recommend(pool(slow), 0.2, NOW)
    assert strict.recommended_capacity == 8 * 64 * GIB and "at least 512Gi" in strict.reason
    assert loose.recommended_capacity is not None and loose.recommended_capacity < strict.recommended_capacity
    tried = {factor: grid_blocks(64 * GIB // LIVE_BLOCK_BYTES, factor) for factor in GRID}
    ratios = {
        o.capacity_blocks: o.block_hit_ratio
        for o in plan(slow, list(tried.values()), evaluate=evaluate_curves, block_bytes=LIVE_BLOCK_BYTES)
    }
    chosen = loose.recommended_capacity // LIVE_BLOCK_BYTES
    gains = []
    for f in GRID:
        double = next((g for g in GRID if abs(g - 2 * f) < 1e-9), None)
        if double is not None:
            gains.append((tried[f], ratios[tried[double]] - ratios[tried[f]]))
    # Every doubling from the recommendation up gains less than the threshold; the one just below it does not.
    assert all(gain < 0.2 for blocks, gain in gains if blocks >= chosen)
    below = [gain for blocks, gain in gains if blocks < chosen]
    assert below and below[-1] >= 0.2


def test_without_curves_there_is_no_recommendation_and_it_says_why():
    live = LivePool("pool", 64 * GIB, None, [], ["a/x: no status.kv.demand yet"])
    recommendation = recommend(live, 0.02, NOW)
    assert recommendation.recommended_capacity is None and recommendation.points == []
    assert "status.kv.demand" in recommendation.reason and recommendation.without_curve == 1
    assert not undersized(recommendation, 0.25)


def test_saturation_is_reported_against_the_read_bandwidth_only_when_known():
    profiles = [curve("a/x", [(64, 0.5)], rate=100000.0)]
    assert recommend(pool(profiles), 0.02, NOW).saturated is None
    assert recommend(pool(profiles, bandwidth=1.0), 0.02, NOW).saturated is True
    wide = recommend(pool(profiles, bandwidth=1e15), 0.02, NOW)
    assert wide.saturated is False and all(p.saturated is False for p in wide.points)


def test_points_below_the_deployments_minimums_are_left_out():
    profiles = [curve("a/x", [(64, 0.5)], min_blocks=40 * GIB // LIVE_BLOCK_BYTES)]
    assert [p.factor for p in recommend(pool(profiles), 0.02, NOW).points] == [1.0, 2.0]


def test_a_capacity_just_at_the_minimums_is_left_out_when_whole_units_do_not_fit():
    # Found on the demo's pool: three deployments of 8 GiB minimum each; at 24 GiB (0.25x of 96 GiB) a unit is
    # 6 blocks and each minimum rounds up to 1366 units: 4098 of 4096. The planner's split refuses it.
    minimum = 8 * GIB // LIVE_BLOCK_BYTES
    profiles = [curve(f"a/{name}", [(64, 0.5)], min_blocks=minimum) for name in "xyz"]
    assert not divisible(profiles, 3 * minimum) and divisible(profiles, 4 * minimum)
    with pytest.raises(ValueError):
        plan(profiles, [3 * minimum], evaluate=evaluate_curves, block_bytes=LIVE_BLOCK_BYTES)
    recommendation = recommend(pool(profiles, capacity_gib=96), 0.02, NOW)
    assert recommendation.recommended_capacity is not None and len(recommendation.points) == 3


def recommendation(**fields):
    points = [
        CapacityPoint(
            factor=1.0, capacity=GIB, hit_ratio=0.3, gpu_seconds_saved_per_hour=100.0, read_bytes_per_second=0
        )
    ]
    return PoolRecommendation(
        **{"observed_at": NOW, "capacity": GIB, "recommended_capacity": 2 * GIB, "points": points, **fields}
    )


def moved(hit_ratio=0.3, saved=100.0, saturated=None):
    return recommendation(
        points=[
            CapacityPoint(
                factor=1.0,
                capacity=GIB,
                hit_ratio=hit_ratio,
                gpu_seconds_saved_per_hour=saved,
                read_bytes_per_second=0,
                saturated=saturated,
            )
        ]
    )


def test_what_counts_as_a_material_change():
    old = recommendation()
    assert material(None, old)
    assert not material(old, recommendation(observed_at=datetime(2027, 1, 1, tzinfo=UTC), reason="other words"))
    assert not material(old, moved(hit_ratio=0.305)) and material(old, moved(hit_ratio=0.311))
    assert not material(old, moved(saved=104.0)) and material(old, moved(saved=106.0))
    assert material(old, moved(saturated=True))
    assert material(old, recommendation(recommended_capacity=4 * GIB))
    assert material(old, recommendation(streak=1)) and material(old, recommendation(undersized=True))
    assert material(old, recommendation(deployments=3)) and material(old, recommendation(points=[]))


def test_undersized_means_beyond_the_margin():
    assert not undersized(recommendation(recommended_capacity=GIB + GIB // 4), 0.25)
    assert undersized(recommendation(recommended_capacity=GIB + GIB // 4 + 1), 0.25)
    assert not undersized(recommendation(recommended_capacity=None), 0.25)


def run(findings, refreshes, start=Sizing(False, 0)):
    """The state after each finding, and the findings that flipped it."""
    state, flips = start, []
    for index, finding in enumerate(findings):
        state = advance(state, finding, refreshes)
        if state.flipped:
            flips.append((index, state.undersized))
    return state, flips


def test_the_undersized_state_flips_only_after_sustained_findings_and_once():
    # Two undersized refreshes are not enough; the third declares it; more of the same say nothing.
    state, flips = run([True, True, True, True, True, True], 3)
    assert flips == [(2, True)] and state == Sizing(True, 0)
    # A single contrary finding resets the count.
    _, flips = run([True, True, False, True, True, False, True], 3)
    assert flips == []
    # Recovery needs as many agreeing refreshes, then says so once.
    state, flips = run([True] * 3 + [False] * 5 + [True] * 2, 3)
    assert flips == [(2, True), (5, False)] and state == Sizing(False, 2)
    # With one refresh each finding decides.
    _, flips = run([True, True, False, False, True], 1)
    assert flips == [(0, True), (2, False), (4, True)]


def test_the_spec_bounds_the_interval_and_names_the_field():
    body = {
        "apiVersion": "kvtier.io/v1alpha1",
        "kind": "KVPool",
        "metadata": {"name": "p"},
        "spec": {"capacity": "1Gi", "storage": {"hostPath": {"path": "/x"}}, "recommendation": {"interval": "500ms"}},
    }
    with pytest.raises(ValueError) as error:
        KVPool.model_validate(body)
    assert any("recommendation.interval" in problem.field for problem in problems(error.value))
    body["spec"]["recommendation"] = {}
    spec = KVPool.model_validate(body).spec.recommendation
    assert (spec.interval, spec.min_gain_per_doubling, spec.undersized_margin, spec.undersized_refreshes) == (
        300.0,
        0.02,
        0.25,
        3,
    )
