"""Simulated engines: the same pod, with kvsim standing in for vLLM and LMCache (kind, demos without GPUs).

With `RenderOptions.simulated_engine_image` (`kvtier run --simulated-engine-image IMAGE`, the kvtier
image) a rendered pod keeps its shape (containers, ports, probes, volumes, resources, readiness gate)
but runs kvsim: the `vllm` container runs `kvtier sim pod --vllm 'vllm serve ...' --lmcache
'lmcache server ...'`, one kvsim engine serving vLLM's face and the LMCache MP server's (HTTP API
with `/quota`, metrics, lookup-hash log) on the pod's network, exactly as `kvtier.sim.pods` does
for the embedded cluster's pods. The `lmcache` container idles (its probes reach the kvsim engine
through the shared pod network); the `kvtier-probe` sidecar is the real probe, reading the lookup-hash
log from the shared emptyDir, which the `vllm` container now mounts too. Init containers, which prepare
the real storage tier (pre-size LMCache's device file, wipe the disk tier), are dropped: kvsim keeps its
tiers in memory, and the volume (a kind hostPath directory, created by the kubelet as root) stays
untouched by the non-root kvtier image.
"""

from __future__ import annotations

import copy
import shlex
from dataclasses import replace
from typing import Any

from kvtier.contract import LMCACHE_CONTAINER, VLLM_CONTAINER
from kvtier.render.options import RenderOptions

SIM_COMMAND = ["kvtier", "sim", "pod"]
#: The idle container ends at once on SIGTERM (a bare `sleep` as PID 1 would ignore it).
IDLE = ["sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]


def _words(container: dict[str, Any]) -> str:
    return shlex.join([*(container.get("command") or []), *(container.get("args") or [])])


def simulate_pod_spec(spec: dict[str, Any], image: str) -> dict[str, Any]:
    """A copy of a rendered pod spec whose engines run under kvsim in `image` (see the module docstring)."""
    spec = copy.deepcopy(spec)
    containers = {container["name"]: container for container in spec["containers"]}
    vllm, lmcache = containers[VLLM_CONTAINER], containers.get(LMCACHE_CONTAINER)
    args = ["--vllm", _words(vllm)]
    if lmcache is not None:
        args += ["--lmcache", _words(lmcache)]
        known = {mount["name"] for mount in vllm.get("volumeMounts", [])}
        shared = [
            dict(mount, readOnly=False)
            for mount in lmcache.get("volumeMounts", [])
            if mount["name"] not in known and "emptyDir" in _volume(spec, mount["name"])
        ]
        if shared:
            vllm["volumeMounts"] = [*vllm.get("volumeMounts", []), *shared]
        lmcache.update(image=image, command=list(IDLE))
        lmcache.pop("args", None)
    vllm.update(image=image, command=list(SIM_COMMAND), args=args)
    spec.pop("initContainers", None)
    return spec


def _volume(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next((volume for volume in spec.get("volumes", []) if volume["name"] == name), {})


MIB = 2**20


def simulated_options(options: RenderOptions, image: str) -> RenderOptions:
    """`options` for simulated engines from `image`: kvsim needs none of LMCache's CPU and memory overhead,
    nor NCCL's `/dev/shm`, so pods fit a laptop's kind node (a fit check uses the same options)."""
    return replace(
        options,
        simulated_engine_image=image,
        lmcache_cpu="100m",
        lmcache_memory_overhead=128 * MIB,
        shm_per_rank=64 * MIB,
    )
