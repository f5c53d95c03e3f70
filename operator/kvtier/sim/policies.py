"""Replay policies: how a scenario's pool is divided between its tenants (``scenarios/README.md``).

A policy chooses each tenant's salt (its partition of the pool), the pool and its initial quotas,
and may register hooks on the :class:`~kvtier.sim.replay.Replay` to move quota as virtual time
passes. Static: ``shared``, ``equal``, ``proportional``, ``oracle-static``. Dynamic ones subclass
:class:`DynamicPolicy`, which asks :meth:`DynamicPolicy.decide` for a split every epoch and
applies it: ``oracle-dynamic`` and ``kvtier`` (the production rebalancer, :class:`KvtierPolicy`).
Both oracles divide the pool with the production allocator (:mod:`kvtier.rebalance.allocator`).
References that are not scenario policies (the previous epoch's best split, the loop on exact
curves) are in :mod:`kvtier.sim.references`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

from kvtier.contract import DEFAULT_SALT
from kvtier.probe.demand import DemandProbe
from kvtier.probe.options import ProbeOptions
from kvtier.rebalance.allocator import Demand, allocate, apportion, moved_units
from kvtier.rebalance.demand import HALF_LIFE_INTERVALS
from kvtier.rebalance.estimator import CounterReading, DemandEstimator, Estimate, ProbeReading
from kvtier.rebalance.loop import Decision, DeploymentState, LoopSettings, decide
from kvtier.sim.cache import IsolatedLRU
from kvtier.sim.engine import RequestOutcome, Tier
from kvtier.sim.hindsight import Hindsight, HindsightPool
from kvtier.sim.replay import Replay, ReplayResult, TenantWorkload
from kvtier.sim.scenario import Scenario


def probe_reading(probe: DemandProbe, time: float) -> ProbeReading:
    """The reading of an in-process probe: the numbers its collector exports at ``time`` (the operator reads
    them from the probe's page)."""
    counts, total, _ = probe.buckets()
    return ProbeReading(
        time=time,
        bounds=tuple(float(bound) for bound in probe.bounds),
        cumulative=tuple(counts),
        total=total,
        lookups=float(probe.lookups),
        decay_ticks=float(probe.decay_ticks),
        decay_per_tick=probe.window.decay,
    )


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

    def pool(self, scenario: Scenario) -> IsolatedLRU:
        """The replay's pool, holding the initial quotas."""
        return IsolatedLRU(self.initial_quotas(scenario))

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


class ProportionalPolicy(Policy):
    """Shares proportional to each tenant's request rate over the run, fixed (largest remainders).

    The rates are measured over the same window (the whole run) for every tenant, so they are
    proportional to the tenants' request counts.
    """

    name = "proportional"

    def __init__(self, workloads: Sequence[TenantWorkload]) -> None:
        self.requests = {workload.name: len(workload.requests) for workload in workloads}

    def initial_quotas(self, scenario: Scenario) -> dict[str, int]:
        if not any(self.requests.values()):
            return EqualPolicy().initial_quotas(scenario)
        return apportion(self.requests, scenario.capacity_blocks)


def _demands(scenario: Scenario, curves: Mapping[str, Sequence[float]]) -> dict[str, Demand]:
    """Per tenant, hit blocks as a function of its quota in blocks, within its bounds."""
    return {
        tenant.name: Demand(curves[tenant.name], min_units=tenant.min_blocks, max_units=tenant.max_blocks)
        for tenant in scenario.tenants
    }


class OracleStaticPolicy(Policy):
    """The best fixed split in hindsight: the allocator on each tenant's whole-run LRU hit curve.

    The curves are exact, so the predicted hits are exactly what the replay reports.
    """

    name = "oracle-static"

    def __init__(self, hindsight: Hindsight) -> None:
        self.hindsight = hindsight

    def initial_quotas(self, scenario: Scenario) -> dict[str, int]:
        capacity = scenario.capacity_blocks
        curves = {name: self.hindsight.whole(name).hit_curve(capacity) for name in self.hindsight.tenants}
        return allocate(_demands(scenario, curves), capacity)


class DynamicPolicy(Policy):
    """A policy that re-divides the pool every :meth:`round_seconds` (by default the epoch).

    :meth:`decide` gets the time and the current quotas (what the quota API reports) and returns
    the new split, or None to keep it; the split is checked (every tenant, within the pool) and
    applied shrinks first, as the actuator does.
    """

    def decide(self, now: float, current: Mapping[str, int]) -> Mapping[str, int] | None:
        raise NotImplementedError

    def round_seconds(self, scenario: Scenario) -> float:
        """Virtual seconds between two rounds: ``epochSeconds``."""
        return scenario.epoch_seconds

    def attach(self, replay: Replay, scenario: Scenario) -> None:
        tenants = [tenant.name for tenant in scenario.tenants]
        capacity = scenario.capacity_blocks

        def epoch(now: float) -> None:
            current = {name: replay.quota(name) for name in tenants}
            quotas = self.decide(now, current)
            if quotas is None:
                return
            if set(quotas) != set(tenants) or sum(quotas.values()) > capacity:
                raise ValueError(f"{self.name}: split {dict(quotas)} does not divide {capacity} blocks among {tenants}")
            for name in sorted(tenants, key=lambda name: quotas[name] - current[name]):
                replay.set_quota(name, quotas[name])

        replay.every(self.round_seconds(scenario), epoch)


class OracleDynamicPolicy(DynamicPolicy):
    """An upper bound: every epoch, the best split for that epoch's accesses, judged by exact
    per-tenant stack depths on each tenant's whole stream.

    The replay runs on a :class:`~kvtier.sim.hindsight.HindsightPool`, so a growing partition
    instantly gets its blocks back and the hits are exactly the epoch curves' prediction. Each
    epoch's split starts from the previous one, so epochs where moving gains nothing move nothing.
    """

    name = "oracle-dynamic"

    def __init__(self, scenario: Scenario, hindsight: Hindsight) -> None:
        self.epoch_seconds = hindsight.epoch_seconds
        capacity = scenario.capacity_blocks
        #: The split of every epoch.
        self.splits: list[dict[str, int]] = []
        previous: dict[str, int] | None = None
        for index in range(hindsight.count):
            curves = {name: hindsight.epoch(name, index).hit_curve(capacity) for name in hindsight.tenants}
            previous = allocate(_demands(scenario, curves), capacity, previous)
            self.splits.append(previous)

    def initial_quotas(self, scenario: Scenario) -> dict[str, int]:
        return dict(self.splits[0]) if self.splits else EqualPolicy().initial_quotas(scenario)

    def pool(self, scenario: Scenario) -> IsolatedLRU:
        return HindsightPool(self.initial_quotas(scenario))

    def decide(self, now: float, current: Mapping[str, int]) -> Mapping[str, int] | None:
        index = round(now / self.epoch_seconds)
        return self.splits[index] if index < len(self.splits) else None


#: Scrapes a tenant's metrics may miss before its quota is frozen.
STALE_SCRAPES = 3
#: The ``kvtier`` policy divides a pool in about this many allocation units, as the operator does
#: (it uses capacity / ``POOL_UNITS``, 4,096, rounded to its quota alignment; the replay's pools are
#: smaller, and the allocator's work grows with the units: at a thousandth of the pool a unit
#: changes the hit ratio by less than the noise, see ``bench/``).
REPLAY_UNITS = 1024


class KvtierPolicy(DynamicPolicy):
    """The operator's rebalancer: the production estimator, loop and allocator on what the pods expose.

    Per tenant, one :class:`~kvtier.probe.demand.DemandProbe` (the probe sidecar's code, with its
    default settings) reads every lookup the tenant's LMCache server would log (each request's
    chunk hashes at its arrival; block ids stand in for the hex hashes, which changes no
    distance). Every ``scrapeSeconds`` a hook reads what a scrape would: each probe's histogram
    and counters (:func:`probe_reading`: exactly what the operator
    reads from the probe's ``/metrics`` page with telemetry's parser and
    :func:`~kvtier.rebalance.demand.probe_reading_of`, the text round trip being lossless), the
    engines' LMCache counters and the quotas, into one
    :class:`~kvtier.rebalance.estimator.DemandEstimator` per tenant. Every ``interval`` of the
    scenario's ``rebalance`` (a KVPool's ``spec.rebalance``, the KVPool's defaults when absent),
    :func:`~kvtier.rebalance.loop.decide` turns the estimates into a split with those settings
    (a pool that moved less than ``cooldown`` ago waits); the replay applies
    it through the quota semantics (a shrink evicts at once, a grown partition starts empty).
    A hit token is valued by the GPU seconds it saves (the tenant's cost model, over its mean prompt
    length from the engines' counters: a hit of a long-context tenant is worth more). Nothing here
    reads the trace ahead or any simulator state a pod does not expose.
    """

    name = "kvtier"

    def __init__(
        self,
        scenario: Scenario,
        half_life_intervals: float = HALF_LIFE_INTERVALS,
        units: int = REPLAY_UNITS,
        probe: ProbeOptions | None = None,
    ) -> None:
        self.settings = LoopSettings.from_spec(scenario.rebalance)
        self.scenario = scenario
        #: The probe sidecar's settings (its defaults unless given).
        self.probe = probe or ProbeOptions(log_dir="")
        self.estimators = {
            tenant.name: DemandEstimator(
                half_life_intervals * self.settings.interval_seconds, STALE_SCRAPES * scenario.scrape_seconds
            )
            for tenant in scenario.tenants
        }
        self.costs = [tenant.cost() for tenant in scenario.tenants]
        #: Per tenant, prompt tokens and requests at the last scrape (vLLM's counters).
        self.prompts: dict[str, tuple[int, int]] = {}
        #: Blocks per allocation unit: the pool is divided in about ``units`` units.
        self.unit_blocks = max(1, -(-scenario.capacity_blocks // units))
        self.last_move: float | None = None
        #: Every round's decision (quotas in allocation units), with its time.
        self.decisions: list[tuple[float, Decision]] = []

    def initial_quotas(self, scenario: Scenario) -> dict[str, int]:
        """An equal split in whole allocation units."""
        shares = split_evenly(scenario.capacity_blocks // self.unit_blocks, len(scenario.tenants))
        return {tenant.name: share * self.unit_blocks for tenant, share in zip(scenario.tenants, shares)}

    def round_seconds(self, scenario: Scenario) -> float:
        """The rebalance ``interval``."""
        return self.settings.interval_seconds

    def attach(self, replay: Replay, scenario: Scenario) -> None:
        options = self.probe
        probes = {}
        for tenant in scenario.tenants:
            probe = probes[tenant.name] = DemandProbe(
                options.max_blocks,
                window_seconds=options.window,
                tick_seconds=options.tick,
                buckets_per_octave=options.buckets_per_octave,
            )
            for engine in replay.replicas[tenant.name]:
                engine.listeners.append(_lookup_log(probe))

        def scrape(now: float) -> None:
            for name, probe in probes.items():
                probe.advance(now)
                estimator = self.estimators[name]
                # What the operator reads from the probe's page (the text round trip is lossless:
                # tests/unit/test_sim_kvtier.py), without rendering and parsing it every scrape.
                estimator.observe_probe(probe_reading(probe, now))
                stats = [engine.stats for engine in replay.replicas[name]]
                self.prompts[name] = (sum(s.prompt_tokens for s in stats), sum(s.requests for s in stats))
                estimator.observe_counters(
                    CounterReading(
                        now,
                        replay.quota(name) // self.unit_blocks,
                        sum(s.external_query_tokens for s in stats),
                        sum(s.hit_tokens[Tier.STORAGE] for s in stats),
                        sum(s.requests for s in stats),
                    )
                )

        # Registered first: a scrape due with an epoch runs before the epoch's decision.
        replay.every(scenario.scrape_seconds, scrape)
        super().attach(replay, scenario)

    def decide(self, now: float, current: Mapping[str, int]) -> Mapping[str, int] | None:
        capacity = self.scenario.capacity_blocks // self.unit_blocks
        decision = decide(self.states(now, current), capacity, self.settings, now, self.last_move)
        self.decisions.append((now, decision))
        if not decision.applies:
            return None
        self.last_move = now
        return {name: units * self.unit_blocks for name, units in decision.target.items()}

    def estimate(self, tenant: str, now: float, units: int, *, unit_chunks: float, front_chunks: float) -> Estimate:
        """A tenant's curve over ``0..units`` allocation units, as its estimator reads it now."""
        return self.estimators[tenant].estimate(
            now, units, unit_chunks=unit_chunks, chunk_tokens=self.scenario.block_tokens, front_chunks=front_chunks
        )

    def states(self, now: float, current: Mapping[str, int]) -> dict[str, DeploymentState]:
        """What the loop knows of every tenant now (quotas in allocation units)."""
        scenario = self.scenario
        unit = self.unit_blocks
        capacity = scenario.capacity_blocks // unit
        states = {}
        for tenant, cost in zip(scenario.tenants, self.costs):
            estimate = self.estimate(
                tenant.name, now, capacity, unit_chunks=unit, front_chunks=max(tenant.hbm_blocks, tenant.cpu_blocks)
            )
            max_units = None if tenant.max_blocks is None else tenant.max_blocks // unit
            # A hit token is worth the GPU seconds it saves, on average over the tenant's mean prompt.
            prompt_tokens, requests = self.prompts.get(tenant.name, (0, 0))
            hit_value = cost.saved_per_hit_token(prompt_tokens / requests if requests else 0.0)
            states[tenant.name] = DeploymentState(
                current[tenant.name] // unit,
                estimate,
                hit_value=hit_value,
                weight=tenant.weight,
                min_units=-(-tenant.min_blocks // unit),
                max_units=max_units,
                unit_tokens=unit * scenario.block_tokens,
            )
        return states


def _lookup_log(probe: DemandProbe) -> Callable[[RequestOutcome], None]:
    def record(outcome: RequestOutcome) -> None:
        probe.record(outcome.arrival, outcome.blocks)

    return record


#: Builds a policy from the scenario, its workloads and the (lazily computed, shared) hindsight.
PolicyFactory = Callable[[Scenario, Sequence[TenantWorkload], Callable[[], Hindsight]], Policy]

#: Every policy the replay implements, by name.
POLICIES: dict[str, PolicyFactory] = {
    "equal": lambda scenario, workloads, hindsight: EqualPolicy(),
    "proportional": lambda scenario, workloads, hindsight: ProportionalPolicy(workloads),
    "shared": lambda scenario, workloads, hindsight: SharedPolicy(),
    "oracle-static": lambda scenario, workloads, hindsight: OracleStaticPolicy(hindsight()),
    "oracle-dynamic": lambda scenario, workloads, hindsight: OracleDynamicPolicy(scenario, hindsight()),
    "kvtier": lambda scenario, workloads, hindsight: KvtierPolicy(scenario),
}


def build_policies(names: Sequence[str], scenario: Scenario, workloads: Sequence[TenantWorkload]) -> dict[str, Policy]:
    """The named policies that are implemented; the oracles share one :class:`Hindsight`."""
    hindsight = functools.cache(lambda: Hindsight(workloads, scenario.epoch_seconds))
    return {name: POLICIES[name](scenario, workloads, hindsight) for name in names if name in POLICIES}


@dataclass
class Timeline:
    """Each salt's quota and the cumulative block counts at time 0, at every round of the policy
    (every epoch for static ones) and at the end.

    A move is one salt's quota changing at a round; ``moved_blocks`` sums the increases.
    """

    times: list[float] = field(default_factory=list)
    quotas: list[dict[str, int]] = field(default_factory=list)
    hit_blocks: list[int] = field(default_factory=list)
    accessed_blocks: list[int] = field(default_factory=list)

    def record(self, replay: Replay, now: float) -> None:
        self.times.append(now)
        self.quotas.append(replay.pool.quotas())
        stats = [engine.stats for engines in replay.replicas.values() for engine in engines]
        self.hit_blocks.append(sum(s.total_hit_blocks for s in stats))
        self.accessed_blocks.append(sum(s.accessed_blocks for s in stats))

    @property
    def moves(self) -> int:
        return sum(
            sum(1 for salt in after if after[salt] != before.get(salt, 0))
            for before, after in zip(self.quotas, self.quotas[1:])
        )

    @property
    def moved_blocks(self) -> int:
        return sum(moved_units(before, after) for before, after in zip(self.quotas, self.quotas[1:]))


def run_policy(
    policy: Policy,
    scenario: Scenario,
    workloads: Sequence[TenantWorkload] | None = None,
    timeline: Timeline | None = None,
) -> ReplayResult:
    """Replay the scenario under ``policy``; pass ``workloads`` to reuse traces loaded once, and a
    ``timeline`` to record quotas and hits at every epoch."""
    if workloads is None:
        workloads = scenario.workloads()
    salts = policy.salts(scenario)
    replay = Replay([replace(workload, salt=salts[workload.name]) for workload in workloads], policy.pool(scenario))
    policy.attach(replay, scenario)
    if timeline is not None:
        timeline.record(replay, 0.0)
        # Registered after the policy's hooks, so it sees each round's new quotas.
        period = policy.round_seconds(scenario) if isinstance(policy, DynamicPolicy) else scenario.epoch_seconds
        replay.every(period, lambda now: timeline.record(replay, now))
    result = replay.run()
    if timeline is not None:
        timeline.record(replay, replay.now)
    return result
