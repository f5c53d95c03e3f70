"""The `kvtier` command line."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import click

from kvtier import __version__
from kvtier.probe.options import ProbeOptions
from kvtier.probe.options import command_options as probe_command_options
from kvtier.rebalance.costmodel import PRESETS as COST_MODEL_PRESETS


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kvtier")
def main() -> None:
    """kvtier: tier LLM KV cache into CPU memory and NVMe-oF arrays, and rebalance it."""


@main.command()
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), help="Write one file per CRD here.")
@click.option("--check", is_flag=True, help="Exit 1 if the files in --out (default crds/) differ from the models.")
def crds(out_dir: Path | None, check: bool) -> None:
    """Generate the CustomResourceDefinitions from the API models (stdout unless --out)."""
    from kvtier.api.crd import build_crds, to_yaml

    rendered = {name: to_yaml(crd) for name, crd in build_crds().items()}
    if check:
        directory = out_dir or Path("crds")
        stale = [name for name, text in rendered.items() if _read(directory / name) != text]
        for name in stale:
            click.echo(f"{directory / name}: stale or missing; run `kvtier crds --out {directory}`", err=True)
        if stale:
            sys.exit(1)
        click.echo(f"{directory}: {len(rendered)} CRDs are current")
        return
    if out_dir is None:
        click.echo("---\n".join(rendered.values()), nl=False)
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.items():
        (out_dir / name).write_text(text)
        click.echo(f"wrote {out_dir / name}")


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


@main.command()
@click.option(
    "-f",
    "--filename",
    "filenames",
    multiple=True,
    required=True,
    help="Manifest file or directory (repeatable; - reads standard input).",
)
def validate(filenames: tuple[str, ...]) -> None:
    """Check kvtier manifests offline, as the API server would; one line per problem."""
    from kvtier.api.documents import read_documents

    checked = failed = 0
    for document in read_documents(list(filenames)):
        if not document.ours and not document.problems:
            continue
        checked += 1
        for line in document.lines():
            click.echo(line)
        failed += bool(document.problems)
    if failed:
        sys.exit(1)
    click.echo(f"{checked} kvtier object{'s' if checked != 1 else ''} valid")


@main.command()
@click.option(
    "-f",
    "--filename",
    "filenames",
    multiple=True,
    required=True,
    help="Manifest file or directory with InferenceDeployments and their KVPools (repeatable; - reads stdin).",
)
@click.option("--pod-monitor", is_flag=True, help="Also render a PodMonitor (Prometheus Operator) per deployment.")
def render(filenames: tuple[str, ...], pod_monitor: bool) -> None:
    """Print, as YAML, the children the operator would apply for every InferenceDeployment in the files."""
    from kvtier.api.documents import read_documents
    from kvtier.render import RenderOptions
    from kvtier.render.offline import render_documents

    result = render_documents(read_documents(list(filenames)), RenderOptions(pod_monitor=pod_monitor))
    for line in result.messages:
        click.echo(line, err=True)
    click.echo(result.yaml(), nl=False)
    if result.failed:
        sys.exit(1)


@main.group()
def dev() -> None:
    """Run kvtier's world on this machine: the embedded cluster instead of Kubernetes."""


