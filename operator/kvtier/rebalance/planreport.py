"""How a capacity plan reads: a table, JSON, and a PNG (hit ratio and saved GPU-hours against capacity)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from kvtier.rebalance.planner import CapacityOutcome, Pick, Targets
from kvtier.rebalance.prices import PriceTable


def _bytes(value: float) -> str:
    """Capacities in TiB with two decimals (GiB, MiB below): comparable down a column."""
    if value >= 2**40:
        return f"{value / 2**40:,.2f}Ti"
    return f"{value / 2**30:,.0f}Gi" if value >= 2**30 else f"{value / 2**20:,.0f}Mi"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e9:.1f}"


def table(
    outcomes: Sequence[CapacityOutcome], current_blocks: int, chosen: Pick, prices: PriceTable | None = None
) -> str:
    """The plan as text: one row per capacity, then each tenant's share and hit ratios, then the pick."""
    amortization = prices.amortization_years if prices is not None else None
    currency = prices.currency if prices is not None else ""
    header = [
        "capacity",
        "x now",
        "block hit",
        "token hit",
        "GPU s saved/h",
        "TTFT p50 s",
        "TTFT p99 s",
        "reads GB/s mean/peak",
        "read bw GB/s",
    ]
    if prices is not None:
        header += [f"price {currency}", f"{currency}/saved GPU-h"]
    rows = []
    for outcome in outcomes:
        picked = chosen.capacity is not None and outcome.capacity_blocks == chosen.capacity.capacity_blocks
        mark = "*" if picked else " "
        row = [
            f"{mark}{_bytes(outcome.capacity_bytes)}",
            f"{outcome.capacity_blocks / current_blocks:.2f}" if current_blocks else "-",
            f"{outcome.block_hit_ratio:.3f}",
            f"{outcome.token_hit_ratio:.3f}",
            f"{outcome.gpu_seconds_saved_per_hour:,.0f}",
            _seconds(outcome.ttft_p50_seconds),
            _seconds(outcome.ttft_p99_seconds),
            f"{_rate(outcome.read_bytes_per_second_mean)}/{_rate(outcome.read_bytes_per_second_peak)}",
            _rate(outcome.read_bandwidth) + (" SATURATED" if outcome.saturated else ""),
        ]
        if prices is not None:
            per_hour = outcome.price_per_saved_gpu_hour(amortization)  # type: ignore[arg-type]  # set whenever prices are
            row += [
                f"{outcome.price:,.0f}" if outcome.price is not None else "-",
                "-" if per_hour is None else f"{per_hour:,.2f}",
            ]
        rows.append(row)
    lines = _columns(header, rows)
    tenants = list(outcomes[0].per_tenant) if outcomes else []
    tenant_header = ["capacity"] + [f"{name} quota / block / token" for name in tenants]
    tenant_rows = [[_bytes(o.capacity_bytes)] + [_share(o, name) for name in tenants] for o in outcomes]
    lines += ["", "per deployment (its share of the pool, block and token hit ratio):"]
    lines += _columns(tenant_header, tenant_rows)
    if prices is not None:
        lines.append("")
        lines.append(
            f"prices: the cheapest option whose read bandwidth carries the peak minute; per saved GPU-hour "
            f"over {amortization:g} years"
        )
        runs: list[list[CapacityOutcome]] = []
        for outcome in outcomes:
            if runs and runs[-1][-1].price_option == outcome.price_option:
                runs[-1].append(outcome)
            else:
                runs.append([outcome])
        for run in runs:
            span = _bytes(run[0].capacity_bytes) + ("" if len(run) == 1 else f" to {_bytes(run[-1].capacity_bytes)}")
            lines.append(f"  {span}: {run[0].price_option}")
    lines.append("")
    if chosen.capacity is not None:
        lines.append(
            f"pick: {_bytes(chosen.capacity.capacity_bytes)} ({chosen.capacity.capacity_blocks:,} blocks): "
            f"{chosen.reason}"
        )
    else:
        lines.append(f"pick: none: {chosen.reason}")
    return "\n".join(lines)


def _share(outcome: CapacityOutcome, name: str) -> str:
    tenant = outcome.per_tenant[name]
    block_bytes = outcome.capacity_bytes / max(1, outcome.capacity_blocks)
    return f"{_bytes(tenant.quota_blocks * block_bytes)} / {tenant.block_hit_ratio:.3f} / {tenant.token_hit_ratio:.3f}"


