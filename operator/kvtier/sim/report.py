"""``kvtier sim replay``: run a scenario's policies side by side and report them (JSON, markdown).

The JSON has exactly the shape of ``scenarios/README.md``; the markdown adds the ``kvtier``
policy's rounds (outcome and reason of every decision). Plots: :mod:`kvtier.sim.plots`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvtier.rebalance.loop import Decision
from kvtier.sim.engine import Tier
from kvtier.sim.policies import KvtierPolicy, SharedPolicy, Timeline, build_policies, run_policy
from kvtier.sim.replay import ReplayResult
from kvtier.sim.scenario import Scenario, ScenarioTenant


@dataclass(frozen=True)
class PolicyRun:
    """One policy's replay: its totals and timeline (and the rebalancer's decisions, for ``kvtier``)."""

    name: str
    result: ReplayResult
    timeline: Timeline
    #: False for ``shared``: one LRU, no per-tenant quotas.
    partitioned: bool = True
    decisions: tuple[tuple[float, Decision], ...] = ()
    #: Wall seconds of the replay.
    seconds: float = 0.0
    #: Blocks per allocation unit of the ``kvtier`` policy's decisions.
    unit_blocks: int = 1

    @property
    def accesses_per_second(self) -> float:
        return self.result.overall.accessed_blocks / self.seconds if self.seconds > 0 else 0.0


def replay_scenario(
    scenario: Scenario, names: Sequence[str] | None = None, progress: Callable[[str], None] = lambda line: None
) -> list[PolicyRun]:
    """Run the named policies (default: the scenario's) on the scenario's workloads, loaded once."""
    names = list(scenario.policies if names is None else names)
    started = time.perf_counter()
    workloads = scenario.workloads()
    accesses = sum(len(r.blocks) for w in workloads for r in w.requests)
    progress(f"loaded {len(workloads)} tenants, {accesses:,} block accesses ({time.perf_counter() - started:.1f} s)")
    started = time.perf_counter()
    policies = build_policies(names, scenario, workloads)
    progress(f"prepared {', '.join(policies)} ({time.perf_counter() - started:.1f} s)")
    runs = []
    for index, name in enumerate(names, 1):
        started = time.perf_counter()
        policy = policies[name]
        timeline = Timeline()
        result = run_policy(policy, scenario, workloads, timeline)
        seconds = time.perf_counter() - started
        progress(
            f"[{index}/{len(names)}] {name}: block hit ratio {result.overall.block_hit_ratio:.4f}, "
            f"GPU prefill s saved {result.overall.gpu_prefill_seconds_saved:,.0f}, {timeline.moves} moves "
            f"({seconds:.1f} s, {result.overall.accessed_blocks / seconds:,.0f} block accesses/s)"
        )
        kvtier = isinstance(policy, KvtierPolicy)
        runs.append(
            PolicyRun(
                name,
                result,
                timeline,
                not isinstance(policy, SharedPolicy),
                tuple(policy.decisions) if kvtier else (),
                seconds,
                policy.unit_blocks if kvtier else 1,
            )
        )
    return runs


def to_json(scenario: Scenario, runs: Sequence[PolicyRun]) -> dict[str, Any]:
    """The ``--json`` document."""
    policies: dict[str, Any] = {}
    for run in runs:
        overall = run.result.overall
        policies[run.name] = {
            "block_hit_ratio": overall.block_hit_ratio,
            "hit_blocks": overall.hit_blocks,
            "accessed_blocks": overall.accessed_blocks,
            "token_hit_ratio": overall.token_hit_ratio,
            "prefill_seconds_saved": overall.prefill_seconds_saved,
            "ttft_p50_seconds": overall.ttft_p50_seconds,
            "ttft_p99_seconds": overall.ttft_p99_seconds,
            "gpu_prefill_seconds": overall.gpu_prefill_seconds,
            "gpu_prefill_seconds_saved": overall.gpu_prefill_seconds_saved,
            "storage_read_seconds": overall.storage_read_seconds,
            "block_accesses_per_second": run.accesses_per_second,
            "moves": run.timeline.moves,
            "moved_blocks": run.timeline.moved_blocks,
            "per_tenant": {
                name: {
                    "block_hit_ratio": tenant.block_hit_ratio,
                    "hit_blocks": tenant.hit_blocks,
                    "accessed_blocks": tenant.accessed_blocks,
                    "gpu_prefill_seconds_saved": tenant.gpu_prefill_seconds_saved,
                    "ttft_p50_seconds": tenant.ttft_p50_seconds,
                }
                for name, tenant in run.result.per_tenant.items()
            },
        }
    return {"scenario": scenario.name, "policies": policies}


def _saved_per_storage_hit(scenario: Scenario, tenant: ScenarioTenant) -> float:
    return scenario.engine_params(tenant).prefill_seconds_saved_per_block(Tier.STORAGE)


def to_markdown(scenario: Scenario, runs: Sequence[PolicyRun], plot: str | None = None) -> str:
    """A summary a reader can take in at a glance: totals, per tenant, the splits, the rebalancer's rounds."""
    tenants = [tenant.name for tenant in scenario.tenants]
    lines = [
        f"# Replay: {scenario.name}",
        "",
        f"{len(tenants)} tenants ({', '.join(tenants)}) share a pool of {scenario.capacity_blocks:,} blocks "
        f"of {scenario.block_tokens} tokens; `oracle-dynamic` re-divides it every {scenario.epoch_seconds:g} s "
        f"of virtual time, `kvtier` every {scenario.rebalance.interval:g} s (`rebalance`: "
        f"{scenario.rebalance.model_dump_json(by_alias=True)}). Semantics: `scenarios/README.md`; "
        "GPU seconds and TTFT from each tenant's cost model (`docs/cost-model.md`).",
        "",
        "| policy | block hit ratio | token hit ratio | GPU prefill s saved | storage read s | TTFT p50 s | "
        "TTFT p99 s | prefill s saved (flat) | moves | moved blocks | block accesses/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        o = run.result.overall
        lines.append(
            f"| {run.name} | {o.block_hit_ratio:.4f} | {o.token_hit_ratio:.4f} | {o.gpu_prefill_seconds_saved:,.1f} | "
            f"{o.storage_read_seconds:,.1f} | {o.ttft_p50_seconds:.3f} | {o.ttft_p99_seconds:.3f} | "
            f"{o.prefill_seconds_saved:,.1f} | {run.timeline.moves} | {run.timeline.moved_blocks:,} | "
            f"{run.accesses_per_second:,.0f} |"
        )
    if runs:
        accessed = runs[0].result.overall.accessed_blocks
        lines += ["", f"Block accesses: {accessed:,} (the same for every policy).", ""]
        lines += [
            "## Block hit ratio per tenant",
            "",
            "| policy | " + " | ".join(tenants) + " |",
            "|---|" + "---:|" * len(tenants),
        ]
        for run in runs:
            per = run.result.per_tenant
            lines.append(f"| {run.name} | " + " | ".join(f"{per[t].block_hit_ratio:.4f}" for t in tenants) + " |")
        lines += [
            "",
            "## Quotas (blocks)",
            "",
            "Static splits; for a dynamic policy, the range over its epochs.",
            "",
            "| policy | " + " | ".join(tenants) + " |",
            "|---|" + "---:|" * len(tenants),
        ]
        for run in runs:
            if not run.partitioned:
                lines.append(f"| {run.name} | " + " | ".join("one LRU" for _ in tenants) + " |")
                continue
            quotas = run.timeline.quotas
            cells = []
            for tenant in tenants:
                low, high = min(q.get(tenant, 0) for q in quotas), max(q.get(tenant, 0) for q in quotas)
                cells.append(f"{low:,}" if low == high else f"{low:,} .. {high:,}")
            lines.append(f"| {run.name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Flat prefill seconds saved per hit block (the format's field: block tokens / prefill speed - block bytes / read "
        "bandwidth; negative when loading a block from the pool is slower than recomputing it): "
        + ", ".join(f"{t.name} {_saved_per_storage_hit(scenario, t) * 1000:+.1f} ms" for t in scenario.tenants)
        + ".",
    ]
    for run in runs:
        if run.decisions:
            lines += [
                "",
                f"## `{run.name}` rounds",
                "",
                f"Quotas in blocks; the reasons count allocation units of {run.unit_blocks} blocks.",
                "",
                "| time s | outcome | quotas after | reason |",
                "|---:|---|---|---|",
            ]
            lines += [
                f"| {now:g} | {decision.outcome} | "
                + ", ".join(f"{name} {decision.target[name] * run.unit_blocks:,}" for name in tenants)
                + f" | {decision.reason} |"
                for now, decision in run.decisions
            ]
    if plot:
        lines += ["", f"![quota per tenant over time, hit ratio per policy]({plot})"]
    return "\n".join(lines) + "\n"
