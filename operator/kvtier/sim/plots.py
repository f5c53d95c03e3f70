"""Plots of a scenario replay: hit ratio per policy (overall and per epoch), quota per tenant over time.

Uses matplotlib's object API with the Agg canvas (no display, no global pyplot state).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

from kvtier.sim.report import PolicyRun
from kvtier.sim.scenario import Scenario


def plot_replay(scenario: Scenario, runs: Sequence[PolicyRun], path: str | os.PathLike[str]) -> None:
    """Write a PNG: top, block hit ratio per policy and per epoch; below, each partitioned policy's quotas, stacked."""
    from matplotlib.figure import Figure

    partitioned = [run for run in runs if run.partitioned]
    rows = 1 + math.ceil(len(partitioned) / 2)
    figure = Figure(figsize=(13, 4.2 * rows), layout="constrained")
    grid = figure.add_gridspec(rows, 2)
    figure.suptitle(f"kvtier sim replay: {scenario.name} (pool {scenario.capacity_blocks:,} blocks)")

    bars = figure.add_subplot(grid[0, 0])
    names = [run.name for run in runs][::-1]
    ratios = [run.result.overall.block_hit_ratio for run in runs][::-1]
    bars.barh(names, ratios, color="tab:blue")
    for y, ratio in enumerate(ratios):
        bars.text(ratio, y, f" {ratio:.4f}", va="center")
    bars.set_xlim(0, max(ratios, default=1) * 1.2 or 1)
    bars.set_xlabel("block hit ratio (whole run)")
    bars.set_title("hit ratio per policy")

    epochs = figure.add_subplot(grid[0, 1])
    for run in runs:
        timeline = run.timeline
        points = list(zip(timeline.times, timeline.hit_blocks, timeline.accessed_blocks))
        # Every policy on the same epochs (kvtier's timeline has a point every round).
        points = [
            point
            for index, point in enumerate(points)
            if index == len(points) - 1 or (point[0] / scenario.epoch_seconds).is_integer()
        ]
        times, values = [], []
        for (start, hits0, seen0), (end, hits1, seen1) in zip(points, points[1:]):
            if seen1 > seen0:
                times += [start / 60, end / 60]
                values += [(hits1 - hits0) / (seen1 - seen0)] * 2
        epochs.plot(times, values, label=run.name)
    epochs.set_xlabel("virtual time (min)")
    epochs.set_ylabel("block hit ratio in the epoch")
    epochs.set_title(f"hit ratio per policy, per epoch of {scenario.epoch_seconds:g} s")
    epochs.legend(fontsize="small")

    tenants = [tenant.name for tenant in scenario.tenants]
    for index, run in enumerate(partitioned):
        axes = figure.add_subplot(grid[1 + index // 2, index % 2])
        timeline = run.timeline
        minutes = [t / 60 for t in timeline.times]
        series = [[q.get(tenant, 0) for q in timeline.quotas] for tenant in tenants]
        axes.stackplot(minutes, *series, labels=tenants, step="post", alpha=0.85)
        axes.set_ylim(0, scenario.capacity_blocks * 1.05)
        axes.set_xlabel("virtual time (min)")
        axes.set_ylabel("quota (blocks, stacked)")
        axes.set_title(f"{run.name}: quotas ({timeline.moves} moves, {timeline.moved_blocks:,} blocks moved)")
        axes.legend(fontsize="small")
    figure.savefig(path, dpi=90)
