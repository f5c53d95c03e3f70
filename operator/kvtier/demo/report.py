"""What the demo keeps of a run and writes at the end: ``summary.md``, ``demo.png`` and ``samples.json``.

A :class:`History` takes one :class:`~kvtier.demo.observe.Snapshot` a second; quota changes are
read off the samples (whatever moved them), rebalance rounds off the pool's ``status.lastRebalance``
(one per distinct ``time``), and Events whose reason starts with ``Rebalanc``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvtier.api.units import gib
from kvtier.demo.observe import TIERS, EventView, Rebalance, Snapshot, epoch_seconds
from kvtier.demo.view import MISSING, clock_text, ratio, size

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: Rows of the quota-change table in the summary (all of them are in samples.json).
MAX_ROWS = 40
#: Busy spans shorter than this (the run ended just after a phase began) get no row of their own.
MIN_SPAN_SECONDS = 5.0


@dataclass(frozen=True)
class Sample:
    time: float
    """Seconds since the measured part of the run began."""
    quota: dict[str, int | None]
    watermark: dict[str, float | None]
    hit_ratio: dict[str, dict[str, float | None]]
    ready: dict[str, int | None]
    replicas: dict[str, int | None]
    """Desired replicas (a deployment holds quota x replicas of the pool)."""
    busy: str | None = None
    prompt_rate: dict[str, float | None] = field(default_factory=dict)
    """Prompt tokens per second per deployment, over the operator's telemetry window."""

    def storage_hit_rate(self, name: str) -> float | None:
        """Prompt tokens per second `name`'s storage tier served (its storage hit ratio x its prompt rate)."""
        storage, rate = self.hit_ratio.get(name, {}).get("storage"), self.prompt_rate.get(name)
        return None if storage is None or rate is None else storage * rate


@dataclass(frozen=True)
class QuotaChange:
    time: float
    name: str
    before: int | None
    after: int | None


@dataclass
class History:
    speed: float
    names: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    rebalances: dict[str, Rebalance] = field(default_factory=dict)
    rebalance_events: dict[tuple[str, str, str, str], EventView] = field(default_factory=dict)
    first: Snapshot | None = None
    last: Snapshot | None = None
    origin: float | None = None
    """Wall-clock time (seconds since the epoch) of time 0, to put the operator's timestamps on the run's clock."""

    def add(self, time: float, snapshot: Snapshot, busy: str | None = None, at: float | None = None) -> None:
        """Sample `snapshot`, taken `time` seconds into the run (at wall-clock `at`, if known)."""
        if self.origin is None and at is not None:
            self.origin = at - time
        self.first = self.first or snapshot
        self.last = snapshot
        for d in snapshot.deployments:
            if d.name not in self.names:
                self.names.append(d.name)
        by_name = {d.name: d for d in snapshot.deployments}
        self.samples.append(
            Sample(
                time=time,
                quota={name: by_name[name].quota if name in by_name else None for name in self.names},
                watermark={name: by_name[name].watermark if name in by_name else None for name in self.names},
                hit_ratio={name: dict(by_name[name].hit_ratio) if name in by_name else {} for name in self.names},
                ready={name: by_name[name].ready if name in by_name else None for name in self.names},
                replicas={name: by_name[name].desired if name in by_name else None for name in self.names},
                busy=busy,
                prompt_rate={name: by_name[name].prompt_rate if name in by_name else None for name in self.names},
            )
        )
        record = snapshot.pool.last_rebalance if snapshot.pool else None
        if record is not None and record.time not in self.rebalances:
            self.rebalances[record.time] = record
        for event in snapshot.events:
            if event.is_rebalance:
                self.rebalance_events.setdefault((event.time, event.name, event.reason, event.message), event)

    def run_time(self, timestamp: str) -> str:
        """An operator timestamp on the run's clock (`14s`), so the summary has one form of time."""
        epoch = epoch_seconds(timestamp)
        if epoch is None or self.origin is None:
            return timestamp or MISSING
        offset = epoch - self.origin
        return clock_text(offset) if offset >= 0 else f"−{clock_text(-offset)}"

    @property
    def duration(self) -> float:
        return self.samples[-1].time if self.samples else 0.0

    def quota_changes(self) -> list[QuotaChange]:
        changes = []
        for before, after in zip(self.samples, self.samples[1:]):
            for name in self.names:
                old, new = before.quota.get(name), after.quota.get(name)
                if old is not None and new is not None and old != new:
                    changes.append(QuotaChange(after.time, name, old, new))
        return changes

    def quota_at(self, name: str, last: bool) -> int | None:
        values = [s.quota.get(name) for s in self.samples if s.quota.get(name) is not None]
        return (values[-1] if last else values[0]) if values else None

    def hit_stats(self, name: str, tier: str) -> tuple[float | None, float | None]:
        """Mean over the samples that have it, and the last value."""
        values = [v for s in self.samples if (v := s.hit_ratio.get(name, {}).get(tier)) is not None]
        return (sum(values) / len(values), values[-1]) if values else (None, None)

    def to_json(self) -> dict[str, Any]:
        return {
            "speed": self.speed,
            "deployments": self.names,
            "samples": [asdict(sample) for sample in self.samples],
            "quotaChanges": [asdict(change) for change in self.quota_changes()],
            "rebalances": [asdict(record) for record in self.rebalances.values()],
            "rebalanceEvents": [asdict(event) for event in self.rebalance_events.values()],
        }


