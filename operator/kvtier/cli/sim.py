"""`kvtier sim`: kvsim, a simulated vLLM + LMCache engine (serve, pod, replay)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from kvtier.cli.services import run_until_signalled


@click.group()
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
    run_until_signalled(lambda: start_sim(server, host, port=port, lmcache_http_port=lmcache_http_port, load=load))


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

    run_until_signalled(start)


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
