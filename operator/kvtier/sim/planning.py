"""The capacity planner on recorded requests (:mod:`kvtier.rebalance.planner` has the method).

Sources: a replay scenario, or bare traces with common tenant fields. Each tenant's trace goes once
through an exact :class:`~kvtier.probe.stackdist.StackDistanceTracker` (its own LRU stack, blocks
namespaced per tenant as the replay does); the effective distances of every request become a
:class:`~kvtier.rebalance.planner.TenantProfile`, and :func:`evaluate` (what
:func:`~kvtier.rebalance.planner.plan` is given) replays a split's hits through the replay's own
:class:`~kvtier.sim.replay.PrefillQueue` s.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from kvtier.probe.stackdist import StackDistanceTracker
from kvtier.rebalance.planner import PEAK_WINDOW_SECONDS, CapacityOutcome, TenantOutcome, TenantProfile
from kvtier.sim.replay import PrefillQueue, TenantWorkload, percentile
from kvtier.sim.scenario import Scenario


def profiles(scenario: Scenario, workloads: Sequence[TenantWorkload] | None = None) -> list[TenantProfile]:
    """Every tenant's profile (pass ``workloads`` to reuse traces already loaded)."""
    if workloads is None:
        workloads = scenario.workloads()
    result = []
    for tenant, workload in zip(scenario.tenants, workloads):
        tracker = StackDistanceTracker()
        requests = workload.requests
        result.append(
            TenantProfile(
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
            )
        )
    return result


def caveats(scenario: Scenario) -> list[str]:
    """What the plan does not model for this scenario, in words (the CLI prints them)."""
    fronted = [tenant.name for tenant in scenario.tenants if tenant.hbm_blocks or tenant.cpu_blocks]
    if not fronted:
        return []
    return [
        f"tenants {', '.join(fronted)} have HBM/CPU tiers in front of the pool (hbmBlocks/cpuBlocks); the "
        "plan takes the pool as their only tier, so it over-states the pool's hits for them"
    ]


def block_bytes(scenario: Scenario) -> int:
    """Bytes of one pool block (the first tenant's, as a scenario's byte capacity is converted)."""
    return scenario.block_tokens * scenario.tenants[0].kv_bytes_per_token


def trace_scenario(
    traces: Sequence[tuple[str, Path]],
    *,
    capacity_blocks: int,
    block_tokens: int = 512,
    timestamp_unit: str = "ms",
    kv_bytes_per_token: int,
    prefill_tokens_per_second: float,
    storage_read_bytes_per_second: float,
    cost_model: str | None = None,
    replicas: int | None = None,
) -> Scenario:
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
    return Scenario.model_validate(
        {
            "version": 1,
            "name": "traces",
            "blockTokens": block_tokens,
            "epochSeconds": 300,
            "scrapeSeconds": 15,
            "pool": {"capacityBlocks": capacity_blocks},
            "tenants": [{"name": name, "trace": str(Path(path).resolve()), **tenant} for name, path in traces],
            "policies": ["oracle-static"],
        }
    )


def evaluate(
    profiles: Sequence[TenantProfile],
    quotas: Mapping[str, int],
    *,
    block_bytes: int,
    read_bandwidth: float | None = None,
) -> CapacityOutcome:
    """Hits, savings, TTFT and read bandwidth of a static split (quotas in blocks)."""
    per_tenant: dict[str, TenantOutcome] = {}
    ttfts: list[float] = []
    reads: list[tuple[float, float]] = []
    first, last = math.inf, -math.inf
    saved_total = 0.0
    for profile in profiles:
        quota = quotas[profile.name]
        queues = [PrefillQueue(profile.cost, profile.cpu_read_bytes_per_second) for _ in range(profile.replicas)]
        bt = profile.block_tokens
        kv_bytes = profile.cost.kv_bytes_per_token
        accessed = hit_blocks = hit_tokens_total = 0
        read_bytes = 0.0
        for arrival, prompt, distances in zip(profile.arrivals, profile.prompt_tokens, profile.distances):
            hits = bisect.bisect_right(distances, quota)
            hit_tokens = min(hits * bt, prompt)
            accessed += len(distances)
            hit_blocks += hits
            hit_tokens_total += hit_tokens
            queue = queues[0] if len(queues) == 1 else min(queues, key=lambda q: q.gpu_free_at)
            queue.serve(arrival, prompt, (0, 0, hit_tokens))
            if hit_tokens:
                reads.append((arrival, hit_tokens * kv_bytes))
                read_bytes += hit_tokens * kv_bytes
        if profile.arrivals:
            first, last = min(first, profile.arrivals[0]), max(last, profile.arrivals[-1])
        saved = sum(queue.gpu_seconds_saved for queue in queues)
        saved_total += saved
        for queue in queues:
            ttfts.extend(queue.ttfts)
        per_tenant[profile.name] = TenantOutcome(
            quota,
            len(profile.arrivals),
            accessed,
            hit_blocks,
            sum(profile.prompt_tokens),
            hit_tokens_total,
            saved,
            read_bytes,
        )
    span = max(last - first, PEAK_WINDOW_SECONDS) if reads or ttfts else PEAK_WINDOW_SECONDS
    ttfts.sort()
    capacity_blocks = sum(quotas.values())
    return CapacityOutcome(
        capacity_blocks=capacity_blocks,
        capacity_bytes=capacity_blocks * block_bytes,
        per_tenant=per_tenant,
        gpu_seconds_saved_per_hour=saved_total / span * 3600,
        ttft_p50_seconds=percentile(ttfts, 50),
        ttft_p99_seconds=percentile(ttfts, 99),
        read_bytes_per_second_mean=sum(t.read_bytes for t in per_tenant.values()) / span,
        read_bytes_per_second_peak=_peak_rate(reads, PEAK_WINDOW_SECONDS),
        read_bandwidth=read_bandwidth,
    )


def _peak_rate(events: list[tuple[float, float]], window: float) -> float:
    """The largest bytes per second over any ``window`` seconds (sliding over the events)."""
    events.sort()
    peak = running = 0.0
    start = 0
    for end in range(len(events)):
        running += events[end][1]
        while events[end][0] - events[start][0] >= window:
            running -= events[start][1]
            start += 1
        peak = max(peak, running)
    return peak / window
