"""`kvtier run` (the operator) and `kvtier probe` (the sidecar): the long-running processes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import click

from kvtier.probe.options import ProbeOptions
from kvtier.probe.options import command_options as probe_command_options


def run_until_signalled(start: Callable[[], Awaitable[Any]]) -> None:
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


@click.command()
@probe_command_options
def probe(**options: Any) -> None:
    """Tail the LMCache lookup-hash log and serve the demand curve (LRU stack distances) on /metrics."""
    from kvtier.probe.service import start_probe

    settings = ProbeOptions(**options)
    run_until_signalled(lambda: start_probe(settings.build(), settings.host, settings.port))


@click.command()
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
@click.option(
    "--verbose",
    is_flag=True,
    help="Log every success of the periodic passes too (the resync timer's and telemetry's, per deployment).",
)
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
    verbose: bool,
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
    asyncio.run(run_operator(config, liveness_endpoint=liveness, verbose=verbose))
