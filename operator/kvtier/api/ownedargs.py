"""What kvtier renders itself into the vLLM container, so `engine.args` and `engine.env` must not set it.

vLLM's `serve` parser reads a flag in more spellings than its name: `--a-b` and `--a_b`, with its value after
`=` or a space in the same argument, a dotted key of it (`--kv-transfer-config.kv_role=...`), and, as argparse
with `allow_abbrev`, any prefix of it no other flag shares (`--gpu-memory-util` is `--gpu-memory-utilization`,
`-t` is `-tp`). kvtier refuses every prefix of a flag it owns: a prefix other flags share is refused by vLLM
itself as ambiguous, so the user loses nothing vLLM would have run (the conformance tier checks both against
the installed vLLM: every abbreviation vLLM accepts is refused, no other flag of vLLM's is).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class OwnedFlag:
    """A vLLM flag kvtier renders, and what to set instead."""

    flag: str
    """As vLLM registers it: `--gpu-memory-utilization`, `-tp`."""
    instead: str
    """Where the value comes from, as advice to the user."""

    @property
    def abbreviations(self) -> str:
        """A regex matching every strict prefix of the flag vLLM's parser would expand to it, in every spelling."""
        dashes, name = _dashes_and_name(self.flag)
        nested = ""
        for char in reversed(name[1:-1]):  # a strict prefix: never the whole name (the exact rule says that)
            nested = f"(?:{_spelling(char)}{nested})?"
        return rf"^{dashes}{_spelling(name[0])}{nested}{_VALUE}$"

    @property
    def abbreviation_message(self) -> str:
        return (
            f"args must not abbreviate {self.flag}: vLLM reads an unambiguous prefix of a flag as the flag; "
            f"{self.instead}"
        )


def _dashes_and_name(flag: str) -> tuple[str, str]:
    dashes = "--" if flag.startswith("--") else "-"
    return dashes, flag[len(dashes) :]


def _spelling(char: str) -> str:
    return "[-_]" if char == "-" else re.escape(char)


#: What may follow a flag's name in one argument: its value after `=` or a space, or a dotted key.
_VALUE = r"([.= ].*)?"

_USE_THE_PORT = "kvtier sets --port to the engine port the pod declares"
_USE_THE_HOST = "kvtier keeps vLLM listening on the pod's addresses"
#: vLLM flags the operator renders (or fixes) in every mode.
ALWAYS_OWNED = (
    OwnedFlag("--port", _USE_THE_PORT),
    OwnedFlag("--host", _USE_THE_HOST),
    OwnedFlag("--model", "set model.name"),
    OwnedFlag("--served-model-name", "set model.servedName"),
    OwnedFlag("--tensor-parallel-size", "set engine.tensorParallelSize"),
    OwnedFlag("-tp", "set engine.tensorParallelSize"),
    OwnedFlag("--gpu-memory-utilization", "set engine.gpuMemoryUtilization"),
    OwnedFlag("--device-memory-utilization", "set engine.gpuMemoryUtilization"),  # vLLM 0.33's alias
    OwnedFlag("--max-model-len", "set engine.maxModelLen"),
)
#: vLLM flags the operator renders when a KV connector is in use (mode other than None).
KV_OWNED = tuple(
    OwnedFlag(flag, "kvtier renders the KV connector for kvCache.mode")
    for flag in ("--kv-transfer-config", "--kv-offloading-size", "--kv-offloading-backend")
)


def _exact_pattern(owned: tuple[OwnedFlag, ...]) -> str:
    """A regex matching the flags themselves, in every spelling vLLM's parser accepts."""
    names = []
    for o in owned:
        dashes, name = _dashes_and_name(o.flag)
        names.append(dashes + "".join(_spelling(char) for char in name))
    return rf"^({'|'.join(names)}){_VALUE}$"


ALWAYS_OWNED_FLAGS = _exact_pattern(ALWAYS_OWNED)
KV_OWNED_FLAGS = _exact_pattern(KV_OWNED)
#: Environment the operator owns: the hash seed (cache keys must match across replicas and restarts).
OWNED_ENV = "PYTHONHASHSEED"
#: In-process mode renders LMCache's config file; LMCACHE_* variables would silently override it.
IN_PROCESS_OWNED_ENV_PREFIX = "LMCACHE_"

ARGS_ALWAYS_MESSAGE = (
    "args must not set --port, --host, --model, --served-model-name, --tensor-parallel-size, "
    "--gpu-memory-utilization or --max-model-len: use the spec's fields"
)
ARGS_KV_MESSAGE = (
    "args must not set --kv-transfer-config, --kv-offloading-size or --kv-offloading-backend: "
    "kvtier renders the KV connector for kvCache.mode"
)
ENV_HASHSEED_MESSAGE = "env must not set PYTHONHASHSEED: kvtier sets one seed on every replica so cache keys match"
ENV_LMCACHE_MESSAGE = "env must not set LMCACHE_* in LMCacheInProcess mode: kvtier renders LMCache's config file"


def owned_flag_problem(arg: str, *, connector: bool) -> str | None:
    """Why `arg` may not be in `engine.args` (the message of the rule it breaks), or None."""
    if re.search(ALWAYS_OWNED_FLAGS, arg):
        return ARGS_ALWAYS_MESSAGE
    if connector and re.search(KV_OWNED_FLAGS, arg):
        return ARGS_KV_MESSAGE
    for owned in ALWAYS_OWNED + (KV_OWNED if connector else ()):
        if re.search(owned.abbreviations, arg):
            return owned.abbreviation_message
    return None
