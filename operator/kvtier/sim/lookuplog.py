"""LMCache's lookup-hash log: rotating JSONL files of every lookup's chunk hashes (the writer side).

With ``--lookup-hash-log-dir DIR`` an LMCache 0.5.6 MP server writes one JSON object a line to
``DIR/lookup_hashes_<YYYYmmdd_HHMMSS>_<NNNNNN>.jsonl`` (the time the file was opened, UTC here,
and a per-process sequence number). Fields, in this order: ``timestamp`` (unix seconds, float),
``request_id``, ``model_name``, ``chunk_size`` (tokens per chunk), ``seq_len`` (tokens looked
up), ``dtypes``, ``shapes`` (of the KV cache; decorative here) and ``chunk_hashes`` (``0x`` and 64
hex digits, prefix-chained: a hash stands for its chunk and every chunk before it). The conformance
tier checks these fields and spellings against a real server's log.

A new file starts when the current one is older than ``rotation_interval`` seconds or a line
would push it past ``max_bytes``; then the oldest files beyond ``max_files`` are deleted.
``max_bytes = 0`` or ``max_files = 0`` switch that limit off. Lines are written whole and flushed
at once, so a reader only ever sees a partial line while a write is in progress.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from kvtier.probe.tail import FILE_PATTERN, FILE_PREFIX


def chunk_hash(block: int) -> str:
    """A simulated block id spelt as LMCache 0.5.6 spells its 256-bit (blake3) chunk hashes: ``0x`` and 64 hex digits."""
    return f"0x{block:064x}"


@dataclass(frozen=True)
class Rotation:
    """When to start a new file and how many to keep (LMCache's ``--lookup-hash-log-*`` flags)."""

    interval_seconds: float = 21600.0
    max_bytes: int = 100 << 20
    max_files: int = 10

    def __post_init__(self) -> None:
        if self.interval_seconds <= 0 or self.max_bytes < 0 or self.max_files < 0:
            raise ValueError("rotation interval must be > 0, max size and max files >= 0")


class LookupHashLog:
    """Writes lookups to rotating files in ``directory`` (created if missing)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        rotation: Rotation = Rotation(),
        *,
        dtypes: Sequence[str] = ("bfloat16",),
        shapes: Sequence[Sequence[int]] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.rotation = rotation
        self.dtypes = list(dtypes)
        self.shapes = [list(shape) for shape in shapes]
        self._clock = clock
        self._file: IO[str] | None = None
        self._opened_at = 0.0
        self._size = 0
        self._sequence = 0

    def write(
        self, request_id: str, model_name: str, chunk_size: int, seq_len: int, chunk_hashes: Sequence[str]
    ) -> None:
        """Append one lookup."""
        now = self._clock()
        record = {
            "timestamp": now,
            "request_id": request_id,
            "model_name": model_name,
            "chunk_size": chunk_size,
            "seq_len": seq_len,
            "dtypes": self.dtypes,
            "shapes": self.shapes,
            "chunk_hashes": list(chunk_hashes),
        }
        line = json.dumps(record, separators=(",", ":")) + "\n"
        size = len(line.encode())
        rotation = self.rotation
        if (
            self._file is None
            or now - self._opened_at >= rotation.interval_seconds
            or (rotation.max_bytes and self._size and self._size + size > rotation.max_bytes)
        ):
            self._rotate(now)
        assert self._file is not None
        self._file.write(line)
        self._file.flush()
        self._size += size

    def files(self) -> list[Path]:
        """The log files in the directory, oldest first."""
        return sorted(path for path in self.directory.iterdir() if FILE_PATTERN.match(path.name))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _rotate(self, now: float) -> None:
        self.close()
        stamp = time.strftime("%Y%m%d_%H%M%S", time.gmtime(now))
        path = self.directory / f"{FILE_PREFIX}{stamp}_{self._sequence:06d}.jsonl"
        self._sequence += 1
        self._file = open(path, "a", encoding="utf-8")
        self._opened_at = now
        self._size = 0
        if self.rotation.max_files:
            for old in self.files()[: -self.rotation.max_files]:
                old.unlink(missing_ok=True)
