"""The ``kvtier probe`` options, importable without the probe's dependencies (the CLI reads the defaults)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvtier.probe.service import Probe


@dataclass(frozen=True)
class ProbeOptions:
    """The ``kvtier probe`` options (field names are the CLI's option names)."""

    log_dir: str
    host: str = "0.0.0.0"
    port: int = 9400
    chunk_bytes: int = 0
    max_blocks: int = 1 << 18
    window: float = 1800.0
    tick: float = 15.0
    buckets_per_octave: int = 2
    poll_interval: float = 1.0

    def build(self) -> Probe:
        from kvtier.probe.demand import DemandProbe
        from kvtier.probe.service import Probe

        demand = DemandProbe(
            self.max_blocks, chunk_bytes=self.chunk_bytes, window_seconds=self.window, tick_seconds=self.tick,
            buckets_per_octave=self.buckets_per_octave,
        )
        return Probe(self.log_dir, demand, poll_seconds=self.poll_interval)
