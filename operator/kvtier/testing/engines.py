"""What answers on a simulated pod's ports until kvsim engines take over.

The pod simulator asks an :data:`EngineFactory` to serve each container it starts. The default,
:func:`stub_engine`, answers every port a container declares with the endpoints an operator and
a kubelet touch: health (`/health`, `/healthcheck`), `/v1/models`, an empty `/metrics` page, and
the LMCache MP quota API (`/quota`, `/quota/{salt}` with `{"limit_gb": x}`), kept in memory.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from kvtier.sim.pods import DEFAULT_TRACE, TRACES_ENV, KvsimEngines, find_trace_dir
from kvtier.sim.settings import TraceLoad

log = logging.getLogger(__name__)

#: `(pod, container, address)` -> a started engine with `async stop()`.
EngineFactory = Callable[[dict[str, Any], dict[str, Any], str], Awaitable["RunningEngine"]]


class RunningEngine:
    """HTTP sites of one container on the pod's address."""

    def __init__(self, runner: web.AppRunner | None):
        self._runner = runner

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def container_ports(container: dict[str, Any]) -> list[int]:
    return sorted({int(port["containerPort"]) for port in container.get("ports", []) if "containerPort" in port})


def _stub_app(container: dict[str, Any]) -> web.Application:
    quotas: dict[str, float] = {}
    name = container.get("name", "")

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "healthy"})

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": name, "object": "model"}]})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="", content_type="text/plain")

    def quota_entry(salt: str) -> dict[str, Any]:
        return {
            "cache_salt": salt,
            "limit_gb": quotas.get(salt, 0.0),
            "current_usage_gb": 0.0,
            "exists": salt in quotas,
        }

    async def get_quota(request: web.Request) -> web.Response:
        return web.json_response(quota_entry(request.match_info["salt"]))

    async def put_quota(request: web.Request) -> web.Response:
        try:
            limit = float((await request.json())["limit_gb"])
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": 'body must be {"limit_gb": <float >= 0>}'}, status=400)
        if limit < 0:
            return web.json_response({"error": "limit_gb must be >= 0"}, status=400)
        quotas[request.match_info["salt"]] = limit
        return web.json_response(quota_entry(request.match_info["salt"]))

    async def delete_quota(request: web.Request) -> web.Response:
        quotas.pop(request.match_info["salt"], None)
        return web.json_response(quota_entry(request.match_info["salt"]))

    async def list_quotas(_: web.Request) -> web.Response:
        # LMCache 0.5.6's shape: an object keyed by salt.
        return web.json_response(
            {"users": {salt: {"limit_gb": limit, "current_usage_gb": 0.0} for salt, limit in sorted(quotas.items())}}
        )

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/healthcheck", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/quota", list_quotas)
    app.router.add_get("/quota/{salt}", get_quota)
    app.router.add_put("/quota/{salt}", put_quota)
    app.router.add_delete("/quota/{salt}", delete_quota)
    return app


async def stub_engine(pod: dict[str, Any], container: dict[str, Any], address: str) -> RunningEngine:
    """Serve the stub endpoints on every port the container declares."""
    ports = container_ports(container)
    if not ports:
        return RunningEngine(None)
    runner = web.AppRunner(_stub_app(container), access_log=None, handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    for port in ports:
        await web.TCPSite(runner, address, port, reuse_address=True).start()
    return RunningEngine(runner)


def embedded_engines(
    root: str | os.PathLike[str] | None = None, trace_dir: str | os.PathLike[str] | None = None
) -> KvsimEngines:
    """The embedded cluster's factory (:class:`~kvtier.sim.pods.KvsimEngines`): kvsim for vllm/lmcache/probe containers, the stub for others,
    and :data:`DEFAULT_TRACE` (looped) as the load of pods that name no trace, when it can be found."""
    directory = Path(trace_dir) if trace_dir is not None else find_trace_dir()
    default_load = None
    if directory is not None and (directory / DEFAULT_TRACE).is_file():
        default_load = TraceLoad(DEFAULT_TRACE, loop=True)
    else:
        log.warning("no trace %s (set %s): simulated pods without KVSIM_TRACE stay idle", DEFAULT_TRACE, TRACES_ENV)
    return KvsimEngines(root, fallback=stub_engine, trace_dir=directory, default_load=default_load)
