"""One rebalancing round (kvtier.rebalance.loop): the safety rules around the allocator."""

import math
from dataclasses import replace
from itertools import accumulate

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.api.kvpool import RebalanceSpec
from kvtier.rebalance.estimator import Estimate
from kvtier.rebalance.loop import (
    WARMUP_HORIZON_INTERVALS,
    DeploymentState,
    LoopSettings,
    actuation_order,
    decide,
    proportional_split,
    warmed_curve,
)


def _estimate(curve, confidence=1.0, rate=None, stale=False):
    return Estimate(tuple(curve), confidence, stale, "probe", curve[-1] * 2 if rate is None else rate)


def _concave(height, scale, units=100):
    return [height * (1 - math.exp(-units_ / scale)) for units_ in range(units + 1)]


BUSY, IDLE = _concave(100.0, 40), _concave(5.0, 20)
FREE = LoopSettings(max_step=1.0, cooldown_seconds=0.0)


def _pool(busy=50, idle=50, busy_options=None, idle_options=None):
    return {
        "busy": DeploymentState(busy, _estimate(BUSY), **(busy_options or {})),
        "idle": DeploymentState(idle, _estimate(IDLE), **(idle_options or {})),
    }


def test_capacity_moves_to_the_busy_deployment_and_the_decision_explains_it():
    decision = decide(_pool(), 100, FREE, now=1000.0)
    assert decision.outcome == "moved" and decision.applies
    assert decision.target["busy"] > 80 and sum(decision.target.values()) <= 100
    assert decision.predicted_gain > 0.01 and decision.value_after > decision.value_before
    assert [change.name for change in decision.changes] == ["idle", "busy"]  # the shrink first
    assert decision.moved_units == decision.target["busy"] - 50
    assert "quota changes" in decision.reason


def test_a_gain_below_min_gain_moves_nothing():
    nearly = decide(_pool(busy=85, idle=15), 100, FREE, now=0.0)
    assert nearly.outcome == "moved" and nearly.predicted_gain < 0.05
    decision = decide(
        _pool(busy=85, idle=15), 100, LoopSettings(min_gain=0.05, max_step=1.0, cooldown_seconds=0), now=0.0
    )
    assert decision.outcome == "below-min-gain" and not decision.applies
    assert decision.target == {"busy": 85, "idle": 15} and decision.proposed == nearly.proposed


def test_max_step_caps_what_one_round_moves():
    decision = decide(_pool(), 100, LoopSettings(max_step=0.1, cooldown_seconds=0), now=0.0)
    assert decision.outcome == "moved"
    assert decision.target == {"busy": 60, "idle": 40} and decision.moved_units == 10


def test_no_move_within_cooldown_of_the_last_one():
    settings_ = LoopSettings(max_step=1.0, cooldown_seconds=300)
    waiting = decide(_pool(), 100, settings_, now=1000.0, last_move=800.0)
    assert waiting.outcome == "cooldown" and waiting.target == {"busy": 50, "idle": 50}
    assert waiting.proposed["busy"] > 80 and "100s left" in waiting.reason
    assert decide(_pool(), 100, settings_, now=1100.0, last_move=800.0).outcome == "moved"


def test_a_dry_run_reports_the_moves_without_applying_them():
    decision = decide(_pool(), 100, LoopSettings(max_step=1.0, cooldown_seconds=0, dry_run=True), now=0.0)
    assert decision.outcome == "dry-run" and not decision.applies
    assert decision.target == {"busy": 50, "idle": 50} and decision.changes and decision.proposed["busy"] > 80


def test_static_puts_every_deployment_at_its_request_whatever_the_curves():
    pool = _pool(busy_options={"request_units": 30}, idle_options={"request_units": 70})
    decision = decide(pool, 100, LoopSettings(policy="Static"), now=0.0)
    assert decision.outcome == "static" and decision.target == {"busy": 30, "idle": 70} and decision.applies
    assert decide(_pool(), 100, LoopSettings(policy="Static"), now=0.0).changes == ()