@dev.command("up")
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path(".kvtier/kubeconfig"),
    show_default=True,
    help="Where to write the kubeconfig for kubectl and friends.",
)
@click.option("--port", type=int, default=0, show_default=True, help="API server port (0: any free port).")
@click.option("--nodes", type=click.IntRange(0), default=4, show_default=True, help="Simulated nodes.")
@click.option("--gpus-per-node", type=click.IntRange(0), default=8, show_default=True)
@click.option("--memory", default="2Ti", show_default=True, help="Allocatable memory per node.")
@click.option("--cpu", default="128", show_default=True, help="Allocatable CPU per node.")
@click.option("--operator/--no-operator", default=True, show_default=True, help="Run the kvtier operator too.")
@click.option("--resync-seconds", type=click.FloatRange(min=0.5), default=2.0, show_default=True)
@click.option(
    "--control-plane",
    type=click.Choice(["embedded", "real"]),
    default="embedded",
    show_default=True,
    help="embedded: the in-process API emulator (Python only). real: etcd, kube-apiserver, "
    "kube-controller-manager and kube-scheduler built by hack/control-plane.sh (needs Go once); "
    "the pod simulator acts as the kubelets.",
)
def dev_up(
    kubeconfig: Path,
    port: int,
    nodes: int,
    gpus_per_node: int,
    memory: str,
    cpu: str,
    operator: bool,
    resync_seconds: float,
    control_plane: str,
) -> None:
    """Start a local cluster (API server, kvtier CRDs, simulated nodes and pods, operator) until Ctrl-C."""
    import asyncio

    from kvtier.controllers import OperatorConfig
    from kvtier.testing.cluster import EmbeddedCluster, default_nodes, serve_until_signalled

    declared = default_nodes(nodes, gpus=gpus_per_node, memory=memory, cpu=cpu)
    config = (
        OperatorConfig(resync_seconds=resync_seconds, scrape_interval_seconds=2.0, status_interval_seconds=2.0)
        if operator
        else None
    )
    if control_plane == "real":
        from kvtier.testing.controlplane import ControlPlaneUnavailable
        from kvtier.testing.realcluster import ControlPlaneCluster

        if port:
            raise click.BadParameter("the real control plane picks free ports", param_hint="--port")
        try:
            cluster = ControlPlaneCluster(declared, kubeconfig=kubeconfig, operator=config)
        except ControlPlaneUnavailable as error:
            raise click.ClickException(str(error)) from error
        kind = "real control plane"
    else:
        cluster = EmbeddedCluster(declared, kubeconfig=kubeconfig, port=port, operator=config)
        kind = "embedded cluster"
    signum = asyncio.run(serve_until_signalled(cluster, echo=click.echo, kind=kind, kubectl=_kubectl_command()))
    sys.exit(128 + signum)  # as a shell reports a process the signal ended: 130 for Ctrl-C, 143 for SIGTERM


def _kubectl_command() -> str:
    """How to type kubectl here: `kubectl` when it is on PATH, else the one setup installed beside kvtier."""
    import shutil

    beside = Path(sys.executable).parent / "kubectl"
    if shutil.which("kubectl") or not beside.exists():
        return "kubectl"
    with contextlib.suppress(ValueError):
        return str(beside.relative_to(Path.cwd()))
    return str(beside)


@main.command()
@click.option(
    "--duration",
    type=click.FloatRange(min=1),
    default=120.0,
    show_default=True,
    help="Wall-clock seconds to watch once every replica is Ready.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".kvtier/demo"),
    show_default=True,
    help="Where summary.md, demo.png, samples.json and operator.log go.",
)
@click.option(
    "--speed",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    help="Simulated seconds per wall-clock second (the busy deployment changes every 200 simulated s).",
)
@click.option(
    "--live/--no-live",
    default=True,
    show_default=True,
    help="Live terminal view (only on a terminal); --no-live prints a progress line every few seconds.",
)
@click.option(
    "--ready-timeout",
    type=click.FloatRange(min=1),
    default=120.0,
    show_default=True,
    help="Give up (exit 1) if the replicas are not all Ready within this many seconds.",
)
def demo(duration: float, out_dir: Path, speed: float, live: bool, ready_timeout: float) -> None:
    """Run the embedded cluster with a pool and three shifting loads, show it live, then summarise and plot it."""
    from kvtier.demo import DemoOptions, run_demo

    code = run_demo(DemoOptions(duration=duration, out=out_dir, speed=speed, live=live, ready_timeout=ready_timeout))
    if code:
        sys.exit(code)


def _run_until_signalled(start: Callable[[], Awaitable[Any]]) -> None:
    """Await `start()` (something with `async stop()`) and keep it running until SIGINT or SIGTERM."""
    import asyncio
    import signal

    async def run() -> None:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stopping.set)
        running = await start()
        try:
            await stopping.wait()
        finally:
            await running.stop()

    asyncio.run(run())


@main.group()
def sim() -> None:
    """kvsim: a simulated vLLM + LMCache engine."""


