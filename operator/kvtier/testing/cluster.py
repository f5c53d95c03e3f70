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
from kvtier.testing.apiserver import APIServer
from kvtier.sim.pods import embedded_engines
from kvtier.testing.engines import EngineFactory
from kvtier.testing.podsim import NodeSpec, PodSimulator

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
        with contextlib.suppress(asyncio.CancelledError):
            self._loop.run_until_complete(self._task)
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


class EmbeddedCluster:
    """API emulator + CRDs + pod simulator on the running event loop (pods run kvsim engines by default)."""

    def __init__(
        self,
        nodes: list[NodeSpec] | None = None,
        *,
        kubeconfig: str | Path | None = None,
        port: int = 0,
        engine_factory: EngineFactory | None = None,
        install_crds: bool = True,
        validate_builtins: bool = True,
        operator: OperatorConfig | None = None,
    ):
        self.nodes = default_nodes() if nodes is None else nodes
        self.server = APIServer(port=port, validate_builtins=validate_builtins)
        self._tempdir: tempfile.TemporaryDirectory[str] | None = None
        if kubeconfig is None:
            self._tempdir = tempfile.TemporaryDirectory(prefix="kvtier-cluster-")
            kubeconfig = Path(self._tempdir.name) / "kubeconfig"
        self.kubeconfig = Path(kubeconfig)
        #: What serves the pods' containers; by default kvsim engines with live trace load
        #: (:func:`kvtier.sim.pods.embedded_engines`); pass :func:`~kvtier.testing.engines.stub_engine`
        #: for endpoints that only answer health and quota calls.
        self.engine_factory = engine_factory if engine_factory is not None else embedded_engines()
        self.install_crds = install_crds
        self.kube: KubeClient | None = None
        self.simulator: PodSimulator | None = None
        self._simulator_task: asyncio.Task[None] | None = None
        #: The kvtier operator's settings (its kubeconfig is this cluster's); None: no operator.
        self.operator = replace(operator, kubeconfig=self.kubeconfig) if operator else None
        self._operator_thread: OperatorThread | None = None

    async def start(self) -> EmbeddedCluster:
        await self.server.start()
        self.server.write_kubeconfig(self.kubeconfig)
        connection = Connection.from_kubeconfig(str(self.kubeconfig))
        self.kube = await KubeClient(connection, user_agent="kvtier-podsim").open()
        if self.install_crds:
            for crd in build_crds().values():
                await self.kube.create(CUSTOMRESOURCEDEFINITIONS, crd)
        self.simulator = PodSimulator(self.kube, self.nodes, engine_factory=self.engine_factory)
        await self.simulator.register_nodes()
        self._simulator_task = asyncio.create_task(self.simulator.run(), name="kvtier-podsim")
        if self.operator is not None:
            await self.kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                                "metadata": {"name": self.operator.namespace}})
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
        await self.stop_operator()
        if self._simulator_task is not None:
            self._simulator_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._simulator_task
            self._simulator_task = None
        if self.kube is not None:
            await self.kube.close()
            self.kube = None
        await self.server.stop()
        if self._tempdir is not None:
            self._tempdir.cleanup()
            self._tempdir = None

    async def __aenter__(self) -> EmbeddedCluster:
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()


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
    """An :class:`EmbeddedCluster` on its own event-loop thread (sync tests, the CLI)."""

    embedded = True

    def __init__(self, **kwargs: Any):
        super().__init__("kvtier-cluster")
        self.cluster = EmbeddedCluster(**kwargs)

    @property
    def kubeconfig(self) -> Path:
        return self.cluster.kubeconfig

    @property
    def server(self) -> APIServer:
        return self.cluster.server

    @property
    def kube(self) -> KubeClient:
        assert self.cluster.kube is not None
        return self.cluster.kube

    def start(self) -> BackgroundCluster:
        try:
            self.run(self.cluster.start())
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
            self.run(self.cluster.stop(), timeout=30)
        self._close_loop()

    def __enter__(self) -> BackgroundCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class ExternalCluster(_LoopThread):
    """A real cluster (kind, a test cluster) behind a kubeconfig, with the same face as :class:`BackgroundCluster`."""

    embedded = False
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
    nodes: list[NodeSpec], *, kubeconfig: Path, port: int = 0, echo: Callable[[str], None] = print,
    operator: OperatorConfig | None = None, kubectl: str = "kubectl",
) -> int:
    """`kvtier dev up`: run an embedded cluster (and the operator) until SIGINT or SIGTERM, saying how to use it;
    returns the signal's number. The kubeconfig is removed on the way out (the server it names is gone)."""
    stop = asyncio.Event()
    received: list[int] = []

    def stop_on(signum: int) -> None:
        received.append(signum)
        stop.set()

    async with EmbeddedCluster(nodes, kubeconfig=kubeconfig, port=port, operator=operator) as cluster:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):  # after the operator's own handlers: ours stop everything
            loop.add_signal_handler(signum, stop_on, signum)
        gpus = sum(node.gpus for node in nodes)
        echo(f"kvtier embedded cluster: API server {cluster.server.url}, {counted(len(nodes), 'simulated node')} "
             f"({gpus} GPUs)")
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
