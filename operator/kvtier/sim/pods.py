"""kvsim engines for simulated pods (the embedded cluster's ``EngineFactory``: :func:`kvtier.testing.engines.embedded_engines`).

:class:`KvsimEngines` is called once per container of a
pod with ``(pod, container, address)`` and recognises the container by its command and args:

- ``vllm serve MODEL ...``: vLLM's face on ``--port`` (default 8000); the model name is
  ``--served-model-name`` or ``MODEL``. Its environment configures the simulated load (below).
- ``lmcache server ...``: the MP HTTP API and its ``/metrics`` on ``--http-port`` (default 8080; as
  LMCache 0.5.6, which never opens ``--prometheus-port``) and, with ``--lookup-hash-log-dir``, the lookup-hash log with
  the ``--lookup-hash-log-rotation-interval``, ``--lookup-hash-log-rotation-max-size`` (bytes)
  and ``--lookup-hash-log-max-files`` flags. A simulated block is one LMCache chunk: its
  ``--chunk-size`` tokens, and one ``slot_bytes`` of its ``--l2-adapter`` per TP rank of the pod's
  vLLM (``--tensor-parallel-size``) per chunk, size the engine (so a quota in GB buys the same
  chunks as on the real server, which stores a chunk as one object per rank).
- ``kvtier probe ...``: the real probe (:mod:`kvtier.probe`), parsed by the real command line,
  on the pod's address and its ``--port``.

All containers of one pod (keyed by its uid) share one :class:`~kvtier.sim.server.SimServer`,
which lives until the pod's last container stops. A path a container names (the log directory)
is mapped into a per-pod directory through the container's ``volumeMounts``, so two containers
mounting one emptyDir at different paths see the same files. Any other container gets the
``fallback`` factory (the embedded cluster's: the stub engine), or nothing.

Simulated load: environment variables of the vLLM container, the same names as the
``kvtier sim serve`` options (``KVSIM_`` + option name in upper case; see
:func:`~kvtier.sim.settings.settings_from_env`): ``KVSIM_TRACE`` (a trace file on the machine
running the simulator), ``KVSIM_SPEED``, ``KVSIM_TIME_SHIFT``, ``KVSIM_LOOP``,
``KVSIM_TRACE_SALT``, and sizes such as ``KVSIM_HBM_BLOCKS`` (over the chunk geometry above and
:data:`~kvtier.sim.settings.SERVE_DEFAULTS`). An InferenceDeployment sets them
through ``spec.engine.env``; three deployments replaying the same trace with different
``KVSIM_TIME_SHIFT`` (or different traces) give shifting loads. Every replica replays the whole
trace (replicas multiply the load; choose ``KVSIM_SPEED`` accordingly).

Traces by name: a relative ``KVSIM_TRACE`` (``mooncake/mooncake_synthetic_trace.jsonl``) is
looked up in the factory's ``trace_dir``, so a manifest never names a path of one machine.
:func:`find_trace_dir` gives the usual one: ``$KVTIER_TRACES``, else ``shared/traces`` beside
the repository (``../shared/traces`` from its root), else none. A vLLM container that sets no
``KVSIM_TRACE`` replays the factory's ``default_load`` if it has one (an empty one: no load): ``embedded_engines``
(the embedded cluster's factory) loops :data:`DEFAULT_TRACE` when the trace directory holds it,
so pods of unmodified manifests (``manifests/examples``) carry live load; without traces they
serve idle engines (and say so once in the log).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

import click

from kvtier.probe.options import ProbeOptions
from kvtier.probe.service import start_probe
from kvtier.sim.engine import EngineParams
from kvtier.sim.server import SimServer, open_lookup_log, start_sim
from kvtier.sim.settings import SERVE_DEFAULTS, TraceLoad, settings_from_env

log = logging.getLogger(__name__)

Pod = dict[str, Any]
Container = dict[str, Any]
#: What serves a container no kvsim face recognises: ``(pod, container, address)`` -> a started engine.
Fallback = Callable[[Pod, Container, str], Awaitable[Any]]

#: The trace pods replay when their manifest names none (relative to the trace directory).
DEFAULT_TRACE = "mooncake/mooncake_synthetic_trace.jsonl"
#: Environment variable naming the trace directory.
TRACES_ENV = "KVTIER_TRACES"


def find_trace_dir() -> Path | None:
    """``$KVTIER_TRACES``, else ``shared/traces`` beside the repository (a source checkout), else None."""
    configured = os.environ.get(TRACES_ENV)
    if configured:
        return Path(configured)
    beside = Path(__file__).resolve().parents[3].parent / "shared" / "traces"
    return beside if beside.is_dir() else None


def command_line(container: Container) -> list[str]:
    """A container's command and args as words (a ``sh -c`` script is split too)."""
    words: list[str] = []
    for word in [*(container.get("command") or []), *(container.get("args") or [])]:
        words.extend(shlex.split(word) if any(space in word for space in " \t\n") else [word])
    return words


