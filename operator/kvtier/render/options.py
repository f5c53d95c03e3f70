"""Operator-wide rendering settings: everything a pod needs that no InferenceDeployment carries."""

from __future__ import annotations

from dataclasses import dataclass

from kvtier import __version__
from kvtier.contract import PROBE_DEFAULT_PORT

GIB = 2**30


@dataclass(frozen=True)
class RenderOptions:
    """Settings the operator applies to every InferenceDeployment it renders.

    The image defaults are only defaults: override them (operator flags, Helm values) with the images
    you actually run. `lmcache_image` must contain LMCache 0.5.6's `lmcache server` and, for storage tiers,
    `lmcache-rust-raw-block-io` (the raw_block adapter's extension, which lmcache does not install);
    `probe_image` must contain this package's `kvtier probe`.
    """

    lmcache_image: str = "lmcache/vllm-openai:v0.5.6"
    """Image of the `lmcache` container (and of the init container that pre-sizes its device file)."""
    probe_image: str = f"ghcr.io/kvtier/kvtier-operator:{__version__}"
    """Image of the `kvtier-probe` sidecar."""
    python_hash_seed: str = "0"
    """PYTHONHASHSEED on every replica: the same seed everywhere keeps `builtin` cache keys stable."""
    vllm_port: int = 8000
    """vLLM's OpenAI API, `/health` and `/metrics`."""
    lmcache_port: int = 5555
    """The LMCache MP server's ZMQ port (vLLM's connector talks to it over localhost)."""
    lmcache_http_port: int = 8080
    """The LMCache MP server's HTTP API (`/quota`, `/healthcheck`) and its `/metrics` (0.5.6 serves them
    on one port and never opens `--prometheus-port`)."""
    probe_port: int = PROBE_DEFAULT_PORT
    """The probe's `/metrics`."""
    default_engine_memory: int = 32 * GIB
    """Engine memory request when `spec.engine.resources.requests.memory` is not set."""
    shm_per_rank: int = 2 * GIB
    """`/dev/shm` per TP rank (NCCL's intra-node buffers and vLLM's shared-memory queues)."""
    lmcache_memory_overhead: int = 4 * GIB
    """Memory of the LMCache MP server beyond its L1 (CUDA context, Python, raw-block metadata, I/O buffers)."""
    lmcache_cpu: str = "4"
    """CPU request of the LMCache MP server (hashing, eviction, L2 I/O submission)."""
    startup_seconds: int = 3600
    """How long vLLM may take to load its model before the startup probe gives up."""
    runtime_class_name: str | None = None
    """RuntimeClass of the pods (e.g. `nvidia` where the GPU Operator registers one), if the cluster needs it."""
    wipe_image: str = "docker.io/library/debian:bookworm-slim"
    """Image of the Jobs that wipe released static volumes: needs `sh`, util-linux (`blkdiscard`, `blockdev`)
    and coreutils `dd` and `find`."""
    pod_monitor: bool = False
    """Render a PodMonitor (set when the `monitoring.coreos.com` CRDs exist)."""
    simulated_engine_image: str | None = None
    """Run every engine under kvsim from this image (the kvtier image; kind and demos): see `render.simulate`."""
