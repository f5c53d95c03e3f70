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
from typing import Any

from kvtier.api.units import gib
from kvtier.demo.observe import TIERS, EventView, Rebalance, Snapshot
from kvtier.demo.view import MISSING, clock_text, ratio, size

#: Rows of the quota-change table in the summary (all of them are in samples.json).
MAX_ROWS = 40


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

    def add(self, time: float, snapshot: Snapshot, busy: str | None = None) -> None:
        self.first = self.first or snapshot
        self.last = snapshot
        for d in snapshot.deployments:
            if d.name not in self.names:
                self.names.append(d.name)
        by_name = {d.name: d for d in snapshot.deployments}
        self.samples.append(Sample(
            time=time,
            quota={name: by_name[name].quota if name in by_name else None for name in self.names},
            watermark={name: by_name[name].watermark if name in by_name else None for name in self.names},
            hit_ratio={name: dict(by_name[name].hit_ratio) if name in by_name else {} for name in self.names},
            ready={name: by_name[name].ready if name in by_name else None for name in self.names},
            replicas={name: by_name[name].desired if name in by_name else None for name in self.names},
            busy=busy,
        ))
        record = snapshot.pool.last_rebalance if snapshot.pool else None
        if record is not None and record.time not in self.rebalances:
            self.rebalances[record.time] = record
        for event in snapshot.events:
            if event.is_rebalance:
                self.rebalance_events.setdefault((event.time, event.name, event.reason, event.message), event)

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


