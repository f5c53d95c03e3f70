"""The demo's simulated load: one trace whose busy phase each deployment reaches at a different time.

A cycle of the trace has three phases of ``phase_seconds`` (simulated time). In the first, requests
arrive fast and reuse a large set of long shared prefixes ("documents"): a working set several times
what HBM and the CPU tier hold, so the storage tier decides the hit ratio. In the other two, few
requests reuse a small set that the CPU tier holds on its own. Every deployment replays the same
file in a loop, shifted by a whole number of phases (``KVSIM_TIME_SHIFT``), so the busy deployment
changes every phase and a pool divided well follows it.

Pure and deterministic (seeded): the same settings write the same file.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass

#: Phases of one cycle; deployment i is busy in phase i (mod PHASES).
PHASES = 3
#: Block ids of the quiet phases' documents start here (the busy documents' below it).
_QUIET_BASE = 1_000_000
#: Unique (never reused) suffix blocks start here.
_SUFFIX_BASE = 10_000_000


@dataclass(frozen=True)
class Workload:
    """Shape of the phased load, in simulated seconds and blocks of ``block_tokens`` tokens."""

    phase_seconds: float = 200.0
    block_tokens: int = 256
    busy_rate: float = 3.0
    """Requests per simulated second in the busy phase."""
    quiet_rate: float = 0.5
    busy_documents: int = 160
    quiet_documents: int = 16
    document_blocks: int = 16
    """Blocks of a shared prefix (a document, a system prompt, a conversation so far)."""
    suffix_blocks: int = 2
    """Blocks of each request's own, never repeated, tail."""
    output_tokens: int = 64
    zipf: float = 0.8
    """Popularity skew of the documents (0: uniform)."""
    seed: int = 7

    @property
    def cycle_seconds(self) -> float:
        return PHASES * self.phase_seconds

    def time_shift(self, index: int) -> float:
        """``KVSIM_TIME_SHIFT`` that makes deployment ``index`` busy in phase ``index`` of every cycle.

        Negative: the replay starts inside the trace (earlier requests are skipped), and the loop
        restarts exactly one cycle later because the trace's last request is at ``cycle - 1``.
        """
        return -float((PHASES - index % PHASES) % PHASES) * self.phase_seconds

    def requests(self) -> Iterator[dict[str, object]]:
        """The trace records of one cycle (Mooncake format: ``timestamp`` in ms), in arrival order."""
        rng = random.Random(self.seed)
        suffix = _SUFFIX_BASE
        for phase in range(PHASES):
            busy = phase == 0
            rate = self.busy_rate if busy else self.quiet_rate
            count = self.busy_documents if busy else self.quiet_documents
            base = 0 if busy else _QUIET_BASE
            weights = [1.0 / (rank + 1) ** self.zipf for rank in range(count)]
            start, end = phase * self.phase_seconds, (phase + 1) * self.phase_seconds
            now = start + rng.expovariate(rate)
            while now < end - 1.0:
                document = rng.choices(range(count), weights)[0]
                prefix = [base + document * self.document_blocks + block + 1 for block in range(self.document_blocks)]
                tail = list(range(suffix, suffix + self.suffix_blocks))
                suffix += self.suffix_blocks
                yield self._record(now, prefix + tail)
                now += rng.expovariate(rate)
        # The cycle's last request at cycle - 1s: a looping replay then starts over exactly one cycle on.
        yield self._record(self.cycle_seconds - 1.0, list(range(suffix, suffix + self.suffix_blocks)))

    def _record(self, seconds: float, blocks: list[int]) -> dict[str, object]:
        return {
            "timestamp": round(seconds * 1000),
            "input_length": len(blocks) * self.block_tokens,
            "output_length": self.output_tokens,
            "hash_ids": blocks,
        }

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write one cycle as a Mooncake-format JSONL trace."""
        with open(path, "w", encoding="utf-8") as out:
            for record in self.requests():
                out.write(json.dumps(record, separators=(",", ":")) + "\n")
