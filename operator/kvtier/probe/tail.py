"""Following LMCache's lookup-hash log files as they grow, rotate and disappear.

:meth:`LogTailer.poll` yields every complete line written since the last poll, oldest file
first. Per file it remembers the inode and the offset of the first unread byte:

- a new file is read from its start; a deleted file is forgotten; a file whose inode changed
  or that shrank below the offset (replaced or truncated) is read again from its start;
- a trailing line without its newline waits for the next poll, except in a file that is no
  longer the newest (the writer has moved on, so the tail is final and is yielded as is);
- a line longer than ``max_line_bytes`` yields only its first ``max_line_bytes`` (which will not
  parse) and the rest is skipped, so memory stays bounded whatever is in the files.

A new tailer (a restarted probe) reads every retained file from the start: the probe rebuilds
its window from the retained history instead of starting cold, and counts nothing twice
because its in-memory state started empty.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: The log's file names (``<prefix><YYYYmmdd_HHMMSS>_<NNNNNN>.jsonl``); sorting names sorts files by age.
FILE_PREFIX = "lookup_hashes_"
FILE_PATTERN = re.compile(r"^lookup_hashes_\d{8}_\d{6}_\d{6}\.jsonl$")
#: A line's fields, in LMCache 0.5.6's order (kvsim's writer, :mod:`kvtier.sim.lookuplog`, follows them).
FIELDS = ("timestamp", "request_id", "model_name", "chunk_size", "seq_len", "dtypes", "shapes", "chunk_hashes")


@dataclass
class _FileState:
    inode: int
    offset: int = 0
    #: Inside a line longer than max_line_bytes whose start was already yielded.
    skipping: bool = False


class LogTailer:
    """Yields the new lines of the lookup-hash log files in ``directory``."""

    def __init__(self, directory: str | os.PathLike[str], max_line_bytes: int = 4 << 20) -> None:
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be >= 1")
        self.directory = Path(directory)
        self.max_line_bytes = max_line_bytes
        self._files: dict[str, _FileState] = {}

    @property
    def files(self) -> list[str]:
        """Names of the files being followed."""
        return sorted(self._files)

    def poll(self) -> Iterator[bytes]:
        """Every complete line added since the last poll, in file then line order (without newlines)."""
        try:
            names = sorted(name for name in os.listdir(self.directory) if FILE_PATTERN.match(name))
        except (FileNotFoundError, NotADirectoryError):
            names = []
        for gone in set(self._files).difference(names):
            del self._files[gone]
        for index, name in enumerate(names):
            yield from self._read(name, final=index < len(names) - 1)

    def _read(self, name: str, final: bool) -> Iterator[bytes]:
        try:
            stream = open(self.directory / name, "rb")
        except (FileNotFoundError, IsADirectoryError, PermissionError):
            return
        with stream:
            stat = os.fstat(stream.fileno())
            state = self._files.get(name)
            if state is None or state.inode != stat.st_ino or stat.st_size < state.offset:
                state = self._files[name] = _FileState(stat.st_ino)
            limit = self.max_line_bytes
            while True:
                stream.seek(state.offset)
                block = stream.read(limit)
                if not block:
                    return
                end = block.rfind(b"\n")
                if end >= 0:
                    lines = block[:end].split(b"\n")
                    state.offset += end + 1
                elif len(block) == limit:
                    # A line longer than the limit: its start once, then skip to its end.
                    lines = [] if state.skipping else [block]
                    state.offset += len(block)
                    state.skipping = True
                    yield from lines
                    continue
                elif final:
                    lines = [block]
                    state.offset += len(block)
                else:
                    return  # a line being written
                if state.skipping:
                    lines = lines[1:]
                    state.skipping = False
                yield from lines


@dataclass(frozen=True, slots=True)
class Lookup:
    """The fields of a lookup-hash log line the probe uses."""

    timestamp: float
    request_id: str
    chunk_hashes: list[str]


def parse_lookup(line: bytes) -> Lookup | None:
    """A log line as a :class:`Lookup`, or None when it is not one (garbage)."""
    try:
        record = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict):
        return None
    timestamp, request_id, hashes = record.get("timestamp"), record.get("request_id"), record.get("chunk_hashes")
    if type(timestamp) not in (int, float) or not math.isfinite(timestamp):
        return None
    if not isinstance(request_id, str) or not isinstance(hashes, list):
        return None
    if not all(isinstance(value, str) for value in hashes):
        return None
    return Lookup(float(timestamp), request_id, hashes)
