"""``kvtier sim serve``: one simulated vLLM + LMCache (MP) replica behind HTTP.

A :class:`SimServer` wraps one :class:`~kvtier.sim.engine.Engine` whose storage tier is an
:class:`~kvtier.sim.cache.IsolatedLRU` (one partition per ``cache_salt``) and runs it on a
clock that goes ``speed`` times faster than the wall clock: latencies, TTFT and gauges are in
simulated seconds. Requests come from ``/v1/completions`` or from a trace replayed in (scaled)
real time (:func:`replay_trace`). Two faces, each an aiohttp application:

- :func:`vllm_app` (vLLM's port): ``/health``, ``/v1/models``, ``/v1/completions`` and
  ``/metrics`` with vLLM 0.33's names and labels (``model_name``, ``engine``).
- :func:`lmcache_app` (the MP server's ``--http-port``, where LMCache 0.5.6 serves its API and its
  metrics; it never opens ``--prometheus-port``): ``/healthcheck``, the quota API as 0.5.6 answers it
  (``PUT|GET|DELETE /quota/{salt}``, ``GET /quota`` -> ``{"users": {salt: {...}}}``; the empty salt
  is ``_default``) and ``/metrics``. A quota of ``limit_gb`` GiB resizes the salt's L2 partition to
  ``floor(limit_gb * 2**30 / block_bytes)`` blocks at once; a salt without a quota keeps nothing
  (IsolatedLRU). The metrics are the MP server's OpenTelemetry instruments as its Prometheus
  exporter spells them, unit included (``lmcache_mp_lookup_hit_l2_tokens_total``,
  ``lmcache_mp_l1_memory_usage_bytes``...), with the real labels (lookups: ``model_name`` and
  ``cache_salt``; L1: ``backend``, ``l1_tag``; L2: ``l2_name``).

Every request is also written to the lookup-hash log when one is configured. How the counters
follow the model: the whole prompt is looked up in HBM (``prefix_cache_queries``); the tokens
past the HBM prefix are asked of LMCache (``external_prefix_cache_queries`` =
``lmcache_mp_lookup_requested``), which serves them from L1 (CPU) then L2 (storage); the log
holds every chunk of every prompt (the full access stream, as the probe needs). A simulated
block is one LMCache chunk. Counters move when a request arrives; its TTFT is known then too.
The log's timestamps are wall-clock time (what the probe's decay window is measured in).

Prompts: a string is split on whitespace into tokens (a list of token ids is taken as is); every
``block_tokens`` tokens make a block whose id hashes the salt, the previous block's id and its
tokens (prefix-chained, as vLLM and LMCache hash). Trace blocks keep their ids, mixed with the
salt when there is one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from kvtier.contract import DEFAULT_SALT
from kvtier.sim.cache import IsolatedLRU
from kvtier.sim.engine import Engine, EngineParams, RequestOutcome, Tier
from kvtier.sim.exposition import MpMetrics, VllmMetrics
from kvtier.sim.lookuplog import LookupHashLog, Rotation, chunk_hash
from kvtier.sim.settings import TraceLoad
from kvtier.sim.trace import iter_trace

log = logging.getLogger(__name__)

#: Bytes of one ``limit_gb`` of the quota API.
GB = 1 << 30
_YIELD_EVERY = 64


class BadRequest(ValueError):
    """A client error: answered with 400 and a JSON error."""


def salted(blocks: Sequence[int], salt: str) -> list[int]:
    """Trace block ids in a salt's own id space (unchanged for the empty salt)."""
    if not salt:
        return list(blocks)
    key = salt.encode() + b"\0"
    return [
        int.from_bytes(hashlib.blake2b(key + block.to_bytes(8, "big"), digest_size=8).digest(), "big")
        for block in blocks
    ]


def prompt_blocks(tokens: Sequence[Any], block_tokens: int, salt: str = "") -> list[int]:
    """Prefix-chained 64-bit block ids of a tokenised prompt (the last block may be partial)."""
    blocks = []
    previous = hashlib.blake2b(salt.encode(), digest_size=8).digest()
    for start in range(0, len(tokens), block_tokens):
        chunk = json.dumps(list(tokens[start : start + block_tokens])).encode()
        previous = hashlib.blake2b(previous + chunk, digest_size=8).digest()
        blocks.append(int.from_bytes(previous, "big"))
    return blocks


