"""The ``kvtier probe`` options and their command-line form, importable without the probe's dependencies.

The command line (``kvtier probe``) and the simulator (which starts the probe of a simulated pod
from its container's args) parse argv with the same :func:`command_options`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click

from kvtier.contract import PROBE_DEFAULT_PORT

if TYPE_CHECKING:
    from kvtier.probe.service import Probe


@dataclass(frozen=True)
class ProbeOptions:
    """The ``kvtier probe`` options (field names are the CLI's option names)."""

    log_dir: str
    host: str = "0.0.0.0"
    port: int = PROBE_DEFAULT_PORT
    chunk_bytes: int = 0
    max_blocks: int = 1 << 18
    window: float = 1800.0
    tick: float = 15.0
    buckets_per_octave: int = 2
    poll_interval: float = 1.0

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> ProbeOptions:
        """Parse ``kvtier probe`` arguments (without the program name); raises click.ClickException."""
        command = command_options(click.Command("probe"))
        return cls(**command.make_context("probe", list(argv)).params)

    def build(self) -> Probe:
        from kvtier.probe.demand import DemandProbe
        from kvtier.probe.service import Probe

        demand = DemandProbe(
            self.max_blocks,
            chunk_bytes=self.chunk_bytes,
            window_seconds=self.window,
            tick_seconds=self.tick,
            buckets_per_octave=self.buckets_per_octave,
        )
        return Probe(self.log_dir, demand, poll_seconds=self.poll_interval)


F = TypeVar("F", bound=Callable[..., Any])


def command_options(function: F) -> F:
    """Decorate a click command with the ``kvtier probe`` options (one keyword per :class:`ProbeOptions` field)."""
    decorators = [
        click.option(
            "--log-dir",
            required=True,
            type=click.Path(file_okay=False),
            help="Directory of the LMCache MP server's lookup-hash log.",
        ),
        click.option("--host", default=ProbeOptions.host, show_default=True),
        click.option(
            "--port", type=int, default=ProbeOptions.port, show_default=True, help="Serves /metrics and /health."
        ),
        click.option(
            "--chunk-bytes",
            type=click.IntRange(0),
            default=ProbeOptions.chunk_bytes,
            show_default=True,
            help="KV bytes of one chunk: adds the curve in bytes (0: chunks only).",
        ),
        click.option(
            "--max-blocks",
            type=click.IntRange(1),
            default=ProbeOptions.max_blocks,
            show_default=True,
            help="Chunks of LRU stack tracked: the curve is exact up to this capacity, memory bounded by it.",
        ),
        click.option(
            "--window",
            type=click.FloatRange(0),
            default=ProbeOptions.window,
            show_default=True,
            help="Half-life of an access's weight in seconds (0: never decay).",
        ),
        click.option(
            "--tick",
            type=click.FloatRange(0, min_open=True),
            default=ProbeOptions.tick,
            show_default=True,
            help="Seconds between decay steps.",
        ),
        click.option(
            "--buckets-per-octave",
            type=click.IntRange(1),
            default=ProbeOptions.buckets_per_octave,
            show_default=True,
            help="Histogram buckets per doubling of the stack distance.",
        ),
        click.option(
            "--poll-interval",
            type=click.FloatRange(0, min_open=True),
            default=ProbeOptions.poll_interval,
            show_default=True,
            help="Seconds between reads of the log directory.",
        ),
    ]
    for decorate in reversed(decorators):
        function = decorate(function)
    return function
