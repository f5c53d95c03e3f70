"""Replay policies: how a scenario's pool is divided between its tenants.

A policy chooses each tenant's salt (its partition of the pool) and the initial quotas, and may
register hooks on the :class:`~kvtier.sim.replay.Replay` to move quota as virtual time passes.
Here are the two that need no rebalancer, ``shared`` and ``equal``; the dynamic and oracle
policies of ``scenarios/README.md`` subclass :class:`Policy` the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import ClassVar

from kvtier.sim.cache import IsolatedLRU
from kvtier.sim.replay import Replay, ReplayResult, TenantWorkload
from kvtier.sim.scenario import Scenario

#: LMCache's name for the salt of requests that carry none.
DEFAULT_SALT = "_default"


def split_evenly(capacity: int, count: int) -> list[int]:
    """``capacity`` blocks in ``count`` integer shares; the first ``capacity % count`` get one more."""
    share, extra = divmod(capacity, count)
    return [share + (1 if index < extra else 0) for index in range(count)]


class Policy:
    """Base: every tenant in its own partition named after it; subclasses set the quotas."""

    name: ClassVar[str]

    def salts(self, scenario: Scenario) -> dict[str, str]:
        """Tenant name -> salt of its partition."""
        return {tenant.name: tenant.name for tenant in scenario.tenants}

    def initial_quotas(self, scenario: Scenario) -> dict[str, int]:
        """Salt -> quota in blocks at virtual time 0."""
        raise NotImplementedError

    def attach(self, replay: Replay, scenario: Scenario) -> None:
        """Register hooks on the replay (dynamic policies); static ones need none."""


class SharedPolicy(Policy):
    """One LRU of the whole pool over all tenants' requests (a shared cache without quotas)."""

    name = "shared"

    def salts(self, scenario: Scenario) -> dict[str, str]:
        return {tenant.name: DEFAULT_SALT for tenant in scenario.tenants}

    def initial_quotas(self, scenario: Scenario) -> dict[str, int]:
        return {DEFAULT_SALT: scenario.capacity_blocks}


class EqualPolicy(Policy):
    """Every tenant gets capacity / n for the whole run (remainder blocks to the first tenants)."""

    name = "equal"

    def initial_quotas(self, scenario: Scenario) -> dict[str, int]:
        shares = split_evenly(scenario.capacity_blocks, len(scenario.tenants))
        return {tenant.name: share for tenant, share in zip(scenario.tenants, shares)}


POLICIES: dict[str, type[Policy]] = {policy.name: policy for policy in (SharedPolicy, EqualPolicy)}


def run_policy(
    policy: Policy, scenario: Scenario, workloads: Sequence[TenantWorkload] | None = None
) -> ReplayResult:
    """Replay the scenario under ``policy``; pass ``workloads`` to reuse traces loaded once."""
    if workloads is None:
        workloads = scenario.workloads()
    salts = policy.salts(scenario)
    replay = Replay(
        [replace(workload, salt=salts[workload.name]) for workload in workloads],
        IsolatedLRU(policy.initial_quotas(scenario)),
    )
    policy.attach(replay, scenario)
    return replay.run()