def _columns(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    return ["  ".join(cell.rjust(width) for cell, width in zip(line, widths)).rstrip() for line in [header, *rows]]


def to_json(
    outcomes: Sequence[CapacityOutcome],
    current_blocks: int,
    block_bytes: int,
    targets: Targets,
    chosen: Pick,
    prices: PriceTable | None = None,
) -> dict[str, Any]:
    amortization = prices.amortization_years if prices is not None else None
    return {
        "current": {"capacity_blocks": current_blocks, "capacity_bytes": current_blocks * block_bytes},
        "block_bytes": block_bytes,
        "targets": {
            "hit_ratio": targets.hit_ratio,
            "ttft_p50_seconds": targets.ttft_p50_seconds,
            "max_price_per_saved_gpu_hour": targets.max_price_per_saved_gpu_hour,
        },
        "currency": prices.currency if prices is not None else None,
        "amortization_years": amortization,
        "capacities": [outcome.to_dict(amortization) for outcome in outcomes],
        "pick": {
            "capacity_blocks": chosen.capacity.capacity_blocks if chosen.capacity else None,
            "capacity_bytes": chosen.capacity.capacity_bytes if chosen.capacity else None,
            "reason": chosen.reason,
        },
    }


def plot(
    outcomes: Sequence[CapacityOutcome],
    current_blocks: int,
    block_bytes: int,
    targets: Targets,
    chosen: Pick,
    title: str,
    path: str | os.PathLike[str],
) -> None:
    """Write a PNG: block and token hit ratio (left axis) and saved GPU-hours per hour (right axis)
    against capacity (TiB, log scale), the current capacity and the pick marked."""
    from matplotlib.figure import Figure

    tb = [outcome.capacity_bytes / 2**40 for outcome in outcomes]
    current_tb = current_blocks * block_bytes / 2**40
    pick_tb = chosen.capacity.capacity_bytes / 2**40 if chosen.capacity is not None else None
    figure = Figure(figsize=(10, 8), layout="constrained")
    hits, gpu = figure.subplots(2, 1, sharex=True)
    figure.suptitle(f"kvtier plan: {title}")
    hits.plot(tb, [o.block_hit_ratio for o in outcomes], "o-", color="tab:blue", label="block hit ratio")
    hits.plot(tb, [o.token_hit_ratio for o in outcomes], "s--", color="tab:cyan", label="token hit ratio")
    saturated = [(x, o.block_hit_ratio) for x, o in zip(tb, outcomes) if o.saturated]
    if saturated:
        hits.plot(*zip(*saturated), "x", color="tab:red", markersize=12, mew=2, label="reads saturate bandwidth")
    if targets.hit_ratio is not None:
        hits.axhline(targets.hit_ratio, color="tab:orange", linestyle="--", label=f"target {targets.hit_ratio}")
    hits.set_ylabel("hit ratio (all deployments)")
    hits.set_ylim(0, min(1.0, 1.15 * max(max(o.token_hit_ratio for o in outcomes), targets.hit_ratio or 0)) or 1)
    saved = [o.gpu_seconds_saved_per_hour / 3600 for o in outcomes]
    gpu.plot(tb, saved, "^-", color="tab:green", label="GPU-hours of prefill saved per hour")
    gpu.set_ylabel("GPU-hours saved per hour")
    gpu.set_ylim(0, 1.15 * max(saved) or 1)
    gpu.set_xlabel("pool capacity (TiB, log scale)")
    gpu.set_xscale("log")
    for axes, values in ((hits, [o.block_hit_ratio for o in outcomes]), (gpu, saved)):
        if current_blocks:
            axes.axvline(current_tb, color="gray", linestyle=":", linewidth=2, label=f"current {current_tb:,.2f} TiB")
        if pick_tb is not None:
            axes.axvline(pick_tb, color="tab:purple", linewidth=2, label=f"pick {pick_tb:,.2f} TiB")
            axes.plot([pick_tb], [values[tb.index(pick_tb)]], "*", color="tab:purple", markersize=16)
        axes.grid(True, which="major", alpha=0.3)
        axes.legend(loc="upper left", fontsize=9)
    ticks: list[float] = []
    for x in tb:  # refined capacities crowd around the pick: label those at least 12% apart
        if not ticks or x >= 1.12 * ticks[-1]:
            ticks.append(x)
    gpu.set_xticks(ticks, [f"{x:,.3g}" for x in ticks])
    gpu.minorticks_off()
    figure.savefig(path, dpi=110)
