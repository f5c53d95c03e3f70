"""`kvtier demo`: the embedded cluster, the operator, the demo's pool and deployments, watched live.

Steps: write the phased trace (:mod:`kvtier.demo.workload`) to a scratch directory; start the
embedded cluster with kvsim engines and the operator; apply the packaged manifests; wait until
every replica is Ready (or fail after ``ready_timeout``); then for ``duration`` seconds read the
pool, the deployments and their Events once a ``refresh`` and show them; finally stop everything
and write ``summary.md``, ``demo.png`` and ``samples.json`` into the output directory. Ctrl-C (or
SIGTERM) ends the run early, still cleanly, with what was gathered so far.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import click
from rich.console import Console
from rich.live import Live

from kvtier.controllers import OperatorConfig
from kvtier.demo.manifests import DEPLOYMENTS, NAMESPACE, POOL, DemoManifests
from kvtier.demo.observe import Snapshot, epoch_seconds, observe
from kvtier.demo.report import History, summary_markdown, write_plot, write_samples
from kvtier.demo.view import Clock, plain_line, render, replicas
from kvtier.demo.workload import PHASES, Workload
from kvtier.kube import INFERENCEDEPLOYMENTS, KVPOOLS, NAMESPACES, PODS, KubeClient, Resource

FIELD_MANAGER = "kvtier-demo"
RESOURCES: dict[str, Resource] = {
    "Namespace": NAMESPACES,
    "KVPool": KVPOOLS,
    "InferenceDeployment": INFERENCEDEPLOYMENTS,
}
#: Exit codes: done; the cluster never became ready; interrupted (128 + the signal, as shells report it:
#: 130 for Ctrl-C, 143 for SIGTERM).
OK, NOT_READY = 0, 1
INTERRUPTED = 128 + signal.SIGINT


@dataclass(frozen=True)
class DemoOptions:
    duration: float = 120.0
    """Wall-clock seconds watched once every replica is Ready."""
    out: Path = Path(".kvtier/demo")
    speed: float = 10.0
    """Simulated seconds per wall-clock second (the engines' clocks and their traces)."""
    live: bool = True
    """A live screen when stdout is a terminal; False (or no terminal): a plain line every `plain_every`."""
    ready_timeout: float = 120.0
    refresh: float = 1.0
    plain_every: float = 5.0
    nodes: int = 2
    resync_seconds: float = 2.0
    telemetry_window: float = 20.0
    """Seconds behind the hit ratios the view shows (a phase of the load is about 20s of wall time)."""
    workload: Workload = field(default_factory=Workload)


class NotReady(Exception):
    """The deployments' replicas did not all become Ready in time."""


@contextlib.contextmanager
def _log_to(path: Path) -> Iterator[None]:
    """Send the operator's and the simulator's logs to a file, not into the live screen."""
    handler = logging.FileHandler(path, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        handler.close()


def busy_deployment(load_seconds: float, options: DemoOptions) -> str:
    """The deployment the load schedule makes busy after `load_seconds` of wall-clock replay."""
    phase = int(load_seconds * options.speed // options.workload.phase_seconds) % PHASES
    return DEPLOYMENTS[phase % len(DEPLOYMENTS)]


class Screen:
    """Where progress goes: a rich Live screen, or plain lines (at most one per `plain_every`)."""

    def __init__(self, options: DemoOptions, console: Console, echo: Callable[[str], None]):
        self.options, self.console, self.echo = options, console, echo
        self.live: Live | None = None
        if options.live and console.is_terminal:
            self.live = Live(
                console=console, refresh_per_second=4, transient=False, redirect_stdout=False, redirect_stderr=False
            )
        self._printed_at: float | None = None
        self._stage: str | None = None
        self._seen_events: set[tuple[str, str, str, str]] = set()

    def __enter__(self) -> Screen:
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)

    def show(self, snapshot: Snapshot, clock: Clock) -> None:
        if self.live is not None:
            self.live.update(render(snapshot, clock), refresh=True)
            return
        for event in snapshot.events:
            key = (event.time, event.name, event.reason, event.message)
            if event.is_rebalance and key not in self._seen_events:
                self._seen_events.add(key)
                self.echo(f"  [{clock.at(event.time):>6}] {event.reason}: {event.message}")
        now = time.monotonic()
        if clock.stage != self._stage or self._printed_at is None or now - self._printed_at >= self.options.plain_every:
            self.echo(plain_line(snapshot, clock))
            self._printed_at, self._stage = now, clock.stage

    def say(self, line: str) -> None:
        if self.live is not None:
            self.live.console.print(line, highlight=False)
        else:
            self.echo(line)


async def _apply(kube: KubeClient, manifests: DemoManifests) -> None:
    for body in manifests.objects():
        await kube.apply(RESOURCES[body["kind"]], body, field_manager=FIELD_MANAGER)


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):  # not wait_for: on 3.11 it can swallow a cancellation
            await stop.wait()


def _install_signals(stop: asyncio.Event, received: list[int]) -> Callable[[], None]:
    """SIGINT and SIGTERM set `stop` and are noted in `received`."""
    loop = asyncio.get_running_loop()
    installed = []

    def stop_on(signum: int) -> None:
        received.append(signum)
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, stop_on, signum)
            installed.append(signum)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
            pass

    def remove() -> None:
        for signum in installed:
            loop.remove_signal_handler(signum)

    return remove


