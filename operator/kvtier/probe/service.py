"""The probe as a process: poll the log directory, feed the demand curve, serve ``/metrics``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from kvtier.contract import HEALTH_PATH, METRICS_PATH
from kvtier.probe.demand import DemandProbe
from kvtier.probe.tail import LogTailer

log = logging.getLogger(__name__)


class Probe:
    """A :class:`LogTailer` feeding a :class:`DemandProbe`; :meth:`poll` catches up with the log."""

    def __init__(
        self,
        log_dir: str | os.PathLike[str],
        demand: DemandProbe,
        *,
        poll_seconds: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if poll_seconds <= 0:
            raise ValueError("poll_seconds must be > 0")
        self.tailer = LogTailer(log_dir)
        self.demand = demand
        self.poll_seconds = poll_seconds
        self._clock = clock
        self.registry = CollectorRegistry()
        self.registry.register(demand)

    def poll(self) -> int:
        """Read every new line (also called before each scrape, so a scrape is never behind); returns how many."""
        lines = 0
        for line in self.tailer.poll():
            self.demand.feed(line)
            lines += 1
        self.demand.advance(self._clock())
        return lines

    def app(self) -> web.Application:
        async def metrics(_: web.Request) -> web.Response:
            self._safe_poll()
            return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def health(_: web.Request) -> web.Response:
            return web.json_response({"status": "healthy"})

        app = web.Application()
        app.router.add_get(METRICS_PATH, metrics)
        app.router.add_get(HEALTH_PATH, health)
        return app

    async def run(self) -> None:
        """Poll every ``poll_seconds`` until cancelled."""
        while True:
            self._safe_poll()
            await asyncio.sleep(self.poll_seconds)

    def _safe_poll(self) -> None:
        """Poll; a failure is logged and the probe keeps serving what it has."""
        try:
            self.poll()
        except OSError as error:
            log.warning("cannot read the lookup-hash log in %s: %s", self.tailer.directory, error)
        except Exception:
            log.exception("reading the lookup-hash log in %s failed", self.tailer.directory)


class RunningProbe:
    """A probe serving on a host and port; ``await stop()`` ends it."""

    def __init__(self, probe: Probe, runner: web.AppRunner, task: asyncio.Task[None]) -> None:
        self.probe = probe
        self._runner = runner
        self._task = task

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._runner.cleanup()


async def start_probe(probe: Probe, host: str, port: int) -> RunningProbe:
    """Serve ``probe`` on host:port and poll it in the background."""
    runner = web.AppRunner(probe.app(), access_log=None, handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, reuse_address=True).start()
    except BaseException:
        await runner.cleanup()
        raise
    return RunningProbe(probe, runner, asyncio.get_running_loop().create_task(probe.run()))