class SimServer:
    """The simulated replica: engine, clock, quotas, metrics and lookup-hash log."""

    def __init__(
        self,
        params: EngineParams,
        *,
        model: str = "kvsim",
        speed: float = 1.0,
        lookup_log: LookupHashLog | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not speed > 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        self.params = params
        self.model = model
        self.speed = speed
        self.pool = IsolatedLRU()
        self.engine = Engine(params, pool=self.pool)
        #: Set it (or replace it) any time; ``None`` writes no log.
        self.lookup_log = lookup_log
        self._clock = clock
        self._started = clock()
        self._requests = 0
        # Request ids are unique across restarts (the probe drops a recently seen id as a repeat).
        self._id_prefix = f"kvsim-{uuid.uuid4().hex[:12]}"
        # Salt -> the limit_gb last set, reported back exactly (the pool keeps whole blocks).
        self._limits: dict[str, float] = {}
        self.vllm_registry = CollectorRegistry()
        self.mp_registry = CollectorRegistry()
        self._vllm = VllmMetrics(self)
        self._mp = MpMetrics(self)

    def now(self) -> float:
        """Simulated seconds since the server started."""
        return (self._clock() - self._started) * self.speed

    def serve(self, blocks: Sequence[int], input_tokens: int, output_tokens: int, salt: str = "") -> RequestOutcome:
        """One request arriving now: look it up, store it, count it and log the lookup."""
        self._requests += 1
        outcome = self.engine.submit(self.now(), blocks, input_tokens, output_tokens, salt)
        self._vllm.record(outcome)
        self._mp.record(outcome, salt)
        if self.lookup_log is not None:
            self.lookup_log.write(
                f"{self._id_prefix}-{self._requests}",
                self.model,
                self.params.block_tokens,
                input_tokens,
                [chunk_hash(block) for block in blocks],
            )
        return outcome

    # The quota API, in GiB, over the pool's block quotas.

    def set_quota(self, salt: str, limit_gb: float) -> None:
        """Give a salt ``limit_gb`` GiB of L2 (a finite number >= 0, else ``ValueError``); a shrink evicts at once."""
        if not (math.isfinite(limit_gb) and limit_gb >= 0):
            raise ValueError(f"limit_gb must be a finite number >= 0, got {limit_gb}")
        self._limits[salt] = limit_gb
        self.pool.set_quota(salt, math.floor(limit_gb * GB / self.params.block_bytes))

    def delete_quota(self, salt: str) -> bool:
        """Remove a salt's quota (its blocks go); False when it had none."""
        if self._limits.pop(salt, None) is None:
            return False
        self.pool.delete_quota(salt)
        return True

    def quota_salts(self) -> list[str]:
        return sorted(self._limits)

    def quota_entry(self, salt: str) -> dict[str, Any]:
        return {
            "cache_salt": salt or DEFAULT_SALT,
            "limit_gb": self._limits.get(salt, 0.0),
            "current_usage_gb": self.pool.usage(salt) * self.params.block_bytes / GB,
            "exists": salt in self._limits,
        }


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def _json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every failure is a JSON error; nothing a client sends takes the server down."""
    try:
        return await handler(request)
    except BadRequest as error:
        return _error(400, str(error))
    except web.HTTPException as error:
        if error.status < 400:
            raise
        return _error(error.status, error.reason)
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return _error(500, "internal error")


def _application() -> web.Application:
    return web.Application(middlewares=[_json_errors], client_max_size=16 << 20)


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise BadRequest(f"body is not JSON: {error}") from None
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    return body


def _metrics_handler(registry: CollectorRegistry) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    return metrics


async def _healthy(_: web.Request) -> web.Response:
    return web.json_response({"status": "healthy"})


def vllm_app(server: SimServer) -> web.Application:
    """vLLM's OpenAI-compatible face."""

    async def models(_: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": server.model, "object": "model", "owned_by": "kvsim"}]}
        )

    async def completions(request: web.Request) -> web.Response:
        body = await _json_body(request)
        model = body.get("model", server.model)
        if model != server.model:
            return _error(404, f"The model `{model}` does not exist.")
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            tokens: list[Any] = prompt.split()
        elif isinstance(prompt, list) and all(type(token) is int for token in prompt):
            tokens = prompt
        else:
            raise BadRequest("prompt must be a string or a list of token ids")
        if not tokens:
            raise BadRequest("prompt is empty")
        max_tokens = body.get("max_tokens", 16)
        if type(max_tokens) is not int or max_tokens < 0:
            raise BadRequest("max_tokens must be an integer >= 0")
        salt = body.get("cache_salt") or ""
        if not isinstance(salt, str):
            raise BadRequest("cache_salt must be a string")
        blocks = prompt_blocks(tokens, server.params.block_tokens, salt)
        outcome = server.serve(blocks, len(tokens), max_tokens, salt)
        return web.json_response(
            {
                "id": f"cmpl-{uuid.uuid4().hex}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": server.model,
                "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}],
                "usage": {
                    "prompt_tokens": len(tokens),
                    "completion_tokens": max_tokens,
                    "total_tokens": len(tokens) + max_tokens,
                },
                "kvsim": {
                    "ttft_seconds": outcome.ttft,
                    "hit_tokens": {tier.name.lower(): outcome.hit_tokens[tier] for tier in Tier},
                },
            }
        )

    app = _application()
    app.router.add_get("/health", _healthy)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/metrics", _metrics_handler(server.vllm_registry))
    return app


def lmcache_app(server: SimServer) -> web.Application:
    """The LMCache MP server's HTTP port: health, live per-salt quotas and ``/metrics``."""

    def salt_of(request: web.Request) -> str:
        salt = request.match_info["salt"]
        return "" if salt == DEFAULT_SALT else salt

    async def get_quota(request: web.Request) -> web.Response:
        return web.json_response(server.quota_entry(salt_of(request)))

    async def put_quota(request: web.Request) -> web.Response:
        body = await _json_body(request)
        limit = body.get("limit_gb")
        try:
            if type(limit) not in (int, float):
                raise ValueError("not a number")
            server.set_quota(salt_of(request), float(limit))
        except ValueError:
            raise BadRequest('body must be {"limit_gb": <finite number >= 0>}') from None
        salt = salt_of(request)
        return web.json_response(
            {"cache_salt": salt or DEFAULT_SALT, "limit_gb": server.quota_entry(salt)["limit_gb"], "status": "ok"}
        )

    async def delete_quota(request: web.Request) -> web.Response:
        salt = salt_of(request)
        removed = server.delete_quota(salt)
        return web.json_response({"cache_salt": salt or DEFAULT_SALT, "status": "removed" if removed else "not_found"})

    async def list_quotas(_: web.Request) -> web.Response:
        users = {}
        for salt in server.quota_salts():
            entry = server.quota_entry(salt)
            users[entry["cache_salt"]] = {"limit_gb": entry["limit_gb"], "current_usage_gb": entry["current_usage_gb"]}
        return web.json_response({"users": users})

    app = _application()
    app.router.add_get("/healthcheck", _healthy)
    app.router.add_get("/quota", list_quotas)
    app.router.add_get("/quota/{salt}", get_quota)
    app.router.add_put("/quota/{salt}", put_quota)
    app.router.add_delete("/quota/{salt}", delete_quota)
    app.router.add_get("/metrics", _metrics_handler(server.mp_registry))
    return app


async def start_site(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Serve ``app`` on host:port; ``await runner.cleanup()`` stops it."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, reuse_address=True).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


class RunningSim:
    """Faces of a :class:`SimServer` being served, and its trace replay; ``await stop()`` ends them."""

    def __init__(self, runners: list[web.AppRunner], replay: asyncio.Task[int] | None) -> None:
        self.runners = runners
        #: The trace replay task (its result: requests served), if any.
        self.replay = replay

    async def stop(self) -> None:
        if self.replay is not None:
            self.replay.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.replay
        for runner in self.runners:
            await runner.cleanup()
        self.runners = []


async def start_sim(
    server: SimServer,
    host: str,
    *,
    port: int | None = None,
    lmcache_http_port: int | None = None,
    load: TraceLoad | None = None,
) -> RunningSim:
    """Serve the faces whose ports are given on ``host`` and replay ``load`` in the background."""
    runners: list[web.AppRunner] = []
    faces = ((vllm_app, port), (lmcache_app, lmcache_http_port))
    try:
        for make_app, face_port in faces:
            if face_port is not None:
                runners.append(await start_site(make_app(server), host, face_port))
    except BaseException:
        await RunningSim(runners, None).stop()
        raise
    replay = asyncio.get_running_loop().create_task(replay_trace(server, load)) if load is not None else None
    return RunningSim(runners, replay)


async def replay_trace(server: SimServer, load: TraceLoad) -> int:
    """Submit a trace's requests as the server's clock reaches their arrivals; returns how many were served.

    Returns at the end of the trace, or never with ``load.loop`` (cancel the task to stop it). An
    unreadable or malformed trace ends the replay (logged), never the server.
    """
    served = 0
    shift = load.time_shift
    try:
        while True:
            last = None
            for request in iter_trace(load.path, time_shift_seconds=shift):
                if request.arrival < 0:
                    continue
                delay = (request.arrival - server.now()) / server.speed
                if delay > 0:
                    await asyncio.sleep(delay)
                elif served % _YIELD_EVERY == 0:
                    await asyncio.sleep(0)  # catching up: let the HTTP faces answer now and then
                server.serve(salted(request.blocks, load.salt), request.input_tokens, request.output_tokens, load.salt)
                served += 1
                last = request.arrival
            if not load.loop or last is None:
                return served
            shift = last + 1.0
    except (OSError, ValueError) as error:
        log.error("trace replay of %s stopped after %d requests: %s", load.path, served, error)
        return served


def default_lookup_log_shapes(params: EngineParams) -> list[list[int]]:
    """A KV-cache shape consistent with the engine's bytes per token (2-byte elements)."""
    return [[params.block_tokens, params.kv_bytes_per_token // 2]]


def open_lookup_log(directory: str | os.PathLike[str], params: EngineParams, **rotation: Any) -> LookupHashLog:
    """A lookup-hash log for the engine, with :class:`~kvtier.sim.lookuplog.Rotation` keywords."""
    return LookupHashLog(directory, Rotation(**rotation), shapes=default_lookup_log_shapes(params))