def _engine_options(command: Callable[..., None]) -> Callable[..., None]:
    """One option per engine-model parameter (`kvtier.sim.engine.EngineParams`)."""
    from dataclasses import fields

    from kvtier.sim.settings import SERVE_DEFAULTS

    for spec in reversed(fields(SERVE_DEFAULTS)):
        default = getattr(SERVE_DEFAULTS, spec.name)
        option = click.option(
            f"--{spec.name.replace('_', '-')}",
            type=type(default),
            default=default,
            help=f"Engine model: {spec.name.replace('_', ' ')}.",
        )
        command = option(command)
    return command


@sim.command("serve", context_settings={"auto_envvar_prefix": "KVSIM", "show_default": True})
@click.option("--host", default="0.0.0.0", help="Address of every face.")
@click.option("--port", type=int, default=8000, help="vLLM face: /health, /v1/models, /v1/completions, /metrics.")
@click.option("--model", default="kvsim", help="Served model name.")
@click.option(
    "--lmcache-http-port",
    type=int,
    help="LMCache MP HTTP port: /healthcheck, /quota and /metrics, as 0.5.6 serves them (off if not given).",
)
@click.option("--lookup-hash-log-dir", type=click.Path(file_okay=False), help="Write LMCache's lookup-hash log here.")
@click.option(
    "--lookup-hash-log-rotation-interval",
    type=click.FloatRange(0, min_open=True),
    default=21600.0,
    help="Seconds before a new log file starts.",
)
@click.option(
    "--lookup-hash-log-rotation-max-size",
    type=click.IntRange(0),
    default=100 << 20,
    help="Bytes before a new log file starts (0: no limit).",
)
@click.option("--lookup-hash-log-max-files", type=click.IntRange(0), default=10, help="Log files kept (0: all).")
@click.option("--trace", type=click.Path(exists=True, dir_okay=False), help="Replay this Mooncake-format trace.")
@click.option(
    "--speed",
    type=click.FloatRange(0, min_open=True),
    default=1.0,
    help="Simulated seconds per wall-clock second (engine latencies are simulated seconds).",
)
@click.option(
    "--time-shift",
    type=float,
    default=0.0,
    help="Seconds added to the trace's arrivals (requests before 0 are skipped).",
)
@click.option("--loop/--no-loop", default=False, help="Start the trace over after its end.")
@click.option("--trace-salt", default="", help="cache_salt of the trace's requests (default: none, `_default`).")
@click.option("--quota", "quotas", multiple=True, metavar="SALT=GB", help="Initial L2 quota (repeatable).")
@_engine_options
def sim_serve(
    host: str,
    port: int,
    model: str,
    lmcache_http_port: int | None,
    lookup_hash_log_dir: str | None,
    lookup_hash_log_rotation_interval: float,
    lookup_hash_log_rotation_max_size: int,
    lookup_hash_log_max_files: int,
    trace: str | None,
    speed: float,
    time_shift: float,
    loop: bool,
    trace_salt: str,
    quotas: tuple[str, ...],
    **engine: Any,
) -> None:
    """Serve one simulated replica: vLLM's HTTP face and LMCache MP's, optionally replaying a trace.

    Every option can also be set as KVSIM_<OPTION> (e.g. KVSIM_HBM_BLOCKS), as in a simulated pod.
    """
    from kvtier.sim.engine import EngineParams
    from kvtier.sim.server import DEFAULT_SALT, SimServer, open_lookup_log, start_sim
    from kvtier.sim.settings import TraceLoad

    params = EngineParams(**engine)
    lookup_log = None
    if lookup_hash_log_dir:
        lookup_log = open_lookup_log(
            lookup_hash_log_dir,
            params,
            interval_seconds=lookup_hash_log_rotation_interval,
            max_bytes=lookup_hash_log_rotation_max_size,
            max_files=lookup_hash_log_max_files,
        )
    server = SimServer(params, model=model, speed=speed, lookup_log=lookup_log)
    for quota in quotas:
        salt, _, limit = quota.partition("=")
        try:
            server.set_quota("" if salt == DEFAULT_SALT else salt, float(limit))
        except ValueError:
            raise click.BadParameter(f"{quota!r} is not SALT=GB with GB >= 0", param_hint="--quota") from None
    load = TraceLoad(trace, time_shift, loop, trace_salt) if trace else None
    _run_until_signalled(lambda: start_sim(server, host, port=port, lmcache_http_port=lmcache_http_port, load=load))