def container_kind(container: Container) -> tuple[str, list[str]] | None:
    """``("vllm" | "lmcache" | "probe", the words after the subcommand)``, or None for anything else."""
    words = command_line(container)
    for index, word in enumerate(words[:-1]):
        program, subcommand = PurePosixPath(word).name, words[index + 1]
        for kind, expected in (
            ("vllm", ("vllm", "serve")),
            ("lmcache", ("lmcache", "server")),
            ("probe", ("kvtier", "probe")),
        ):
            if (program, subcommand) == expected:
                return kind, words[index + 2 :]
    return None


def flag(words: Sequence[str], name: str) -> str | None:
    """The value of ``--name value`` or ``--name=value`` (the last one wins), or None."""
    value = None
    for index, word in enumerate(words):
        if word == name and index + 1 < len(words):
            value = words[index + 1]
        elif word.startswith(name + "="):
            value = word[len(name) + 1 :]
    return value


def _find(pod: Pod, kind: str) -> tuple[Container, list[str]] | None:
    for container in pod.get("spec", {}).get("containers", []):
        recognised = container_kind(container)
        if recognised is not None and recognised[0] == kind:
            return container, recognised[1]
    return None


@dataclass
class _PodSim:
    server: SimServer
    directory: Path
    users: int = 0
    closers: list[Callable[[], None]] = field(default_factory=list)


class _Handle:
    """One container's share of a pod's simulation."""

    def __init__(self, engines: KvsimEngines, uid: str, parts: list[Any]) -> None:
        self._engines, self._uid = engines, uid
        #: What the container runs: a :class:`~kvtier.sim.server.RunningSim` or a ``RunningProbe`` (or nothing).
        self.parts = parts

    async def stop(self) -> None:
        parts, self.parts = self.parts, []
        for part in parts:
            await part.stop()
        if self._uid:
            self._engines._release(self._uid)
            self._uid = ""


class KvsimEngines:
    """The factory; ``root`` holds the pods' directories (a temporary directory by default)."""

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        fallback: Fallback | None = None,
        *,
        trace_dir: str | os.PathLike[str] | None = None,
        default_load: TraceLoad | None = None,
        in_pod: bool = False,
    ) -> None:
        self._root = Path(root) if root is not None else None
        self._fallback = fallback
        #: Where relative ``KVSIM_TRACE`` names (and a relative ``default_load``) are found.
        self.trace_dir = Path(trace_dir) if trace_dir is not None else None
        #: Load of vLLM containers that set no ``KVSIM_TRACE``.
        self.default_load = default_load
        self._pods: dict[str, _PodSim] = {}
        #: Running inside the pod itself (``kvtier sim pod``): paths are used as the containers name them.
        self._in_pod = in_pod

    def server(self, uid: str) -> SimServer | None:
        """The simulated engine of a running pod."""
        pod = self._pods.get(uid)
        return pod.server if pod is not None else None

    async def __call__(self, pod: Pod, container: Container, address: str) -> Any:
        recognised = container_kind(container)
        if recognised is None:
            if self._fallback is not None:
                return await self._fallback(pod, container, address)
            return _Handle(self, "", [])
        kind, words = recognised
        uid = pod["metadata"]["uid"]
        name = f"{pod['metadata'].get('name')}/{container.get('name')}"
        try:
            sim = self._acquire(pod)
        except ValueError as error:  # a KVSIM_* variable of the wrong type
            log.warning("%s: cannot simulate the pod: %s", name, error)
            return _Handle(self, "", [])
        try:
            parts = await self._start(kind, words, container, address, sim)
        except (click.ClickException, ValueError) as error:  # arguments a real container would fail on
            log.warning("%s: cannot start: %s", name, error)
            parts = []
        except BaseException:
            self._release(uid)
            raise
        return _Handle(self, uid, parts)

    async def _start(self, kind: str, words: list[str], container: Container, address: str, sim: _PodSim) -> list[Any]:
        if kind == "vllm":
            env = _env(container)
            _, _, load = settings_from_env(env)
            load = self._resolve(load if "KVSIM_TRACE" in env else self.default_load)
            return [await start_sim(sim.server, address, port=int(flag(words, "--port") or 8000), load=load)]
        if kind == "lmcache":
            log_dir = flag(words, "--lookup-hash-log-dir")
            if log_dir is not None:
                rotation = {
                    key: cast(value)
                    for key, option, cast in (
                        ("interval_seconds", "--lookup-hash-log-rotation-interval", float),
                        ("max_bytes", "--lookup-hash-log-rotation-max-size", int),
                        ("max_files", "--lookup-hash-log-max-files", int),
                    )
                    if (value := flag(words, option)) is not None
                }
                lookup_log = open_lookup_log(self._path(sim, container, log_dir), sim.server.params, **rotation)
                sim.server.lookup_log = lookup_log
                sim.closers.append(lookup_log.close)
            return [await start_sim(sim.server, address, lmcache_http_port=int(flag(words, "--http-port") or 8080))]
        options = ProbeOptions.from_argv(words)
        options = replace(options, log_dir=str(self._path(sim, container, options.log_dir)))
        return [await start_probe(options.build(), address, options.port)]

    def _resolve(self, load: TraceLoad | None) -> TraceLoad | None:
        """The load with a relative trace path found in :attr:`trace_dir`."""
        if load is None or self.trace_dir is None or Path(load.path).is_absolute():
            return load
        return replace(load, path=str(self.trace_dir / load.path))

    def _path(self, sim: _PodSim, container: Container, path: str) -> Path:
        return Path(path) if self._in_pod else _host_path(sim.directory, container, path)

    def _acquire(self, pod: Pod) -> _PodSim:
        uid = pod["metadata"]["uid"]
        sim = self._pods.get(uid)
        if sim is None:
            engine = _find(pod, "vllm")
            params, speed, _ = settings_from_env(_env(engine[0]) if engine else {}, _chunk_geometry(pod))
            model = (flag(engine[1], "--served-model-name") or _positional(engine[1]) or "kvsim") if engine else "kvsim"
            if self._root is None:
                self._root = Path(tempfile.mkdtemp(prefix="kvsim-"))
            directory = self._root / uid
            directory.mkdir(parents=True, exist_ok=True)
            sim = self._pods[uid] = _PodSim(SimServer(params, model=model, speed=speed), directory)
        sim.users += 1
        return sim

    def _release(self, uid: str) -> None:
        sim = self._pods.get(uid)
        if sim is None:
            return
        sim.users -= 1
        if sim.users <= 0:
            del self._pods[uid]
            for close in sim.closers:
                close()
            shutil.rmtree(sim.directory, ignore_errors=True)