def test_static_honours_dry_run_and_cooldown():
    pool = _pool(busy_options={"request_units": 30}, idle_options={"request_units": 70})
    dry = decide(pool, 100, LoopSettings(policy="Static", dry_run=True), now=0.0)
    assert dry.outcome == "dry-run" and not dry.applies and dry.proposed == {"busy": 30, "idle": 70}
    cooling = decide(pool, 100, LoopSettings(policy="Static", cooldown_seconds=300), now=100.0, last_move=0.0)
    assert cooling.outcome == "cooldown" and cooling.target == {"busy": 50, "idle": 50}


def test_a_pool_holding_more_than_it_may_divide_makes_room_whatever_the_gain():
    """Capacity lowered, or a waiting deployment's minimum kept aside: the deployments shrink into what
    there is, even though that loses value (below any minGain) and whatever maxStep says."""
    settings_ = LoopSettings(min_gain=0.05, max_step=0.1, cooldown_seconds=0)
    twins = {name: DeploymentState(50, _estimate(BUSY)) for name in ("a", "b")}
    decision = decide(twins, 80, settings_, now=0.0)
    assert decision.outcome == "moved" and decision.predicted_gain < 0 and decision.target == {"a": 40, "b": 40}
    assert "making room" in decision.reason


def test_a_stale_deployment_is_frozen_and_the_others_share_the_rest():
    pool = {
        **_pool(busy=20, idle=50),
        "gone": DeploymentState(30, _estimate(BUSY, stale=True)),
        "new": DeploymentState(0, None),
    }
    decision = decide(pool, 100, FREE, now=0.0)
    assert decision.frozen == ("gone", "new") and "(frozen: gone, new)" in decision.reason
    assert decision.target["gone"] == 30 and decision.target["new"] == 0
    assert decision.target["busy"] + decision.target["idle"] == 70 and decision.target["busy"] > 55
    everyone = {name: DeploymentState(50, None) for name in ("a", "b")}
    assert decide(everyone, 100, FREE, now=0.0).outcome == "frozen"


def test_thin_data_grows_little():
    pool = {"busy": DeploymentState(50, _estimate(BUSY, confidence=0.1)), "idle": DeploymentState(50, _estimate(IDLE))}
    decision = decide(pool, 100, FREE, now=0.0)
    assert decision.target["busy"] == 60  # confidence 0.1 x a step of the whole pool
    none = {"busy": DeploymentState(50, _estimate(BUSY, confidence=0.0)), "idle": DeploymentState(50, _estimate(IDLE))}
    assert decide(none, 100, FREE, now=0.0).target["busy"] == 50


def test_bounds_hold_even_against_the_curves():
    pool = _pool(busy_options={"max_units": 70}, idle_options={"min_units": 20})
    decision = decide(pool, 100, FREE, now=0.0)
    assert decision.target == {"busy": 70, "idle": 30}


def test_proportional_shares_by_weight_times_access_rate():
    pool = {
        "a": DeploymentState(50, _estimate(BUSY, rate=300.0)),
        "b": DeploymentState(50, _estimate(IDLE, rate=100.0), weight=2.0),
    }
    decision = decide(pool, 100, LoopSettings(policy="Proportional", max_step=1.0, cooldown_seconds=0), now=0.0)
    assert decision.target == {"a": 60, "b": 40} and decision.outcome == "moved"
    assert decision.predicted_gain == pytest.approx(0.10)  # the share of the pool moved
    assert proportional_split({"a": 9.0, "b": 1.0}, 10, {"a": (0, 6), "b": (0, None)}) == {"a": 6, "b": 4}
    assert proportional_split({"a": 0.0, "b": 0.0}, 5, {"a": (0, None), "b": (0, None)}) == {"a": 3, "b": 2}
    assert proportional_split({"a": 1.0, "b": 99.0}, 10, {"a": (3, None), "b": (0, None)}) == {"a": 3, "b": 7}


def test_settings_come_from_the_kvpool_spec():
    spec = RebalanceSpec(policy="Proportional", interval="2m", cooldown="10m", minGain=0.05, maxStep=0.5, dryRun=True)
    assert LoopSettings.from_spec(spec) == LoopSettings("Proportional", 0.05, 0.5, 600.0, True, 120.0)