@sim.command("pod")
@click.option(
    "--vllm",
    "vllm_command",
    required=True,
    metavar="'vllm serve ...'",
    help="The pod's vLLM command line, as rendered (one shell-quoted string).",
)
@click.option(
    "--lmcache",
    "lmcache_command",
    metavar="'lmcache server ...'",
    help="The pod's LMCache MP server command line, as rendered (its ports, chunk size, lookup-hash log).",
)
@click.option("--host", default="0.0.0.0", show_default=True, help="Address of every face.")
def sim_pod(vllm_command: str, lmcache_command: str | None, host: str) -> None:
    """Run a rendered pod's engines as one kvsim engine (what `kvtier run --simulated-engine-image` renders).

    The simulated load comes from KVSIM_* variables, as in the embedded cluster's pods.
    """
    import os
    import shlex

    from kvtier.sim.pods import KvsimEngines, container_kind

    containers = [
        {
            "name": "vllm",
            "command": shlex.split(vllm_command),
            "env": [{"name": k, "value": v} for k, v in os.environ.items() if k.startswith("KVSIM_")],
        }
    ]
    if lmcache_command:
        containers.append({"name": "lmcache", "command": shlex.split(lmcache_command)})
    expected = {"vllm": "vllm serve", "lmcache": "lmcache server"}
    for container in containers:
        kind = container_kind(container)
        if kind is None or kind[0] != container["name"]:
            raise click.BadParameter(
                f"not a `{expected[container['name']]} ...` command line", param_hint=f"--{container['name']}"
            )
    pod = {"metadata": {"uid": "pod", "name": os.environ.get("HOSTNAME", "kvsim")}, "spec": {"containers": containers}}

    async def start() -> Any:
        engines = KvsimEngines(in_pod=True)
        handles = [await engines(pod, container, host) for container in containers]
        if not all(handle.parts for handle in handles):
            for handle in handles:
                await handle.stop()
            raise click.ClickException("the pod's engines could not start (see the log)")

        class Running:
            async def stop(self) -> None:
                for handle in reversed(handles):
                    await handle.stop()

        return Running()

    _run_until_signalled(start)


@main.command()
@probe_command_options
def probe(**options: Any) -> None:
    """Tail the LMCache lookup-hash log and serve the demand curve (LRU stack distances) on /metrics."""
    from kvtier.probe.service import start_probe

    settings = ProbeOptions(**options)
    _run_until_signalled(lambda: start_probe(settings.build(), settings.host, settings.port))


@sim.command("replay")
@click.option(
    "--scenario",
    "scenario_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Scenario file (format: scenarios/README.md).",
)
@click.option(
    "--json",
    "json_out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the results here (the README's JSON shape).",
)
@click.option(
    "--markdown", "markdown_out", type=click.Path(dir_okay=False, path_type=Path), help="Also write a markdown summary."
)
@click.option(
    "--plot",
    "plot_out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write PNG plots (quota per tenant over time, hit ratio per policy).",
)
@click.option("--policies", help="Comma-separated policies to run instead of the scenario's.")
def sim_replay(
    scenario_path: Path, json_out: Path, markdown_out: Path | None, plot_out: Path | None, policies: str | None
) -> None:
    """Replay a multi-tenant scenario under its pool policies, side by side (progress on stderr)."""
    import json
    import os
    from typing import get_args

    from pydantic import ValidationError

    from kvtier.sim.report import replay_scenario, to_json, to_markdown
    from kvtier.sim.scenario import PolicyName, load_scenario

    try:
        scenario = load_scenario(scenario_path)
    except (ValidationError, OSError, ValueError) as error:
        raise click.ClickException(f"{scenario_path}: {error}") from error
    names = None
    if policies is not None:
        names = [name.strip() for name in policies.split(",") if name.strip()]
        unknown = [name for name in names if name not in get_args(PolicyName)]
        if unknown or not names:
            raise click.BadParameter(
                f"unknown policies {unknown}; known: {', '.join(get_args(PolicyName))}", param_hint="--policies"
            )
    runs = replay_scenario(scenario, names, progress=lambda line: click.echo(line, err=True))
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(to_json(scenario, runs), indent=2) + "\n")
    click.echo(f"wrote {json_out}", err=True)
    if plot_out is not None:
        from kvtier.sim.plots import plot_replay

        plot_out.parent.mkdir(parents=True, exist_ok=True)
        plot_replay(scenario, runs, plot_out)
        click.echo(f"wrote {plot_out}", err=True)
    if markdown_out is not None:
        markdown_out.parent.mkdir(parents=True, exist_ok=True)
        plot_link = os.path.relpath(plot_out, markdown_out.parent) if plot_out is not None else None
        markdown_out.write_text(to_markdown(scenario, runs, plot_link))
        click.echo(f"wrote {markdown_out}", err=True)


