"""Stopping the embedded cluster while its pod simulator is being woken up: `kvtier dev up` printed
"stopping" and hung on a loaded machine, because the simulator's wait for its next pass swallowed the
cancellation that lands as a watch event wakes it (`asyncio.wait_for` on Python 3.11, bpo-42130)."""

import asyncio

from kvtier.testing.cluster import EmbeddedCluster
from kvtier.testing.engines import stub_engine


def test_a_stop_that_lands_as_the_simulator_wakes_up_stops_it():
    async def scenario() -> bool:
        cluster = await EmbeddedCluster(engine_factory=stub_engine).start()
        simulator = cluster.simulator
        while simulator.passes < 2:  # parked in its wait for the next event or resync
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)
        simulator._wake.set()  # a watch event arrives ...
        stopping = asyncio.ensure_future(cluster.stop())  # ... and, in the same turn of the loop, the stop
        done, _ = await asyncio.wait({stopping}, timeout=10)
        if not done:  # the cancellation was lost: cancel again so the test ends, failed
            cluster._simulator_task.cancel()
            await stopping
        return bool(done)

    assert asyncio.run(scenario()), "the cluster did not stop within 10 s: the simulator swallowed its cancellation"