def summary_markdown(history: History, *, plot: str | None = "demo.png", interrupted: bool = False) -> str:
    last = history.last
    pool = last.pool if last else None
    lines = ["# kvtier demo: summary", ""]
    ran = f"{clock_text(history.duration)} of wall-clock time ({clock_text(history.duration * history.speed)} " \
          f"simulated at {history.speed:g}x)"
    lines.append(f"Ran {ran}{', interrupted by the user' if interrupted else ''}, "
                 f"{len(history.names)} deployments sharing one pool; a sample a second.")
    if pool is not None:
        lines += ["", f"Pool `{pool.name}` ({pool.storage or MISSING}, policy {pool.policy or MISSING}): capacity "
                      f"{size(pool.capacity)}, allocated {size(pool.allocated)} at the end."]
    if plot:
        lines += ["", f"![quota and hit ratio over time]({plot})"]

    lines += ["", "## Storage quota per deployment (per replica)", "",
              "| deployment | at start | at end | change | min | max | time as the busy one |",
              "|---|---|---|---|---|---|---|"]
    final = {d.name: d for d in (last.deployments if last else ())}
    for name in history.names:
        start, end = history.quota_at(name, last=False), history.quota_at(name, last=True)
        change = MISSING if start is None or end is None else (
            "unchanged" if start == end else f"{'+' if end > start else '−'}{size(abs(end - start))}")
        busy = sum(after.time - before.time for before, after in zip(history.samples, history.samples[1:])
                   if before.busy == name)
        d = final.get(name)
        lines.append(f"| {name} | {size(start)} | {size(end)} | {change} | {size(d.min if d else None)} | "
                     f"{size(d.max if d else None)} | {clock_text(busy)} |")

    changes = history.quota_changes()
    lines += ["", "## Rebalancing", ""]
    lines.append(f"{len(changes)} quota change{'s' if len(changes) != 1 else ''} observed, "
                 f"{len(history.rebalances)} rebalance round{'s' if len(history.rebalances) != 1 else ''} recorded in "
                 f"the pool's `status.lastRebalance`, {len(history.rebalance_events)} rebalance Event"
                 f"{'s' if len(history.rebalance_events) != 1 else ''}.")
    if changes:
        lines += ["", "| at | deployment | from | to |", "|---|---|---|---|"]
        lines += [f"| {clock_text(c.time)} | {c.name} | {size(c.before)} | {size(c.after)} |"
                  for c in changes[:MAX_ROWS]]
        if len(changes) > MAX_ROWS:
            lines.append(f"| … | {len(changes) - MAX_ROWS} more in samples.json | | |")
    if history.rebalances:
        lines += ["", "| time | moved | predicted gain | moves | reason |", "|---|---|---|---|---|"]
        for record in history.rebalances.values():
            gain = MISSING if record.predicted_gain is None else f"{record.predicted_gain:+.1%}"
            moves = ", ".join(f"{m.name} {size(m.from_quota)}→{size(m.to_quota)}" for m in record.moves) or MISSING
            lines.append(f"| {record.time} | {size(record.moved_bytes)} | {gain} | {moves} | {record.reason} |")
    if not changes and not history.rebalances:
        lines += ["", "No quota moved: the operator recorded no rebalance (`status.lastRebalance` stayed empty)."]

    lines += ["", "## Hit ratio per tier (mean over the run / last)", "",
              "| deployment | " + " | ".join(TIERS) + " | HBM watermark (last) |",
              "|---|" + "---|" * (len(TIERS) + 1)]
    any_hits = False
    for name in history.names:
        cells = []
        for tier in TIERS:
            mean, latest = history.hit_stats(name, tier)
            any_hits = any_hits or mean is not None
            cells.append(MISSING if mean is None else f"{ratio(mean)} / {ratio(latest)}")
        watermark = next((s.watermark.get(name) for s in reversed(history.samples)
                          if s.watermark.get(name) is not None), None)
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
    """Quota per deployment over time, stacked against the pool's capacity (top), and hit ratio over time
    (bottom); the load schedule's busy spans shaded in the busy deployment's colour."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 7), layout="constrained")
    quota_axes, hit_axes = figure.subplots(2, 1, sharex=True)
    figure.suptitle(f"kvtier demo: {clock_text(history.duration)} at {history.speed:g}x simulated time")
    colours = {name: f"C{index}" for index, name in enumerate(history.names)}
    times = [s.time for s in history.samples]
    for axes in (quota_axes, hit_axes):
        for name, start, end in _segments(history.samples):
            axes.axvspan(start, max(end, start + 1), color=colours.get(name, "grey"), alpha=0.08, lw=0)
        for change in history.quota_changes():
            axes.axvline(change.time, color="grey", lw=0.6, ls=":")
    stacked = [[gib((s.quota.get(name) or 0) * (s.replicas.get(name) or 1)) for s in history.samples]
               for name in history.names]
    if times:
        quota_axes.stackplot(times, stacked, labels=history.names, step="post",
                             colors=[colours[name] for name in history.names], alpha=0.85)
    pool = history.last.pool if history.last else None
    if pool is not None and pool.capacity:
        quota_axes.axhline(gib(pool.capacity), color="black", lw=1, ls="--", label="pool capacity")
    quota_axes.set_ylabel("quota x replicas (GiB), stacked")
    quota_axes.set_ylim(bottom=0)
    quota_axes.legend(loc="lower left", fontsize="small", ncols=4)
    quota_axes.grid(alpha=0.3)
    plotted = False
    for name in history.names:
        values = [v if (v := s.hit_ratio.get(name, {}).get("total")) is not None else float("nan")
                  for s in history.samples]
        if any(v == v for v in values):
            hit_axes.plot(times, values, color=colours[name], label=f"{name} total", lw=2)
            storage = [v if (v := s.hit_ratio.get(name, {}).get("storage")) is not None else float("nan")
                       for s in history.samples]
            hit_axes.plot(times, storage, color=colours[name], ls="--", lw=1, label=f"{name} storage tier")
            plotted = True
    if plotted:
        hit_axes.legend(loc="upper left", fontsize="small", ncols=2)
    else:
        hit_axes.text(0.5, 0.5, "no hit ratios reported (status.kv.hitRatio is empty)", ha="center", va="center",
                      transform=hit_axes.transAxes, color="grey")
    hit_axes.set_ylim(0, 1)
    hit_axes.set_ylabel("hit ratio")
    hit_axes.set_xlabel("wall-clock seconds since all replicas were Ready (shaded: the deployment the load makes busy)")
    hit_axes.grid(alpha=0.3)
    figure.savefig(path, dpi=100)