def test_a_grown_quota_is_worth_only_what_it_fills_within_the_horizon():
    curve = [float(units) for units in range(11)]  # one hit per second per unit
    assert warmed_curve(curve, 4, 1e9, 100.0)[4:] == pytest.approx(curve[4:])  # instant fill
    assert warmed_curve(curve, 4, 0.0, 100.0) == curve[:5] + [4.0] * 6  # nothing to fill with
    warmed = warmed_curve(curve, 4, 0.1, 100.0)  # one unit per 10 s
    assert warmed[:5] == curve[:5]
    assert warmed[5] == pytest.approx((4 * 10 + 5 * 90) / 100)
    assert warmed[10] == warmed[11 - 1] and warmed[10] < 10


def test_a_longer_horizon_pays_for_a_slower_refill():
    """The busy deployment refills about 0.13 units a second: in the shipped two intervals (120 s) a
    grown quota fills 15 units; over twenty it fills all it could get."""
    pool = _pool(busy_options={"unit_tokens": 1000.0})
    shipped = decide(pool, 100, FREE, now=0.0)
    patient = decide(pool, 100, replace(FREE, warmup_horizon_intervals=20.0), now=0.0)
    assert FREE.warmup_horizon_intervals == WARMUP_HORIZON_INTERVALS == 2.0
    assert shipped.target["busy"] < patient.target["busy"]
    assert shipped.predicted_gain < patient.predicted_gain


@st.composite
def _rounds(draw):
    count = draw(st.integers(1, 4))
    capacity = draw(st.integers(0, 60))
    names = [f"d{index}" for index in range(count)]
    deployments = {}
    left = capacity
    for name in names:
        low = draw(st.integers(0, max(0, min(left, 10))))
        left -= low
        high = draw(st.one_of(st.none(), st.integers(low, low + 40)))
        current = draw(st.integers(low, min(low + left, 10**6 if high is None else high)))
        left -= current - low
        steps = draw(st.lists(st.floats(0, 10), min_size=1, max_size=40))
        curve = list(accumulate([0.0] + steps))
        estimate = draw(
            st.one_of(
                st.none(),
                st.builds(
                    Estimate, st.just(tuple(curve)), st.floats(0, 1), st.booleans(), st.just("probe"), st.floats(0, 100)
                ),
            )
        )
        deployments[name] = DeploymentState(
            current, estimate, min_units=low, max_units=high, unit_tokens=draw(st.one_of(st.none(), st.floats(1, 100)))
        )
    loop = LoopSettings(
        draw(st.sampled_from(["MarginalGain", "Proportional"])),
        draw(st.floats(0, 0.2)),
        draw(st.floats(0.01, 1)),
        0.0,
        draw(st.booleans()),
    )
    return deployments, capacity, loop


@settings(max_examples=300, deadline=None)
@given(_rounds())
def test_a_round_never_overfills_the_pool_and_keeps_every_bound(round_):
    deployments, capacity, loop = round_
    decision = decide(deployments, capacity, loop, now=0.0)
    for split in (decision.target, decision.proposed):
        assert set(split) == set(deployments) and sum(split.values()) <= capacity
        for name, state in deployments.items():
            if state.frozen:
                assert split[name] == state.current
            else:
                assert state.min_units <= split[name] and (state.max_units is None or split[name] <= state.max_units)
    step = math.floor(loop.max_step * capacity)
    assert decision.moved_units <= step
    if not decision.applies:
        assert decision.target == {name: state.current for name, state in deployments.items()}
    # Applied in order, the changes never hold more than the pool.
    held = {name: state.current for name, state in deployments.items()}
    for change in decision.changes:
        held[change.name] = change.to_units
        assert sum(held.values()) <= capacity
    assert held == decision.proposed


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from("abcdef"), st.tuples(st.integers(0, 50), st.integers(0, 50)), min_size=1))
def test_shrinks_come_first_so_the_running_total_never_exceeds_the_larger_split(pairs):
    current = {name: before for name, (before, _) in pairs.items()}
    target = {name: after for name, (_, after) in pairs.items()}
    order = actuation_order(current, target)
    assert {change.name for change in order} == {name for name in pairs if current[name] != target[name]}
    growing = [change.to_units > change.from_units for change in order]
    assert growing == sorted(growing)
    held = dict(current)
    for change in order:
        held[change.name] = change.to_units
        assert sum(held.values()) <= max(sum(current.values()), sum(target.values()))
