"""The capacity planner's offline sources: a replay scenario, or bare traces with common tenant fields.

Each tenant's trace goes once through an exact :class:`~kvtier.sim.stackdist.StackDistanceTracker`
(its own LRU stack, blocks namespaced per tenant as the replay does); the effective distances of
every request become a :class:`~kvtier.rebalance.planner.TenantProfile`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kvtier.rebalance.planner import TenantProfile
from kvtier.sim.replay import TenantWorkload
from kvtier.sim.scenario import Scenario
from kvtier.sim.stackdist import StackDistanceTracker


def profiles(scenario: Scenario, workloads: Sequence[TenantWorkload] | None = None) -> list[TenantProfile]:
    """Every tenant's profile (pass ``workloads`` to reuse traces already loaded)."""
    if workloads is None:
        workloads = scenario.workloads()
    result = []
    for tenant, workload in zip(scenario.tenants, workloads):
        tracker = StackDistanceTracker()
        requests = workload.requests
        result.append(TenantProfile(
            name=tenant.name,
            arrivals=[request.arrival for request in requests],
            prompt_tokens=[request.input_tokens for request in requests],
            distances=[tracker.access(request.blocks) for request in requests],
            block_tokens=scenario.block_tokens,
            cost=workload.cost_model,
            replicas=workload.replicas,
            cpu_read_bytes_per_second=workload.params.cpu_read_bytes_per_second,
            weight=tenant.weight,
            min_blocks=tenant.min_blocks,
            max_blocks=tenant.max_blocks,
        ))
    return result


def block_bytes(scenario: Scenario) -> int:
    """Bytes of one pool block (the first tenant's, as a scenario's byte capacity is converted)."""
    return scenario.block_tokens * scenario.tenants[0].kv_bytes_per_token


def trace_scenario(traces: Sequence[tuple[str, Path]], *, capacity_blocks: int, block_tokens: int = 512,
                   timestamp_unit: str = "ms", kv_bytes_per_token: int, prefill_tokens_per_second: float,
                   storage_read_bytes_per_second: float, cost_model: str | None = None,
                   replicas: int | None = None) -> Scenario:
    """A scenario of bare traces (``(tenant name, path)``) sharing the same tenant fields."""
    tenant = {
        "timestampUnit": timestamp_unit,
        "kvBytesPerToken": kv_bytes_per_token,
        "prefillTokensPerSecond": prefill_tokens_per_second,
        "storageReadBytesPerSecond": storage_read_bytes_per_second,
    }
    if cost_model is not None:
        tenant["costModel"] = cost_model
    if replicas is not None:
        tenant["replicas"] = replicas
    return Scenario.model_validate({
        "version": 1,
        "name": "traces",
        "blockTokens": block_tokens,
        "epochSeconds": 300,
        "scrapeSeconds": 15,
        "pool": {"capacityBlocks": capacity_blocks},
        "tenants": [{"name": name, "trace": str(Path(path).resolve()), **tenant} for name, path in traces],
        "policies": ["oracle-static"],
    })
