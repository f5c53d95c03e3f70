"""How much of a node one replica takes: the arithmetic behind the pod's resources and the fit check.

Per replica (all ranks of a replica run in one pod on one node):
- GPUs: `nvidia.com/gpu` = `tensorParallelSize`, requests = limits.
- `/dev/shm` (emptyDir, medium Memory): `shm_per_rank` x TP (2 GiB per rank by default). Pages written
  to a memory-backed emptyDir are charged to the pod's memory, so the vLLM container's memory covers it.
- `vllm` memory: engine (`engine.resources.requests.memory`, or `default_engine_memory`) + the
  in-process CPU tier (`cpu.size` x TP: LMCache in-process keeps one buffer per rank) + `/dev/shm`.
  The limit is the user's memory limit (at least the engine request) plus the same two terms.
- `lmcache` memory (LMCacheMP): L1 (`cpu.size`) + `lmcache_memory_overhead`; request = limit.
- `kvtier-probe`: `PROBE_MEMORY` (its window is bounded).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvtier.api.inferencedeployment import InferenceDeployment
from kvtier.api.units import format_quantity, quantity_value
from kvtier.render.options import RenderOptions

GPU_RESOURCE = "nvidia.com/gpu"
PROBE_MEMORY = 256 * 2**20
PROBE_MEMORY_LIMIT = 2**30
PROBE_CPU = "100m"


def quantity_bytes(value: int | str) -> int:
    """Any Kubernetes quantity as a whole number (bytes, or GPUs), rounded up."""
    return math.ceil(quantity_value(str(value)))


def millicores(value: int | str | None) -> int:
    return 0 if value is None else math.ceil(quantity_value(str(value)) * 1000)


@dataclass(frozen=True)
class PodSizing:
    gpus: int
    engine_memory: int
    """The engine's own memory request (the baseline)."""
    engine_memory_limit: int
    cpu_tier: int
    """In-process CPU tier in the vLLM container (0 in LMCacheMP mode: L1 lives in the lmcache container)."""
    shm: int
    lmcache_memory: int
    """The LMCache MP server's memory (0 unless LMCacheMP)."""
    probe_memory: int
    engine_cpu_millis: int
    lmcache_cpu_millis: int
    probe_cpu_millis: int

    @property
    def vllm_memory(self) -> int:
        return self.engine_memory + self.cpu_tier + self.shm

    @property
    def vllm_memory_limit(self) -> int:
        return self.engine_memory_limit + self.cpu_tier + self.shm

    @property
    def memory(self) -> int:
        """Memory the whole pod requests."""
        return self.vllm_memory + self.lmcache_memory + self.probe_memory

    @property
    def cpu_millis(self) -> int:
        return self.engine_cpu_millis + self.lmcache_cpu_millis + self.probe_cpu_millis

    def memory_breakdown(self) -> str:
        parts = [
            ("engine", self.engine_memory),
            ("in-process CPU tier", self.cpu_tier),
            ("/dev/shm", self.shm),
            ("LMCache server", self.lmcache_memory),
            ("probe", self.probe_memory),
        ]
        return " + ".join(f"{label} {format_quantity(value)}" for label, value in parts if value)


def pod_sizing(deployment: InferenceDeployment, options: RenderOptions, probe: bool = False) -> PodSizing:
    """Resources of one replica's pod; `probe` when the pod runs the `kvtier-probe` sidecar."""
    spec = deployment.spec
    resources = spec.engine.resources
    tp = spec.engine.tensor_parallel_size
    mp = spec.kv_cache.mode == "LMCacheMP"
    engine_memory = quantity_bytes(resources.requests.get("memory", options.default_engine_memory))
    return PodSizing(
        gpus=tp,
        engine_memory=engine_memory,
        engine_memory_limit=max(engine_memory, quantity_bytes(resources.limits.get("memory", engine_memory))),
        cpu_tier=0 if mp else spec.cpu_tier_memory_bytes,
        shm=options.shm_per_rank * tp,
        lmcache_memory=spec.cpu_tier_memory_bytes + options.lmcache_memory_overhead if mp else 0,
        probe_memory=PROBE_MEMORY if probe else 0,
        engine_cpu_millis=millicores(resources.requests.get("cpu")),
        lmcache_cpu_millis=millicores(options.lmcache_cpu) if mp else 0,
        probe_cpu_millis=millicores(PROBE_CPU) if probe else 0,
    )
