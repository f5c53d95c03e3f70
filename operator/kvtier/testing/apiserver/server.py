"""Running the emulator: :class:`APIServer` (asyncio), :class:`ThreadedAPIServer` (own thread, for
sync code), and :func:`write_kubeconfig`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from aiohttp import web

from .core import Cluster
from .faults import FaultInjector, RequestLog
from .http import APIHandler

T = TypeVar("T")


def write_kubeconfig(
    path: str | Path, server_url: str, *, context: str = "kvtier-embedded", namespace: str = "default"
) -> Path:
    """Write a kubeconfig pointing at `server_url` (plain HTTP, a dummy token) and return its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": {"server": server_url}}],
        "users": [{"name": context, "user": {"token": "kvtier-embedded"}}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": context, "namespace": namespace}}],
        "current-context": context,
        "preferences": {},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class APIServer:
    """The Kubernetes API emulator on 127.0.0.1, as an async context manager.

    `cluster` holds the state (see :class:`~.core.Cluster` for in-process access), `faults` the
    fault rules and `requests` the request log.  `validate_builtins=False` skips the JSON-schema
    validation of built-in kinds (for benchmarks); `history_size` is the number of events per
    resource kept for watch resumption; `bookmark_interval` is how often watches that allow
    bookmarks get one.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        validate_builtins: bool = True,
        history_size: int = 10_000,
        bookmark_interval: float = 60.0,
    ) -> None:
        self.host = host
        self.port = port
        self.cluster = Cluster(validate_builtins=validate_builtins, history_size=history_size)
        self.faults = FaultInjector()
        self.requests = RequestLog()
        self._handler = APIHandler(self.cluster, self.faults, self.requests, bookmark_interval)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> APIServer:
        self.cluster.start()
        # handler_cancellation: a client that goes away ends its watch (and frees the watcher) at once.
        self._runner = web.AppRunner(
            self._handler.app(), handle_signals=False, access_log=None, shutdown_timeout=1.0, handler_cancellation=True
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server  # aiohttp exposes the bound port only through the asyncio server
        assert server is not None and server.sockets
        self.port = server.sockets[0].getsockname()[1]
        self._handler.server_address = f"{self.host}:{self.port}"
        return self

    async def stop(self) -> None:
        await self.cluster.stop()  # ends open watch streams first
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> APIServer:
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    def write_kubeconfig(self, path: str | Path, **kwargs: Any) -> Path:
        return write_kubeconfig(path, self.url, **kwargs)

    def close_watches(self, resource: str | None = None, group: str | None = None) -> int:
        """Drop open watch streams (all, or of one resource); returns how many were closed."""
        closed = 0
        for (coll_group, plural), coll in self.cluster.store.collections.items():
            if (resource is None or resource == plural) and (group is None or group == coll_group):
                for watcher in list(coll.watchers):
                    watcher.close()
                    closed += 1
        return closed


class ThreadedAPIServer:
    """An :class:`APIServer` running on its own event loop thread, for sync tests and the CLI.

    Use as a context manager or call :meth:`start` / :meth:`stop`.  `faults` and `requests` are
    thread-safe; touch `cluster` only through :meth:`call`, which runs a function on the server's
    loop and returns its result.
    """

    def __init__(self, **kwargs: Any) -> None:
        self.server = APIServer(**kwargs)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def faults(self) -> FaultInjector:
        return self.server.faults

    @property
    def requests(self) -> RequestLog:
        return self.server.requests

    @property
    def cluster(self) -> Cluster:
        return self.server.cluster

    def start(self) -> ThreadedAPIServer:
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self.server.start())
            except BaseException as exc:
                started.set_exception(exc)
                return
            started.set_result(None)
            self._loop.run_forever()
            self._loop.run_until_complete(self.server.stop())
            self._loop.close()

        self._thread = threading.Thread(target=run, name="kvtier-apiserver", daemon=True)
        self._thread.start()
        started.result(timeout=30)
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        self._thread = None

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn(*args, **kwargs)` on the server's loop and return its result."""
        assert self._loop is not None

        async def invoke() -> T:
            return fn(*args, **kwargs)

        return asyncio.run_coroutine_threadsafe(invoke(), self._loop).result(timeout=30)

    def write_kubeconfig(self, path: str | Path, **kwargs: Any) -> Path:
        return self.server.write_kubeconfig(path, **kwargs)

    def close_watches(self, resource: str | None = None, group: str | None = None) -> int:
        return self.call(self.server.close_watches, resource, group)

    def __enter__(self) -> ThreadedAPIServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
