"""What kvtier renders itself into the vLLM container, so `engine.args` and `engine.env` must not set it."""

from __future__ import annotations


def _owned_flags_pattern(long_flags: tuple[str, ...], short_flags: tuple[str, ...] = ()) -> str:
    """A regex matching any spelling vLLM's parser accepts (`--a-b`, `--a_b`, `--a-b=x`, `--a-b x`)."""
    names = [f"--{flag.replace('-', '[-_]')}" for flag in long_flags] + [f"-{flag}" for flag in short_flags]
    return rf"^({'|'.join(names)})([= ].*)?$"


#: vLLM flags the operator renders in every mode.
ALWAYS_OWNED_FLAGS = _owned_flags_pattern(
    (
        "port",
        "host",
        "model",
        "served-model-name",
        "tensor-parallel-size",
        "gpu-memory-utilization",
        "device-memory-utilization",  # vLLM 0.33's alias of --gpu-memory-utilization
        "max-model-len",
    ),
    ("tp",),
)
#: vLLM flags the operator renders when a KV connector is in use (mode other than None).
KV_OWNED_FLAGS = _owned_flags_pattern(("kv-transfer-config", "kv-offloading-size", "kv-offloading-backend"))
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
# Rules read the mode without relying on the API server's defaulting (absent means LMCacheMP).
