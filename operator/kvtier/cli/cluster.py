"""`kvtier dev up` and `kvtier demo`: kvtier's world on this machine."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import click


@click.group()
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


@click.command()
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
