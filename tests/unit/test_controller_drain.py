"""An exiting operator lets the passes in flight end before its clients close, and starts none after."""

import asyncio
import copy

import kopf

from kvtier.controllers import build_registry
from kvtier.controllers.runtime import DRAIN_SECONDS, OperatorConfig, Passes, measured
from kvtier.telemetry.metrics import OperatorMetrics
from tests.unit.test_controller_login import KUBECONFIG


def _activity(activity_id, config=None):
    registry = build_registry(config or OperatorConfig())
    (handler,) = [h for h in registry._activities.get_all_handlers() if h.id == activity_id]
    return handler.fn


async def test_the_drain_waits_for_the_pass_in_flight_and_no_pass_starts_after_it_began():
    operator_memo = kopf.Memo(passes=Passes(), metrics=OperatorMetrics())
    # kopf hands each object a shallow copy of the operator's memo, made when the object is first seen.
    first, second = copy.copy(operator_memo), copy.copy(operator_memo)
    ran = []

    async def handler(**_):
        ran.append("start")
        await asyncio.sleep(0.2)  # a pool write on a slow apiserver
        ran.append("end")

    reconcile = measured("InferenceDeployment", handler)
    in_flight = asyncio.create_task(reconcile(memo=first))
    await asyncio.sleep(0.01)
    drain = asyncio.create_task(_activity("drain-passes")(memo=operator_memo))
    await asyncio.sleep(0.01)
    assert await reconcile(memo=second) is None  # a timer kopf fires during the exit: nothing runs
    await drain
    assert ran == ["start", "end"] and in_flight.done()
    counted = {"kind": "InferenceDeployment", "result": "success"}
    assert operator_memo.metrics.registry.get_sample_value("kvtier_reconcile_total", counted) == 1  # the one that ran
    assert await reconcile(memo=first) is None  # nor after the drain, while the clients close
    assert ran == ["start", "end"]


async def test_the_change_handlers_in_flight_get_as_long_at_exit_as_a_timers_pass(tmp_path):
    """kopf cancels its workers' handlers (a scale's update, a delete's release) 2 s into the exit unless told."""
    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    settings, memo = kopf.OperatorSettings(), kopf.Memo(passes=Passes())
    await _activity("configure", OperatorConfig(kubeconfig=tmp_path / "kubeconfig"))(settings=settings, memo=memo)
    try:
        assert settings.queueing.exit_timeout == DRAIN_SECONDS
    finally:
        await memo.kube.close()
