"""The demo's terminal view: a live `rich` screen, or one plain line at a time when not on a terminal.

Pure: a :class:`~kvtier.demo.observe.Snapshot` and a :class:`Clock` in, a renderable or a string
out. A value the operator has not reported (yet) is shown as an em dash.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from kvtier.api.units import GIB, format_duration
from kvtier.demo.observe import TIERS, DeploymentView, PoolView, Snapshot, epoch_seconds

MISSING = "—"
#: Events shown under the table.
EVENT_LINES = 6


@dataclass(frozen=True)
class Clock:
    """Where the run is: starting (waiting for Ready), running (the measured part), or stopping."""

    stage: str
    elapsed: float
    """Seconds of the stage so far."""
    duration: float
    speed: float
    busy: str | None = None
    """The deployment the load schedule makes busy now."""
    hint: str | None = None
    """A line at the bottom (how to look at the cluster while it runs)."""
    origin: float | None = None
    """Wall-clock time (seconds since the epoch) of the stage's 0, to show the operator's timestamps on this clock."""

    def at(self, timestamp: str) -> str:
        """An operator timestamp as seconds on this clock (`14s`, `−3s` before it began), like the progress."""
        epoch = epoch_seconds(timestamp)
        if epoch is None or self.origin is None:
            return timestamp[11:19] or MISSING
        offset = epoch - self.origin
        return clock_text(offset) if offset >= 0 else f"−{clock_text(-offset)}"


def size(value: int | None) -> str:
    """Bytes as Gi (or Ti), one decimal only when needed."""
    if value is None:
        return MISSING
    if value == 0:
        return "0"
    for unit, scale in (("Ti", 1 << 40), ("Gi", GIB), ("Mi", 1 << 20)):
        if value >= scale or unit == "Mi":
            amount = value / scale
            return f"{amount:.0f}{unit}" if abs(amount - round(amount)) < 0.05 else f"{amount:.1f}{unit}"
    return MISSING  # pragma: no cover


def ratio(value: float | None) -> str:
    return MISSING if value is None else f"{value:.1%}"


def seconds(value: float | None) -> str:
    if value is None:
        return MISSING
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"


def clock_text(value: float) -> str:
    return format_duration(max(0, round(value)))


def replicas(deployment: DeploymentView) -> str:
    if deployment.desired is None:
        return MISSING
    ready = MISSING if deployment.ready is None else str(deployment.ready)
    return f"{ready}/{deployment.desired}"


def quota_range(deployment: DeploymentView) -> str:
    if deployment.min is None and deployment.max is None:
        return MISSING
    return f"{size(deployment.min)}–{size(deployment.max)}"


def pool_line(pool: PoolView | None) -> str:
    if pool is None:
        return f"pool {MISSING} (not created yet)"
    kind = f"{pool.storage}, " if pool.storage else ""
    every = f" every {clock_text(pool.interval)}" if pool.interval is not None else ""
    return (
        f"pool {pool.name} ({kind}{pool.policy or MISSING}{every}): capacity {size(pool.capacity)}, "
        f"allocated {size(pool.allocated)}, available {size(pool.available)}"
    )


def rebalance_line(pool: PoolView | None, clock: Clock) -> str:
    last = pool.last_rebalance if pool is not None else None
    if last is None:
        return f"last rebalance: {MISSING}"
    moves = ", ".join(f"{m.name} {size(m.from_quota)}→{size(m.to_quota)}" for m in last.moves) or "no moves"
    dry = " (dry run)" if last.dry_run else ""
    return f"last rebalance at {clock.at(last.time)}{dry}: moved {size(last.moved_bytes)}: {moves} ({last.reason})"


def deployment_table(snapshot: Snapshot) -> Table:
    table = Table(expand=False, header_style="bold", pad_edge=False)
    table.add_column("deployment")
    table.add_column("ready", justify="right")
    table.add_column("watermark", justify="right")
    for tier in TIERS:
        table.add_column(f"hit {tier}", justify="right")
    table.add_column("TTFT p50", justify="right")
    table.add_column("quota/replica", justify="right")
    table.add_column("min–max", justify="right")
    table.add_column("used", justify="right")
    for d in snapshot.deployments:
        style = "bold green" if d.is_ready else "yellow"
        table.add_row(
            Text(d.name, style="bold"),
            Text(replicas(d), style=style),
            ratio(d.watermark),
            *(Text(ratio(d.hit(tier)), style="bold" if tier == "total" else "") for tier in TIERS),
            seconds(d.ttft_p50),
            Text(size(d.quota), style="bold cyan"),
            quota_range(d),
            size(d.used),
        )
    if not snapshot.deployments:
        table.add_row(Text("(no deployments yet)", style="dim"), *[""] * 10)
    return table


def events_table(snapshot: Snapshot, clock: Clock, lines: int = EVENT_LINES) -> Table:
    table = Table.grid(padding=(0, 1))
    for _ in range(4):
        table.add_column()
    shown = snapshot.events[-lines:]
    for event in shown:
        style = "bold magenta" if event.is_rebalance else ("red" if event.type == "Warning" else "dim")
        table.add_row(
            Text(clock.at(event.time), style="dim"),
            Text(f"{event.kind}/{event.name}"),
            Text(event.reason, style=style),
            Text(event.message, overflow="ellipsis", no_wrap=True),
        )
    if not shown:
        table.add_row(Text(MISSING, style="dim"), "", "", "")
    return table


def progress_row(clock: Clock) -> Table:
    row = Table.grid(padding=(0, 1))
    row.add_column(width=9)
    row.add_column(width=32)
    row.add_column()
    if clock.stage == "running":
        bar = ProgressBar(total=clock.duration, completed=min(clock.elapsed, clock.duration), width=32)
        simulated = clock.elapsed * clock.speed
        busy = f"   busy now: {clock.busy}" if clock.busy else ""
        row.add_row(
            Text("running", style="bold green"),
            bar,
            Text(
                f"{clock_text(clock.elapsed)} / {clock_text(clock.duration)}   "
                f"simulated {clock_text(simulated)} ({clock.speed:g}x){busy}"
            ),
        )
    else:
        bar = ProgressBar(total=None, width=32)
        row.add_row(
            Text(clock.stage, style="bold yellow"),
            bar,
            Text(
                f"{clock_text(clock.elapsed)}: waiting for the deployments' replicas to be Ready"
                if clock.stage == "starting"
                else clock_text(clock.elapsed)
            ),
        )
    return row


def render(snapshot: Snapshot, clock: Clock) -> RenderableType:
    """The live screen."""
    parts: list[RenderableType] = [
        Text("kvtier demo: three deployments share one KV storage pool on an embedded cluster", style="bold"),
        progress_row(clock),
        Text(pool_line(snapshot.pool)),
        Text(
            rebalance_line(snapshot.pool, clock),
            style="magenta" if snapshot.pool and snapshot.pool.last_rebalance else "dim",
        ),
        deployment_table(snapshot),
        Text("events", style="bold"),
        events_table(snapshot, clock),
    ]
    if clock.hint:
        parts.append(Text(clock.hint, style="dim"))
    return Group(*parts)


def plain_line(snapshot: Snapshot, clock: Clock) -> str:
    """One line of progress for a log or a pipe."""
    if clock.stage == "running":
        head = f"[{clock_text(clock.elapsed):>6} / {clock_text(clock.duration)}]"
    else:
        head = f"[{clock.stage} {clock_text(clock.elapsed)}]"
    pool = snapshot.pool
    parts = [head, f"pool {size(pool.allocated) if pool else MISSING}/{size(pool.capacity) if pool else MISSING}"]
    for d in snapshot.deployments:
        parts.append(
            f"{d.name} {replicas(d)} quota {size(d.quota)} wm {ratio(d.watermark)} hit {ratio(d.hit('total'))}"
        )
    if clock.stage == "running" and clock.busy:
        parts.append(f"busy {clock.busy}")
    rebalances = sum(event.is_rebalance for event in snapshot.events)
    parts.append(f"rebalance events {rebalances}")
    return " | ".join(parts)