async def _replay_started(kube: KubeClient) -> float | None:
    """When the first vLLM container of the demo started (its engine's trace replay with it), from the pods."""
    pods = await kube.list(PODS, NAMESPACE)
    starts = [
        epoch_seconds(started)
        for pod in pods.get("items", [])
        for container in (pod.get("status") or {}).get("containerStatuses") or []
        if container.get("name") == "vllm"
        and isinstance(started := ((container.get("state") or {}).get("running") or {}).get("startedAt"), str)
    ]
    known = [start for start in starts if start is not None]
    return min(known) if known else None


async def _watch(
    kube: KubeClient, options: DemoOptions, screen: Screen, history: History, stop: asyncio.Event, hint: str
) -> bool:
    """Wait for Ready, then watch for `duration`; True if it ran to the end, False if interrupted."""
    started = time.monotonic()
    running_since: float | None = None
    load_since: float | None = None
    snapshot: Snapshot | None = None
    while not stop.is_set():
        snapshot = await observe(kube, NAMESPACE, POOL)
        now = time.monotonic()
        if load_since is None and any(d.ready for d in snapshot.deployments):
            load_since = now  # the first engine is up: its trace replay has begun
        if running_since is None:
            if snapshot.all_ready and len(snapshot.deployments) == len(DEPLOYMENTS):
                running_since = now
                replay_started = await _replay_started(kube)
                if replay_started is not None:  # the engines replay from their start, before Ready is seen
                    load_since = now - max(0.0, time.time() - replay_started)
                screen.say(
                    f"all {len(DEPLOYMENTS)} deployments Ready after {now - started:.1f}s; "
                    f"watching for {options.duration:g}s"
                )
            elif now - started > options.ready_timeout:
                states = (
                    ", ".join(
                        f"{d.name} {replicas(d)} ({d.ready_reason or 'no Ready condition'})"
                        for d in snapshot.deployments
                    )
                    or "no deployments"
                )
                raise NotReady(f"the demo's replicas were not all Ready within {options.ready_timeout:g}s: {states}")
        if running_since is None:
            clock = Clock(
                "starting",
                now - started,
                options.duration,
                options.speed,
                hint=hint,
                origin=time.time() - (now - started),
            )
        else:
            elapsed = now - running_since
            busy = busy_deployment(now - (load_since or running_since), options)
            history.add(round(elapsed, 2), snapshot, busy, at=time.time())
            clock = Clock(
                "running", elapsed, options.duration, options.speed, busy=busy, hint=hint, origin=time.time() - elapsed
            )
            if elapsed >= options.duration:
                screen.show(snapshot, clock)
                return True
        screen.show(snapshot, clock)
        await _wait(stop, options.refresh)
    return False


