"""An exiting operator lets the passes in flight end before its clients close, and starts none after."""

import asyncio

import kopf

from kvtier.controllers import build_registry
from kvtier.controllers.runtime import OperatorConfig, measured


def _drain():
    registry = build_registry(OperatorConfig())
    (handler,) = [h for h in registry._activities.get_all_handlers() if h.id == "drain-passes"]
    return handler.fn


async def test_the_drain_waits_for_the_pass_in_flight_and_no_pass_starts_after_it_began():
    memo = kopf.Memo(passes=set(), stopping=False)
    ran = []

    async def handler(**_):
        ran.append("start")
        await asyncio.sleep(0.2)  # a pool write on a slow apiserver
        ran.append("end")

    reconcile = measured("InferenceDeployment", handler)
    in_flight = asyncio.create_task(reconcile(memo=memo))
    await asyncio.sleep(0.01)
    drain = asyncio.create_task(_drain()(memo=memo))
    await asyncio.sleep(0.01)
    assert await reconcile(memo=memo) is None  # a timer kopf fires during the exit: nothing runs
    await drain
    assert ran == ["start", "end"] and in_flight.done()