def _chunk_geometry(pod: Pod) -> EngineParams:
    """Serve defaults with the block size of the pod's LMCache server: ``--chunk-size`` and L2 ``slot_bytes``."""
    lmcache = _find(pod, "lmcache")
    if lmcache is None:
        return SERVE_DEFAULTS
    words = lmcache[1]
    chunk = flag(words, "--chunk-size")
    tokens = int(chunk) if chunk and chunk.isdigit() and int(chunk) > 0 else SERVE_DEFAULTS.block_tokens
    slot_bytes = 0
    for index, word in enumerate(words[:-1]):
        if word == "--l2-adapter":
            try:
                slot_bytes = int(json.loads(words[index + 1]).get("slot_bytes") or 0)
            except (ValueError, TypeError, AttributeError):
                continue
            if slot_bytes:
                break
    vllm = _find(pod, "vllm")
    ranks = flag(vllm[1], "--tensor-parallel-size") if vllm is not None else None
    chunk_bytes = slot_bytes * (int(ranks) if ranks and ranks.isdigit() and int(ranks) > 0 else 1)
    per_token = chunk_bytes // tokens if chunk_bytes >= tokens else SERVE_DEFAULTS.kv_bytes_per_token
    return replace(SERVE_DEFAULTS, block_tokens=tokens, kv_bytes_per_token=per_token)


def _env(container: Container) -> dict[str, str]:
    """A container's literal variables; one without `value` is set to "" (a real API server drops `value: ""`)."""
    return {item["name"]: str(item.get("value", "")) for item in container.get("env") or [] if "valueFrom" not in item}


def _positional(words: Sequence[str]) -> str | None:
    return words[0] if words and not words[0].startswith("-") else None


def _host_path(directory: Path, container: Container, path: str) -> Path:
    """Where a path inside a container lives for the simulator: in the volume mounted over it, if any."""
    target = PurePosixPath(path)
    best: tuple[int, str, PurePosixPath] | None = None
    for mount in container.get("volumeMounts") or []:
        mount_path = PurePosixPath(mount.get("mountPath", "/"))
        if target == mount_path or mount_path in target.parents:
            depth = len(mount_path.parts)
            if best is None or depth > best[0]:
                best = (depth, mount["name"], target.relative_to(mount_path))
    if best is not None:
        _, volume, relative = best
        return directory / "volumes" / volume / relative
    return directory / "containers" / container.get("name", "container") / target.relative_to(target.anchor)