@main.command()
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Kubeconfig to use (default: $KUBECONFIG, ~/.kube/config, or the in-cluster service account).",
)
@click.option(
    "-n",
    "--namespace",
    "namespaces",
    multiple=True,
    help="Serve InferenceDeployments of this namespace only (repeatable; default: all namespaces).",
)
@click.option(
    "--resync-seconds",
    type=click.FloatRange(min=0.5),
    default=10.0,
    show_default=True,
    help="How often every object is re-reconciled (drift correction, status refresh).",
)
@click.option(
    "--lmcache-image",
    default=None,
    help="Image of the LMCache MP server container: lmcache 0.5.6 with lmcache-rust-raw-block-io (storage tiers need it).",
)
@click.option("--probe-image", default=None, help="Image of the kvtier-probe sidecar (the kvtier image).")
@click.option("--pod-monitor", is_flag=True, help="Render a PodMonitor per deployment (Prometheus Operator CRDs).")
@click.option("--liveness", default=None, help="Serve liveness on this URL, e.g. http://0.0.0.0:8080/healthz.")
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="Serve the operator's own Prometheus metrics (kvtier_*) on this port at /metrics (0: off).",
)
@click.option(
    "--scrape-interval",
    type=click.FloatRange(min=0.1),
    default=15.0,
    show_default=True,
    help="Seconds between telemetry cycles: every Ready replica's vLLM, LMCache and probe metrics "
    "(or the Prometheus queries) feed status.kv and MetricsAvailable.",
)
@click.option(
    "--metrics-source",
    type=click.Choice(["scrape", "prometheus"]),
    default="scrape",
    show_default=True,
    help="scrape: fetch every replica's /metrics directly; prometheus: query --prometheus-url instead "
    "(the series your Prometheus scrapes from the PodMonitor).",
)
@click.option(
    "--prometheus-url",
    default=None,
    metavar="URL",
    help="Base URL of the Prometheus server for --metrics-source prometheus, e.g. http://prometheus:9090.",
)
@click.option(
    "--status-interval",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="Least seconds between two telemetry writes of one deployment's status (only material changes are written).",
)
@click.option(
    "--telemetry-window",
    type=click.FloatRange(min=1),
    default=300.0,
    show_default=True,
    help="Seconds of history behind hit ratios, rates and the watermark mean/max.",
)
@click.option(
    "--peering",
    default=None,
    metavar="NAME",
    help="Join this kopf peering (a ClusterKopfPeering, or a KopfPeering per namespace; it must exist): "
    "a peer of higher --priority pauses this operator. Default: standalone.",
)
@click.option("--priority", type=int, default=0, show_default=True, help="Peering priority (with --peering).")
@click.option(
    "--simulated-engine-image",
    default=None,
    metavar="IMAGE",
    help="Run every engine under kvsim from this image (the kvtier image): kind and demos, never production.",
)
@click.option(
    "--operator-namespace",
    envvar="POD_NAMESPACE",
    default="kvtier-system",
    show_default=True,
    help="The operator's own namespace, where released static volumes are wiped (env POD_NAMESPACE).",
)
@click.option("--wipe-image", default=None, help="Image of the Jobs that wipe released static volumes.")
def run(
    kubeconfig: Path | None,
    namespaces: tuple[str, ...],
    resync_seconds: float,
    lmcache_image: str | None,
    probe_image: str | None,
    pod_monitor: bool,
    liveness: str | None,
    metrics_port: int,
    scrape_interval: float,
    metrics_source: str,
    prometheus_url: str | None,
    status_interval: float,
    telemetry_window: float,
    peering: str | None,
    priority: int,
    simulated_engine_image: str | None,
    operator_namespace: str,
    wipe_image: str | None,
) -> None:
    """Run the kvtier operator against a cluster until interrupted."""
    import asyncio
    import dataclasses
    import logging

    from kvtier.controllers import OperatorConfig, run_operator
    from kvtier.render import RenderOptions

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    images = {"lmcache_image": lmcache_image, "probe_image": probe_image, "wipe_image": wipe_image}
    render = dataclasses.replace(
        RenderOptions(), pod_monitor=pod_monitor, **{key: value for key, value in images.items() if value}
    )
    if simulated_engine_image:
        from kvtier.render.simulate import simulated_options

        render = simulated_options(render, simulated_engine_image)
    if metrics_source == "prometheus" and not prometheus_url:
        raise click.BadParameter("--metrics-source prometheus needs --prometheus-url", param_hint="--prometheus-url")
    config = OperatorConfig(
        kubeconfig=kubeconfig,
        namespaces=namespaces,
        resync_seconds=resync_seconds,
        render=render,
        metrics_port=metrics_port,
        scrape_interval_seconds=scrape_interval,
        metrics_source=metrics_source,
        prometheus_url=prometheus_url,  # type: ignore[arg-type]  # click.Choice checked the literal
        status_interval_seconds=status_interval,
        telemetry_window_seconds=telemetry_window,
        peering=peering,
        priority=priority,
        namespace=operator_namespace,
    )
    asyncio.run(run_operator(config, liveness_endpoint=liveness))


