"""Will a replica's pod fit on any node? Asked before anything is created, answered with reasons.

A replica fits when one node (matching `engine.nodeSelector`) offers, as allocatable, at least the
pod's GPUs (`tensorParallelSize`), memory (engine + CPU tier + `/dev/shm` + LMCache server + probe,
see `sizing`) and CPU. Allocatable is the node's whole capacity for pods; what other pods already
use is the scheduler's business: this check catches specs that can never fit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvtier.api.inferencedeployment import InferenceDeployment
from kvtier.api.kvpool import KVPool
from kvtier.api.units import format_quantity
from kvtier.render.options import RenderOptions
from kvtier.render.sizing import GPU_RESOURCE, PodSizing, millicores, quantity_bytes
from kvtier.render.workload import pod_plan


@dataclass(frozen=True)
class NodeResources:
    """What one node offers pods (`status.allocatable`)."""

    name: str
    memory: int
    gpus: int
    cpu_millis: int
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_node(cls, node: Mapping[str, Any]) -> NodeResources:
        """From a Node object as the API returns it."""
        allocatable = node.get("status", {}).get("allocatable", {})
        metadata = node.get("metadata", {})
        return cls(
            name=metadata.get("name", ""),
            memory=quantity_bytes(allocatable.get("memory", 0)),
            gpus=quantity_bytes(allocatable.get(GPU_RESOURCE, 0)),
            cpu_millis=millicores(allocatable.get("cpu", 0)),
            labels=metadata.get("labels") or {},
        )

    def fits(self, sizing: PodSizing) -> bool:
        return self.gpus >= sizing.gpus and self.memory >= sizing.memory and self.cpu_millis >= sizing.cpu_millis


def _cores(millis: int) -> str:
    return f"{millis / 1000:g}"


def check_fit(
    deployment: InferenceDeployment,
    nodes: Iterable[NodeResources | Mapping[str, Any]],
    options: RenderOptions | None = None,
    pool: KVPool | None = None,
) -> list[str]:
    """Why no node can run one replica (empty: some node can). `nodes` are `NodeResources` or Node dicts.

    `pool` is the deployment's KVPool when known (it decides whether the probe sidecar runs).
    Raises `RenderError` like `render_deployment` for a spec that cannot be rendered at all.
    """
    sizing = pod_plan(deployment, pool, options or RenderOptions()).sizing
    selector = deployment.spec.engine.node_selector
    candidates = [
        node
        for node in (n if isinstance(n, NodeResources) else NodeResources.from_node(n) for n in nodes)
        if all(node.labels.get(key) == value for key, value in selector.items())
    ]
    if not candidates:
        wanted = f" with labels {dict(selector)}" if selector else ""
        return [f"no node{wanted} in the cluster"]
    fitting = [node for node in candidates if node.fits(sizing)]
    if fitting:
        return _whole_cluster_reasons(deployment, sizing, fitting)
    reasons = []
    with_gpus = [node for node in candidates if node.gpus >= sizing.gpus]
    if not with_gpus:
        most = max(node.gpus for node in candidates)
        reasons.append(
            f"a replica needs {sizing.gpus} GPUs on one node (tensorParallelSize), the most any node offers is {most}"
        )
    scope, pool_of_nodes = ("node with enough GPUs", with_gpus) if with_gpus else ("node", candidates)
    most_memory = max(node.memory for node in pool_of_nodes)
    if most_memory < sizing.memory:
        reasons.append(
            f"a replica needs {format_quantity(sizing.memory)} of memory ({sizing.memory_breakdown()}), "
            f"the most any {scope} offers is {format_quantity(most_memory)}"
        )
    most_cpu = max(node.cpu_millis for node in pool_of_nodes)
    if most_cpu < sizing.cpu_millis:
        reasons.append(
            f"a replica needs {_cores(sizing.cpu_millis)} CPUs, the most any {scope} offers is {_cores(most_cpu)}"
        )
    return reasons or [
        f"no single node offers {sizing.gpus} GPUs, {format_quantity(sizing.memory)} of memory "
        f"and {_cores(sizing.cpu_millis)} CPUs at once"
    ]


def _replicas_on(node: NodeResources, sizing: PodSizing) -> int:
    """How many replicas the node's allocatable holds at once."""
    limits = [
        node.memory // sizing.memory if sizing.memory else None,
        node.cpu_millis // sizing.cpu_millis if sizing.cpu_millis else None,
        node.gpus // sizing.gpus if sizing.gpus else None,
    ]
    known = [limit for limit in limits if limit is not None]
    return min(known) if known else 1 << 30


def _whole_cluster_reasons(
    deployment: InferenceDeployment, sizing: PodSizing, fitting: list[NodeResources]
) -> list[str]:
    """Why a spec whose replica fits one node still cannot run: a tensor-parallel size that strands GPUs
    on every node, or more replicas than all the nodes hold at once (before any pod is created)."""
    reasons = []
    tp = deployment.spec.engine.tensor_parallel_size
    if sizing.gpus and not any(node.gpus % tp == 0 for node in fitting):
        counts = sorted({node.gpus for node in fitting})
        reasons.append(
            f"spec.engine.tensorParallelSize {tp} does not divide the GPUs of any node that fits a "
            f"replica ({', '.join(map(str, counts))}): GPUs would be stranded and vLLM's ranks uneven; "
            f"use a divisor such as {max(d for d in range(1, counts[0] + 1) if counts[0] % d == 0 and d <= tp)}"
        )
    room = sum(_replicas_on(node, sizing) for node in fitting)
    if deployment.spec.replicas > room:
        reasons.append(
            f"spec.replicas {deployment.spec.replicas} is more than the nodes hold at once: {room} "
            f"replica(s) of {sizing.gpus} GPUs, {format_quantity(sizing.memory)} and "
            f"{_cores(sizing.cpu_millis)} CPUs each fit on {len(fitting)} node(s)"
        )
    return reasons