async def _run(options: DemoOptions, screen: Screen, history: History, scratch: Path, received: list[int]) -> bool:
    from kvtier.sim.pods import KvsimEngines
    from kvtier.testing.cluster import EmbeddedCluster, default_nodes
    from kvtier.testing.engines import stub_engine

    trace = scratch / "load.jsonl"
    options.workload.write(trace)
    manifests = DemoManifests(
        trace=str(trace), pool_path=str(scratch / "pool"), speed=options.speed, workload=options.workload
    )
    kubeconfig = options.out / "kubeconfig"
    stop = asyncio.Event()
    remove_signals = _install_signals(stop, received)
    try:
        screen.say("starting the embedded cluster (API server, pod simulator with kvsim engines, kvtier operator)")
        cluster = EmbeddedCluster(
            default_nodes(options.nodes),
            kubeconfig=kubeconfig,
            engine_factory=KvsimEngines(scratch / "pods", fallback=stub_engine),
            operator=OperatorConfig(
                resync_seconds=options.resync_seconds,
                scrape_interval_seconds=1.0,
                status_interval_seconds=2.0,
                telemetry_window_seconds=options.telemetry_window,
            ),
        )
        async with cluster:
            assert cluster.kube is not None
            screen.say(
                f"applying the demo: KVPool {POOL} and InferenceDeployments "
                f"{', '.join(DEPLOYMENTS)} in namespace {NAMESPACE}"
            )
            await _apply(cluster.kube, manifests)
            hint = f"kubectl --kubeconfig {kubeconfig} get kvp,infd -A   ·   Ctrl-C stops"
            with screen:
                finished = await _watch(cluster.kube, options, screen, history, stop, hint)
            screen.say("stopping the cluster")
        return finished
    finally:
        remove_signals()
        kubeconfig.unlink(missing_ok=True)


def run_demo(options: DemoOptions, *, console: Console | None = None, echo: Callable[[str], None] = click.echo) -> int:
    """Run the demo; returns the exit code (0 done, 1 not ready, 130 after Ctrl-C, 143 after SIGTERM)."""
    options.out.mkdir(parents=True, exist_ok=True)
    screen = Screen(options, console or Console(), echo)
    history = History(speed=options.speed)
    scratch = Path(tempfile.mkdtemp(prefix="kvtier-demo-"))
    received: list[int] = []
    log_path = options.out / "operator.log"
    try:
        with _log_to(log_path):
            finished = asyncio.run(_run(options, screen, history, scratch, received))
    except NotReady as error:
        screen.say(f"error: {error} (logs: {log_path})")
        return NOT_READY
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if not history.samples:
        screen.say("interrupted before the deployments were Ready; nothing to summarise")
        return 128 + received[0] if received else INTERRUPTED
    summary, plot, samples = options.out / "summary.md", options.out / "demo.png", options.out / "samples.json"
    write_plot(history, plot)
    summary.write_text(
        summary_markdown(history, plot=plot.name, interrupted=not finished, window=options.telemetry_window)
    )
    write_samples(history, samples)
    moved = len(history.quota_changes())
    screen.say(
        f"{'interrupted' if not finished else 'done'}: {moved} quota change{'s' if moved != 1 else ''}, "
        f"{len(history.rebalances)} rebalance round{'s' if len(history.rebalances) != 1 else ''} recorded"
    )
    for path in (summary, plot, samples, log_path):
        screen.say(f"wrote {path}")
    if finished:
        return OK
    return 128 + received[0] if received else INTERRUPTED
