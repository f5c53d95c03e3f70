"""`kvtier plan`: what a rebalance round would do, offline from a scenario or live from a cluster."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from kvtier.rebalance.costmodel import PRESETS as COST_MODEL_PRESETS


@click.command()
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