@main.command()
@click.option(
    "--scenario",
    "scenario_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Replay scenario (scenarios/README.md): its tenants, their traces and cost models, and the pool.",
)
@click.option(
    "--trace",
    "traces",
    multiple=True,
    metavar="[NAME=]FILE",
    help="A deployment's Mooncake-format trace (repeatable), instead of --scenario; the options below "
    "give every trace the same tenant fields.",
)
@click.option(
    "--live",
    is_flag=True,
    help="Plan the cluster's KVPools from the demand curves their deployments "
    "publish in status.kv (the current kubeconfig context, or --kubeconfig).",
)
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Kubeconfig of the cluster to plan (implies --live).",
)
@click.option("--pool", "pool_name", default=None, help="Live: plan this KVPool only (default: every pool).")
@click.option("--capacity", "capacity", default=None, help="With --trace: the current pool capacity (e.g. 2Ti).")
@click.option(
    "--cost-model",
    type=click.Choice(sorted(COST_MODEL_PRESETS)),
    default="llama-3-70b-4xh100",
    show_default=True,
    help="With --trace or live: the deployments' cost model preset.",
)
@click.option("--block-tokens", type=click.IntRange(1), default=512, show_default=True, help="With --trace.")
@click.option(
    "--storage-read-bytes-per-second",
    type=click.FloatRange(min=1),
    default=5.23e9,
    show_default=True,
    help="With --trace: what one replica reads from the pool.",
)
@click.option(
    "--capacities",
    default=None,
    metavar="Q,Q,...",
    help="Capacities to try, e.g. 10Ti,20Ti (default: 0.25x to 4x the current one).",
)
@click.option(
    "--read-bandwidth",
    default=None,
    metavar="BYTES/S",
    help="The pool's total read bandwidth (a quantity, e.g. 25G); default: live, spec.readBandwidth x "
    "replicas, else the chosen price row's arrays'.",
)
@click.option(
    "--prices",
    "prices_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Price table (manifests/examples/prices-fx100.yaml shows the format).",
)
@click.option(
    "--target-hit-ratio",
    type=click.FloatRange(0, 1),
    default=None,
    help="Pick the smallest capacity whose overall block hit ratio reaches this.",
)
@click.option(
    "--target-ttft-p50",
    type=click.FloatRange(min=0),
    default=None,
    metavar="SECONDS",
    help="... whose TTFT p50 is at most this.",
)
@click.option(
    "--max-price-per-saved-gpu-hour",
    type=click.FloatRange(min=0),
    default=None,
    help="... whose price per saved GPU-hour (amortized as the price table says) is at most this.",
)
@click.option("--json", "json_out", is_flag=True, help="Print JSON instead of the table.")
@click.option(
    "--plot",
    "plot_out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write a PNG: hit ratio and saved GPU-hours against capacity.",
)
def plan(
    scenario_path: Path | None,
    traces: tuple[str, ...],
    live: bool,
    kubeconfig: Path | None,
    pool_name: str | None,
    capacity: str | None,
    cost_model: str,
    block_tokens: int,
    storage_read_bytes_per_second: float,
    capacities: str | None,
    read_bandwidth: str | None,
    prices_path: Path | None,
    target_hit_ratio: float | None,
    target_ttft_p50: float | None,
    max_price_per_saved_gpu_hour: float | None,
    json_out: bool,
    plot_out: Path | None,
) -> None:
    """Capacity planning: what each pool size would earn, divided as the rebalancer divides it, and what it costs."""
    import json

    import yaml

    from kvtier.api.units import parse_quantity
    from kvtier.rebalance import planner, planreport
    from kvtier.rebalance import prices as pricing
    from kvtier.rebalance.recommend import divisible

    def quantity(text: str, hint: str) -> int:
        try:
            return parse_quantity(text.strip())
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint=hint) from error

    live = live or kubeconfig is not None
    if (scenario_path is not None) + bool(traces) + live != 1:
        raise click.UsageError("give exactly one source: --scenario FILE, --trace FILE ... or --live/--kubeconfig")
    jobs = (
        _plan_live(kubeconfig, pool_name, cost_model)
        if live
        else [
            _plan_offline(
                scenario_path,
                traces,
                capacity,
                capacities is not None,
                cost_model,
                block_tokens,
                storage_read_bytes_per_second,
                quantity,
            )
        ]
    )
    if plot_out is not None and len(jobs) > 1:
        raise click.BadParameter("one plot per run: name the pool with --pool", param_hint="--plot")
    prices = None
    if prices_path is not None:
        try:
            prices = pricing.price_table(yaml.safe_load(prices_path.read_text()))
        except (OSError, yaml.YAMLError, ValueError) as error:
            raise click.ClickException(f"{prices_path}: {error}") from error
    bandwidth = float(quantity(read_bandwidth, "--read-bandwidth")) if read_bandwidth else None
    targets = planner.Targets(target_hit_ratio, target_ttft_p50, max_price_per_saved_gpu_hour)
    amortization = prices.amortization_years if prices else 3.0
    documents, texts = [], []
    for title, profiles, current, block, pool_bandwidth, evaluate, notes in jobs:
        for note in notes:
            click.echo(f"note: {title}: {note}", err=True)
        if not profiles:
            click.echo(f"note: {title}: no deployment to plan", err=True)
            continue
        if capacities is not None:
            tried = [quantity(item, "--capacities") // block for item in capacities.split(",") if item.strip()]
            if not tried or min(tried) < 1:
                raise click.BadParameter("needs capacities of at least one block each", param_hint="--capacities")
        elif current:  # the default grid leaves out capacities the deployments' minimums do not fit in
            tried = [blocks for blocks in planner.default_capacities(current) if divisible(profiles, blocks)]
            if not tried:
                raise click.ClickException(f"{title}: no default capacity fits the deployments' minimums")
        else:
            raise click.BadParameter(
                "the current capacity is less than one block; give --capacities", param_hint="--capacity"
            )
        settings = {
            "evaluate": evaluate,
            "block_bytes": block,
            "read_bandwidth": bandwidth or pool_bandwidth,
            "prices": prices,
        }
        try:
            outcomes = planner.plan(profiles, tried, **settings)
            if capacities is None:  # a default grid is coarse: bisect toward the smallest capacity meeting the targets
                outcomes = planner.refine(profiles, outcomes, targets, **settings)
        except ValueError as error:
            raise click.ClickException(f"{title}: {error}") from error
        chosen = planner.pick(outcomes, targets, amortization)
        documents.append({"name": title, **planreport.to_json(outcomes, current, block, targets, chosen, prices)})
        texts.append((f"{title}:\n" if live else "") + planreport.table(outcomes, current, chosen, prices))
        if plot_out is not None:
            plot_out.parent.mkdir(parents=True, exist_ok=True)
            planreport.plot(outcomes, current, block, targets, chosen, title, plot_out)
            click.echo(f"wrote {plot_out}", err=True)
    if json_out:
        click.echo(json.dumps(documents if live else documents[0], indent=2))
    else:
        click.echo("\n\n".join(texts))


PlanJob = tuple[str, Any, int, int, "float | None", Callable[..., Any], list[str]]


def _plan_offline(
    scenario_path: Path | None,
    traces: tuple[str, ...],
    capacity: str | None,
    capacities: bool,
    cost_model: str,
    block_tokens: int,
    storage_read_bytes_per_second: float,
    quantity: Callable[[str, str], int],
) -> PlanJob:
    """(title, profiles, current blocks, block bytes, pool bandwidth, evaluate, notes) of a scenario or traces."""
    from pydantic import ValidationError

    from kvtier.rebalance.costmodel import preset
    from kvtier.sim import planning
    from kvtier.sim.scenario import load_scenario

    try:
        if scenario_path is not None:
            scenario = load_scenario(scenario_path)
        else:
            if capacity is None and not capacities:
                raise click.BadParameter(
                    "--trace needs --capacity (the current pool) or --capacities", param_hint="--capacity"
                )
            named = [tuple(item.split("=", 1)) if "=" in item else (Path(item).stem, item) for item in traces]
            kv_bytes = preset(cost_model).kv_bytes_per_token
            scenario = planning.trace_scenario(
                [(name, Path(path)) for name, path in named],
                capacity_blocks=quantity(capacity, "--capacity") // (block_tokens * kv_bytes) if capacity else 0,
                block_tokens=block_tokens,
                kv_bytes_per_token=kv_bytes,
                prefill_tokens_per_second=1.0,  # unused: the preset prefills
                storage_read_bytes_per_second=storage_read_bytes_per_second,
                cost_model=cost_model,
            )
        profiles = planning.profiles(scenario)
    except (ValidationError, OSError, ValueError) as error:
        raise click.ClickException(f"{scenario_path or ', '.join(traces)}: {error}") from error
    return (
        scenario.name,
        profiles,
        scenario.capacity_blocks,
        planning.block_bytes(scenario),
        None,
        planning.evaluate,
        planning.caveats(scenario),
    )


def _plan_live(kubeconfig: Path | None, pool_name: str | None, cost_model: str) -> list[PlanJob]:
    """One job per KVPool of the cluster (or the named one), from its deployments' published curves."""
    import asyncio

    import aiohttp
    from kubernetes.config.config_exception import ConfigException

    from kvtier.kube import APIError, Connection, KubeClient
    from kvtier.rebalance import planlive
    from kvtier.rebalance.costmodel import preset
    from kvtier.rebalance.planner import evaluate_curves

    async def read() -> list[planlive.LivePool]:
        connection = Connection.from_kubeconfig(str(kubeconfig) if kubeconfig else None)
        async with KubeClient(connection, user_agent="kvtier-plan") as kube:
            return await planlive.read_live_pools(kube, preset(cost_model))

    try:
        pools = asyncio.run(read())
    except ConfigException as error:
        raise click.ClickException(f"kubeconfig: {error}") from error
    except (APIError, OSError, aiohttp.ClientError) as error:
        raise click.ClickException(f"reading KVPools and InferenceDeployments: {error}") from error
    if pool_name is not None:
        pools = [pool for pool in pools if pool.name == pool_name]
        if not pools:
            raise click.BadParameter(f"no KVPool {pool_name!r} in the cluster", param_hint="--pool")
    if not pools:
        raise click.ClickException("the cluster has no KVPools to plan")
    return [
        (
            pool.name,
            pool.profiles,
            pool.capacity_blocks,
            planlive.LIVE_BLOCK_BYTES,
            pool.read_bandwidth,
            evaluate_curves,
            [f"{entry}: left out" for entry in pool.without_curve],
        )
        for pool in pools
    ]
