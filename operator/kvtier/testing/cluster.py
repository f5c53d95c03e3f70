"""The embedded cluster: the API emulator, kvtier's CRDs and the pod simulator, in one process.

    async with EmbeddedCluster(kubeconfig="/tmp/kvtier/kubeconfig") as cluster: ...
    with BackgroundCluster() as cluster: ...        # on its own thread, for sync tests and the CLI

Anything that speaks to a Kubernetes API (kubectl, the kubernetes client, kopf, kvtier itself)
uses it through `cluster.kubeconfig`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import signal
import tempfile
import threading
from collections.abc import Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from kvtier.api.crd import build_crds
from kvtier.api.units import counted
from kvtier.controllers import OperatorConfig, run_operator
from kvtier.kube import CUSTOMRESOURCEDEFINITIONS, NAMESPACES, Connection, KubeClient
from kvtier.testing import podsim
from kvtier.testing.apiserver import APIServer
from kvtier.testing.engines import EngineFactory, embedded_engines
from kvtier.testing.podsim import NodeSpec, PodSimulator

log = logging.getLogger(__name__)

T = TypeVar("T")


def default_nodes(count: int = 4, *, gpus: int = 8, memory: str = "2Ti", cpu: str = "128") -> list[NodeSpec]:
    return [NodeSpec(f"sim-node-{index}", cpu=cpu, memory=memory, gpus=gpus) for index in range(count)]


class OperatorThread:
    """The operator on its own thread and event loop.

    kopf owns its loop: when it stops it cancels every task created after it started, so it must
    not share a loop with the API server or the pod simulator.
    """

    def __init__(self, config: OperatorConfig):
        self.config = config
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._main, name="kvtier-operator", daemon=True)

    def _main(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._task = self._loop.create_task(run_operator(self.config, stop_flag=self._stop, ready_flag=self._ready))
        try:
            self._loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass
        except Exception as error:
            if not self._stop.is_set():
                raise
            # A stop that lands while kopf is still starting can end a task of its own in TimeoutError (asyncio's
            # wait_for turns the cancellation into one); the operator stopped as asked, so one line, no traceback.
            log.warning("the operator stopped during its start-up (%s)", type(error).__name__)
        finally:
            self._loop.close()

    def start(self, timeout: float = 60) -> None:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the operator was not ready within {timeout}s")

    def stop(self, *, crash: bool = False, timeout: float = 30) -> None:
        if crash and self._loop is not None and self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
            self._thread.join(timeout)
        # After a crash too: kopf waits for this flag on an executor thread, which would block interpreter exit.
        self._stop.set()
        self._thread.join(timeout)


class SimulatedCluster:
    """An API server + kvtier's CRDs + the pod simulator's parts it lacks + (optionally) the operator, on the
    running event loop (pods run kvsim engines by default). Subclasses start and stop the API server."""

    #: The pod simulator's parts this ground needs (see :mod:`kvtier.testing.podsim`).
    components: frozenset[str] = podsim.EMBEDDED
    server: APIServer | None = None

    @property
    def url(self) -> str:
        raise NotImplementedError

    def __init__(
        self,
        nodes: list[NodeSpec] | None = None,
        *,
        kubeconfig: str | Path | None = None,
        engine_factory: EngineFactory | None = None,
        install_crds: bool = True,
        operator: OperatorConfig | None = None,
    ):
        self.nodes = default_nodes() if nodes is None else nodes
        self._tempdir: tempfile.TemporaryDirectory[str] | None = None
        if kubeconfig is None:
            self._tempdir = tempfile.TemporaryDirectory(prefix="kvtier-cluster-")
            kubeconfig = Path(self._tempdir.name) / "kubeconfig"
        self.kubeconfig = Path(kubeconfig)
        #: What serves the pods' containers; by default kvsim engines with live trace load
        #: (:func:`kvtier.testing.engines.embedded_engines`); pass :func:`~kvtier.testing.engines.stub_engine`
        #: for endpoints that only answer health and quota calls.
        self.engine_factory = engine_factory if engine_factory is not None else embedded_engines()
        self.install_crds = install_crds
        self.kube: KubeClient | None = None
        self.simulator: PodSimulator | None = None
        self._simulator_task: asyncio.Task[None] | None = None
        #: The kvtier operator's settings (its kubeconfig is this cluster's); None: no operator.
        self.operator = replace(operator, kubeconfig=self.kubeconfig) if operator else None
        self._operator_thread: OperatorThread | None = None

    async def _start_api(self) -> None:
        """Start the API server and write :attr:`kubeconfig` (admin credentials)."""
        raise NotImplementedError

    async def _stop_api(self) -> None:
        raise NotImplementedError

    async def _install_crds(self) -> None:
        assert self.kube is not None
        for crd in build_crds().values():
            await self.kube.create(CUSTOMRESOURCEDEFINITIONS, crd)

    async def _prepare_operator(self) -> None:
        """Before the operator starts: its namespace (subclasses add credentials)."""
        assert self.kube is not None and self.operator is not None
        if await self.kube.get_or_none(NAMESPACES, None, self.operator.namespace) is None:
            await self.kube.create(
                NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.operator.namespace}}
            )

    async def start(self) -> SimulatedCluster:
        await self._start_api()
        connection = Connection.from_kubeconfig(str(self.kubeconfig))
        self.kube = await KubeClient(connection, user_agent="kvtier-podsim").open()
        if self.install_crds:
            await self._install_crds()
        self.simulator = PodSimulator(
            self.kube, self.nodes, engine_factory=self.engine_factory, components=self.components
        )
        await self.simulator.register_nodes()
        self._simulator_task = asyncio.create_task(self.simulator.run(), name="kvtier-podsim")
        if self.operator is not None:
            await self._prepare_operator()
            await self.start_operator()
        return self

    async def start_operator(self) -> None:
        """Run the kvtier operator against this cluster (on its own thread); returns once it is ready."""
        assert self.operator is not None and self._operator_thread is None
        self._operator_thread = OperatorThread(self.operator)
        await asyncio.to_thread(self._operator_thread.start)

    async def stop_operator(self, *, crash: bool = False) -> None:
        """Stop the operator: gracefully, or (`crash`) by cancelling it wherever it is, like a killed process."""
        if self._operator_thread is not None:
            await asyncio.to_thread(self._operator_thread.stop, crash=crash)
            self._operator_thread = None

    async def stop(self) -> None:
        try:
            await self.stop_operator()
            if self._simulator_task is not None:
                self._simulator_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._simulator_task
                self._simulator_task = None
            if self.kube is not None:
                await self.kube.close()
                self.kube = None
        finally:
            await self._stop_api()
            if self._tempdir is not None:
                self._tempdir.cleanup()
                self._tempdir = None

    async def __aenter__(self) -> SimulatedCluster:
        try:
            return await self.start()
        except BaseException:
            await self.stop()
            raise

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()


class EmbeddedCluster(SimulatedCluster):
    """The API emulator (:mod:`kvtier.testing.apiserver`) with every part of the pod simulator."""

    def __init__(
        self, nodes: list[NodeSpec] | None = None, *, port: int = 0, validate_builtins: bool = True, **kwargs: Any
    ):
        super().__init__(nodes, **kwargs)
        self.server = APIServer(port=port, validate_builtins=validate_builtins)

    @property
    def url(self) -> str:
        return self.server.url

    async def _start_api(self) -> None:
        await self.server.start()
        self.server.write_kubeconfig(self.kubeconfig)

    async def _stop_api(self) -> None:
        await self.server.stop()


class _LoopThread:
    """An event loop on its own daemon thread; `run(coro)` executes a coroutine there and waits."""

    def __init__(self, name: str):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def _close_loop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        if not self._loop.is_running() and not self._loop.is_closed():
            self._loop.close()


class BackgroundCluster(_LoopThread):
    """A :class:`SimulatedCluster` (by default an :class:`EmbeddedCluster` made of ``kwargs``) on its own
    event-loop thread (sync tests, the CLI)."""

    def __init__(self, cluster: SimulatedCluster | None = None, **kwargs: Any):
        super().__init__("kvtier-cluster")
        self.cluster = cluster if cluster is not None else EmbeddedCluster(**kwargs)

    #: The operator and the simulated pods run in this process (:attr:`cluster` stops and restarts the operator;
    #: its ``simulator`` and ``engine_factory`` reach the pods' engines).
    in_process = True

    @property
    def embedded(self) -> bool:
        """On the API emulator (its fault injector and request log are :attr:`server`'s)."""
        return isinstance(self.cluster, EmbeddedCluster)

    @property
    def kubeconfig(self) -> Path:
        return self.cluster.kubeconfig

    @property
    def server(self) -> APIServer | None:
        return self.cluster.server if isinstance(self.cluster, EmbeddedCluster) else None

    @property
    def kube(self) -> KubeClient:
        assert self.cluster.kube is not None
        return self.cluster.kube

    def start(self, timeout: float = 240) -> BackgroundCluster:
        try:
            self.run(self.cluster.start(), timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
            self.run(self.cluster.stop(), timeout=60)
        self._close_loop()

    def __enter__(self) -> BackgroundCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class ExternalCluster(_LoopThread):
    """A real cluster (kind, a test cluster) behind a kubeconfig, with the same face as :class:`BackgroundCluster`."""

    embedded = False
    in_process = False
    server = None

    def __init__(self, kubeconfig: str | Path):
        super().__init__("kvtier-external-cluster")
        self.kubeconfig = Path(kubeconfig)
        connection = Connection.from_kubeconfig(str(self.kubeconfig))
        self.kube = self.run(KubeClient(connection, user_agent="kvtier-e2e").open())

    def stop(self) -> None:
        with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
            self.run(self.kube.close(), timeout=30)
        self._close_loop()

    def __enter__(self) -> ExternalCluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


async def serve_until_signalled(
    cluster: SimulatedCluster,
    *,
    echo: Callable[[str], None] = print,
    kind: str = "embedded cluster",
    kubectl: str = "kubectl",
) -> int:
    """`kvtier dev up`: run a cluster (and the operator) until SIGINT or SIGTERM, saying how to use it; returns
    the signal's number. The kubeconfig is removed on the way out (the server it names is gone)."""
    stop = asyncio.Event()
    received: list[int] = []

    def stop_on(signum: int) -> None:
        received.append(signum)
        stop.set()

    nodes, operator, kubeconfig = cluster.nodes, cluster.operator, cluster.kubeconfig
    async with cluster:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):  # after the operator's own handlers: ours stop everything
            loop.add_signal_handler(signum, stop_on, signum)
        gpus = sum(node.gpus for node in nodes)
        echo(f"kvtier {kind}: API server {cluster.url}, {counted(len(nodes), 'simulated node')} ({gpus} GPUs)")
        echo(f"  operator: {'running' if operator else 'not started'}")
        echo(f"  kubeconfig: {kubeconfig}")
        echo(f"  try:  {kubectl} --kubeconfig {kubeconfig} apply -f manifests/examples/")
        echo(f"        {kubectl} --kubeconfig {kubeconfig} get kvp,infd,pods")
        echo("  Ctrl-C stops the cluster")
        try:
            await stop.wait()
            echo("stopping")
        finally:
            kubeconfig.unlink(missing_ok=True)
    return received[0]