def write_samples(history: History, path: str | os.PathLike[str]) -> None:
    Path(path).write_text(json.dumps(history.to_json(), indent=1) + "\n")


def _rate(value: float | None) -> str:
    """Tokens per second for people: `8.3k`, `412`, `0`."""
    if value is None:
        return MISSING
    return f"{value / 1000:.1f}k" if value >= 1000 else f"{value:.0f}"


def _arrow(before: str, after: str) -> str:
    return before if before == after else f"{before} → {after}"


def summary_markdown(
    history: History, *, plot: str | None = "demo.png", interrupted: bool = False, window: float | None = None
) -> str:
    """The run in words and tables; times are seconds since every replica was Ready (`window`: the operator's
    telemetry window in seconds, which the ratios and rates are averaged over)."""
    last = history.last
    pool = last.pool if last else None
    lines = ["# kvtier demo: summary", ""]
    ran = (
        f"{clock_text(history.duration)} of wall-clock time ({clock_text(history.duration * history.speed)} "
        f"simulated at {history.speed:g}x)"
    )
    lines.append(
        f"Ran {ran}{', interrupted by the user' if interrupted else ''}, "
        f"{len(history.names)} deployments sharing one pool; a sample a second. Times are seconds since "
        f"every replica was Ready."
    )
    if pool is not None:
        lines += [
            "",
            f"Pool `{pool.name}` ({pool.storage or MISSING}, policy {pool.policy or MISSING}): capacity "
            f"{size(pool.capacity)}, allocated {size(pool.allocated)} at the end.",
        ]
    if plot:
        lines += ["", f"![quota, storage-tier hits and hit ratio over time]({plot})"]

    lines += [
        "",
        "## Storage quota per deployment (per replica)",
        "",
        "| deployment | at start | at end | change | min | max | time as the busy one |",
        "|---|---|---|---|---|---|---|",
    ]
    final = {d.name: d for d in (last.deployments if last else ())}
    for name in history.names:
        start, end = history.quota_at(name, last=False), history.quota_at(name, last=True)
        change = (
            MISSING
            if start is None or end is None
            else ("unchanged" if start == end else f"{'+' if end > start else '−'}{size(abs(end - start))}")
        )
        busy = sum(
            after.time - before.time
            for before, after in zip(history.samples, history.samples[1:])
            if before.busy == name
        )
        d = final.get(name)
        lines.append(
            f"| {name} | {size(start)} | {size(end)} | {change} | {size(d.min if d else None)} | "
            f"{size(d.max if d else None)} | {clock_text(busy)} |"
        )

    spans = _segments(history.samples)
    if spans:
        over = f" over the operator's {clock_text(window)} telemetry window" if window else ""
        lines += [
            "",
            "## Each busy span: what the busy deployment's quota bought",
            "",
            "When a deployment turns busy it sends more prompts, over more distinct documents than HBM and "
            "the CPU tier hold: its working set grew, so its hit ratio over all tiers falls. That is the load "
            "changing, not the quota. What the quota buys is the storage tier's part: the prompt tokens per "
            "second its storage tier serves (storage hit ratio x prompt tokens per second), which grows as "
            f"the rebalancer moves quota to it. Rates and ratios are averages{over}, so a span's first "
            "values still partly show the span before.",
            "",
            "| span | busy | its quota | prompt tokens/s | from its storage tier, tokens/s | "
            "storage hit ratio | hit ratio, all tiers |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, begin, end in spans:
            if end - begin < MIN_SPAN_SECONDS:
                continue
            inside = [s for s in history.samples if begin <= s.time <= end]
            first, final_sample = inside[0], inside[-1]

            def both(value: Any) -> str:
                return _arrow(value(first), value(final_sample))

            lines.append(
                f"| {clock_text(begin)}–{clock_text(end)} | {name} | {both(lambda s: size(s.quota.get(name)))} | "
                f"{both(lambda s: _rate(s.prompt_rate.get(name)))} | "
                f"{both(lambda s: _rate(s.storage_hit_rate(name)))} | "
                f"{both(lambda s: ratio(s.hit_ratio.get(name, {}).get('storage')))} | "
                f"{both(lambda s: ratio(s.hit_ratio.get(name, {}).get('total')))} |"
            )

    changes = history.quota_changes()
    lines += ["", "## Rebalancing", ""]
    lines.append(
        f"{len(changes)} quota change{'s' if len(changes) != 1 else ''} observed, "
        f"{len(history.rebalances)} rebalance round{'s' if len(history.rebalances) != 1 else ''} recorded in "
        f"the pool's `status.lastRebalance`, {len(history.rebalance_events)} rebalance Event"
        f"{'s' if len(history.rebalance_events) != 1 else ''}."
    )
    if changes:
        lines += ["", "| at | deployment | from | to |", "|---|---|---|---|"]
        lines += [
            f"| {clock_text(c.time)} | {c.name} | {size(c.before)} | {size(c.after)} |" for c in changes[:MAX_ROWS]
        ]
        if len(changes) > MAX_ROWS:
            lines.append(f"| … | {len(changes) - MAX_ROWS} more in samples.json | | |")
    if history.rebalances:
        lines += [
            "",
            "Each round, and why the rebalancer moved (its prediction, in prompt tokens per second the "
            "storage tiers serve):",
            "",
            "| at | moved | moves | why |",
            "|---|---|---|---|",
        ]
        for record in history.rebalances.values():
            moves = ", ".join(f"{m.name} {size(m.from_quota)}→{size(m.to_quota)}" for m in record.moves) or MISSING
            lines.append(
                f"| {history.run_time(record.time)} | {size(record.moved_bytes)} | {moves} | {record.reason} |"
            )
    if not changes and not history.rebalances:
        lines += ["", "No quota moved: the operator recorded no rebalance (`status.lastRebalance` stayed empty)."]

    lines += [
        "",
        "## Hit ratio per tier (mean over the run / last)",
        "",
        "| deployment | " + " | ".join(TIERS) + " | HBM watermark (last) |",
        "|---|" + "---|" * (len(TIERS) + 1),
    ]
    any_hits = False
    for name in history.names:
        cells = []
        for tier in TIERS:
            mean, latest = history.hit_stats(name, tier)
            any_hits = any_hits or mean is not None
            cells.append(MISSING if mean is None else f"{ratio(mean)} / {ratio(latest)}")
        watermark = next(
            (s.watermark.get(name) for s in reversed(history.samples) if s.watermark.get(name) is not None), None
        )
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {ratio(watermark)} |")
    if not any_hits:
        lines += ["", "No hit ratios were reported: the deployments' `status.kv.hitRatio` stayed empty."]
    return "\n".join(lines) + "\n"


def _segments(samples: Sequence[Sample]) -> list[tuple[str, float, float]]:
    """(busy deployment, start, end) spans of the load schedule; a span lasts until the next sample."""
    spans: list[tuple[str, float, float]] = []
    for sample, following in zip(samples, [*samples[1:], None]):
        if sample.busy is None:
            continue
        end = following.time if following is not None else sample.time
        if spans and spans[-1][0] == sample.busy:
            spans[-1] = (sample.busy, spans[-1][1], end)
        else:
            spans.append((sample.busy, sample.time, end))
    return spans


def write_plot(history: History, path: str | os.PathLike[str]) -> None:
    plot_figure(history).savefig(path, dpi=100)


def plot_figure(history: History) -> Figure:
    """Three panels over the run's clock, legends beside them: the pool divided (quota per deployment, stacked
    against the capacity), what the quota buys (tokens per second each storage tier serves), and hit ratios
    (all tiers, and the storage tier's share). Busy spans are shaded in the busy deployment's colour, quota
    changes drawn as dotted lines."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    figure = Figure(figsize=(13, 10), layout="constrained")
    quota_axes, served_axes, hit_axes = figure.subplots(3, 1, sharex=True, height_ratios=(1, 1, 1.1))
    pool = history.last.pool if history.last else None
    every = f", re-divided every {clock_text(pool.interval)}" if pool is not None and pool.interval else ""
    figure.suptitle(
        f"kvtier demo: three deployments share one storage pool{every} "
        f"({clock_text(history.duration)} of wall-clock time, simulated at {history.speed:g}x)"
    )
    colours = {name: f"C{index}" for index, name in enumerate(history.names)}
    times = [s.time for s in history.samples]
    for axes in (quota_axes, served_axes, hit_axes):
        for name, start, end in _segments(history.samples):
            if axes is quota_axes:  # a strip above the stack, named, where the stack cannot hide it
                axes.axvspan(
                    start, max(end, start + 1), ymin=0.91, ymax=0.99, color=colours.get(name, "grey"), alpha=0.35, lw=0
                )
                if end - start >= MIN_SPAN_SECONDS:
                    axes.text(
                        (start + end) / 2,
                        0.95,
                        f"{name} busy",
                        transform=axes.get_xaxis_transform(),
                        ha="center",
                        va="center",
                        fontsize="small",
                    )
            else:
                axes.axvspan(start, max(end, start + 1), color=colours.get(name, "grey"), alpha=0.1, lw=0)
        for change in history.quota_changes():
            axes.axvline(change.time, color="dimgrey", lw=0.7, ls=":", zorder=3)
        axes.grid(alpha=0.3)
    context = [
        Patch(facecolor="grey", alpha=0.3, label="the load's busy deployment\n(shaded in its colour)"),
        Line2D([], [], color="dimgrey", lw=0.8, ls=":", label="a quota change\n(a rebalance round)"),
    ]

    stacked = [
        [gib((s.quota.get(name) or 0) * (s.replicas.get(name) or 1)) for s in history.samples] for name in history.names
    ]
    if times:  # step="post" stacks each value until the next sample, as the quota held
        quota_axes.stackplot(
            [*times, times[-1] + 1],
            [[*row, row[-1]] for row in stacked],
            labels=history.names,
            step="post",
            colors=[colours[name] for name in history.names],
            alpha=0.85,
        )
    if pool is not None and pool.capacity:
        quota_axes.axhline(gib(pool.capacity), color="black", lw=1, ls="--", label="pool capacity")
    quota_axes.set_title(
        "Where the pool's storage goes: each deployment's quota x replicas, stacked", loc="left", fontsize="medium"
    )
    quota_axes.set_ylabel("GiB")
    heights = [sum(column) for column in zip(*stacked)]
    if pool is not None and pool.capacity:
        heights.append(gib(pool.capacity))
    top = max(heights, default=1.0) or 1.0
    quota_axes.set_ylim(0, top * 1.15)
    handles, _ = quota_axes.get_legend_handles_labels()
    quota_axes.legend(handles=[*handles, *context], loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")

    plotted = False
    for name in history.names:
        served = [v / 1000 if (v := s.storage_hit_rate(name)) is not None else float("nan") for s in history.samples]
        if any(v == v for v in served):
            served_axes.plot(times, served, color=colours[name], lw=2, label=name)
            plotted = True
    served_axes.set_title(
        "What the quota buys: prompt tokens per second served from each deployment's storage "
        "tier (storage hit ratio x prompt tokens/s)",
        loc="left",
        fontsize="medium",
    )
    served_axes.set_ylabel("thousand tokens/s")
    served_axes.set_ylim(bottom=0)
    if plotted:
        served_axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    else:
        served_axes.text(
            0.5,
            0.5,
            "no rates reported (status.kv.promptTokensPerSecond is empty)",
            ha="center",
            va="center",
            transform=served_axes.transAxes,
            color="grey",
        )

    plotted = False
    for name in history.names:
        values = [
            v if (v := s.hit_ratio.get(name, {}).get("total")) is not None else float("nan") for s in history.samples
        ]
        if any(v == v for v in values):
            hit_axes.plot(times, values, color=colours[name], label=f"{name}, all tiers", lw=2)
            storage = [
                v if (v := s.hit_ratio.get(name, {}).get("storage")) is not None else float("nan")
                for s in history.samples
            ]
            hit_axes.plot(times, storage, color=colours[name], ls="--", lw=1.2, label=f"{name}, storage tier")
            plotted = True
    hit_axes.set_title(
        "Share of prompt tokens served from cache. A deployment turning busy sends more distinct "
        "prompts than HBM and CPU hold,\nso its total (solid) falls: the load changed, not its quota. "
        "Its storage tier's share (dashed) is what grows as quota moves to it.",
        loc="left",
        fontsize="medium",
    )
    if plotted:
        hit_axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    else:
        hit_axes.text(
            0.5,
            0.5,
            "no hit ratios reported (status.kv.hitRatio is empty)",
            ha="center",
            va="center",
            transform=hit_axes.transAxes,
            color="grey",
        )
    hit_axes.set_ylim(0, 1)
    hit_axes.yaxis.set_major_formatter("{x:.0%}")
    hit_axes.set_ylabel("hit ratio")
    hit_axes.set_xlabel("seconds since every replica was Ready (wall clock)")
    return figure
