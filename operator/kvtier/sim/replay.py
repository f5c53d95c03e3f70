"""Virtual-time replay of several tenants' traces through their engines and a shared pool.

Each tenant runs ``replicas`` :class:`~kvtier.sim.engine.Engine` s, each with its own HBM and
CPU tiers, sharing one storage tier: the tenant's salt's partition of one
:class:`~kvtier.sim.cache.IsolatedLRU` pool (so a partition is one LRU, as the scenario format
requires). A request goes to the replica whose GPUs free up first (its :class:`PrefillQueue`; ties: the
lowest index). Requests of all tenants are merged in arrival order (ties: tenant order, then trace
order) and served without sleeping. Hooks run every N virtual seconds, at N, 2N, ..., after
every request arriving before that time and before the first arriving at or after it: this is
where scrapes and policy epochs happen, and a hook may change quotas or read the engines.

Latency and prefill work come from each tenant's :class:`~kvtier.rebalance.costmodel.CostModel`
through one :class:`PrefillQueue` per replica (TTFT, GPU seconds saved, storage read seconds);
the engines decide the hits.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvtier.rebalance.costmodel import CostModel
from kvtier.sim.cache import IsolatedLRU
from kvtier.sim.engine import Engine, EngineParams, EngineStats, RequestOutcome, Tier
from kvtier.sim.trace import Request

Hook = Callable[[float], None]


@dataclass(frozen=True)
class TenantWorkload:
    """A tenant's requests (sorted by arrival, blocks already namespaced) and its replica's parameters."""

    name: str
    requests: Sequence[Request]
    params: EngineParams
    #: The pool partition (LMCache ``cache_salt``) the tenant stores into; defaults to its name.
    salt: str | None = None
    replicas: int = 1
    #: Prefill and load times of one replica (default: the engine parameters' linear model).
    cost: CostModel | None = None

    @property
    def cost_model(self) -> CostModel:
        if self.cost is not None:
            return self.cost
        params = self.params
        return CostModel.linear(
            params.prefill_tokens_per_second, params.kv_bytes_per_token, params.storage_read_bytes_per_second
        )


@dataclass(frozen=True)
class TenantResult:
    """Hit and latency totals of one tenant, or of all of them."""

    requests: int
    accessed_blocks: int
    hit_blocks: int
    prompt_tokens: int
    hit_tokens: int
    hit_blocks_by_tier: dict[str, int]
    hit_tokens_by_tier: dict[str, int]
    prefill_seconds_saved: float
    ttft_p50_seconds: float
    ttft_p99_seconds: float
    gpu_prefill_seconds: float = 0.0
    """GPU seconds spent prefilling (the cost model's)."""
    gpu_prefill_seconds_saved: float = 0.0
    """GPU seconds of prefill the hits avoided."""
    storage_read_seconds: float = 0.0
    """Seconds the replicas' storage paths spent reading hit KV."""

    @property
    def block_hit_ratio(self) -> float:
        return self.hit_blocks / self.accessed_blocks if self.accessed_blocks else 0.0

    @property
    def token_hit_ratio(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The per-policy fields of the ``kvtier sim replay --json`` output."""
        return {
            "block_hit_ratio": self.block_hit_ratio,
            "hit_blocks": self.hit_blocks,
            "accessed_blocks": self.accessed_blocks,
            "token_hit_ratio": self.token_hit_ratio,
            "prefill_seconds_saved": self.prefill_seconds_saved,
            "ttft_p50_seconds": self.ttft_p50_seconds,
            "ttft_p99_seconds": self.ttft_p99_seconds,
            "gpu_prefill_seconds": self.gpu_prefill_seconds,
            "gpu_prefill_seconds_saved": self.gpu_prefill_seconds_saved,
            "storage_read_seconds": self.storage_read_seconds,
            "hit_blocks_by_tier": dict(self.hit_blocks_by_tier),
            "hit_tokens_by_tier": dict(self.hit_tokens_by_tier),
        }


@dataclass(frozen=True)
class ReplayResult:
    overall: TenantResult
    per_tenant: dict[str, TenantResult]

    def to_dict(self) -> dict[str, Any]:
        return {**self.overall.to_dict(), "per_tenant": {name: r.to_dict() for name, r in self.per_tenant.items()}}


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of sorted values, interpolated linearly; 0 for none."""
    if not sorted_values:
        return 0.0
    rank = (len(sorted_values) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)


def taken_hits(prompt_tokens: int, hit_tokens: tuple[int, int, int]) -> tuple[int, int, int]:
    """The hit tokens per tier (HBM, CPU, storage) vLLM takes: all but a whole prompt's last token,
    which it recomputes (LMCache's connector loads one token less; vLLM's prefix cache stops short of
    it too), so every request computes at least one token. The deepest tier gives it up."""
    over = max(0, sum(hit_tokens) - max(0, prompt_tokens - 1))
    taken = list(hit_tokens)
    for tier in (2, 1, 0):
        cut = min(taken[tier], over)
        taken[tier] -= cut
        over -= cut
    return taken[0], taken[1], taken[2]


class PrefillQueue:
    """One replica's prefill in virtual time: its GPUs and its storage path.

    What LMCache's MP connector does in vLLM (``LMCacheMPConnector.get_num_new_matched_tokens``
    asks for an asynchronous load, and vLLM's scheduler parks the request in
    ``WAITING_FOR_REMOTE_KVS``): a request first reads its hits (storage hits first come, first
    served on the replica's storage path; CPU hits off it), and only then prefills its missed
    tokens. A request waiting for its load holds no GPU: the GPUs serve the others meanwhile. Each
    request takes the earliest idle stretch of the GPUs, at or after its load, that its compute
    fits in, so it never delays one queued before it. TTFT = first token - arrival.
    """

    __slots__ = (
        "model",
        "cpu_read_bytes_per_second",
        "gpu_free_at",
        "idle",
        "storage_free_at",
        "ttfts",
        "gpu_seconds",
        "gpu_seconds_saved",
        "storage_read_seconds",
    )

    def __init__(self, model: CostModel, cpu_read_bytes_per_second: float) -> None:
        self.model = model
        self.cpu_read_bytes_per_second = cpu_read_bytes_per_second
        #: When the last compute queued ends.
        self.gpu_free_at = -math.inf
        #: The GPUs' idle stretches before ``gpu_free_at``, ``(start, end)`` in time order: left
        #: by requests that queued behind a load, free for those whose KV is in sooner.
        self.idle: list[tuple[float, float]] = []
        self.storage_free_at = -math.inf
        self.ttfts: list[float] = []
        self.gpu_seconds = 0.0
        self.gpu_seconds_saved = 0.0
        self.storage_read_seconds = 0.0

    def serve(self, arrival: float, prompt_tokens: int, hit_tokens: tuple[int, int, int]) -> float:
        """Queue one request (hit tokens per tier: HBM, CPU, storage); returns its first-token time."""
        model = self.model
        hbm, cpu, storage = taken_hits(prompt_tokens, hit_tokens)
        hits = hbm + cpu + storage
        compute = model.prefill_seconds(hits, prompt_tokens)
        self.gpu_seconds += compute
        self.gpu_seconds_saved += model.prefill_seconds(0, hits)
        read = model.load_seconds(storage)
        load_start = arrival
        if read > 0:
            load_start = max(arrival, self.storage_free_at)
            self.storage_free_at = load_start + read
            self.storage_read_seconds += read
        loaded = load_start + read + model.load_seconds(cpu, self.cpu_read_bytes_per_second)
        first_token = self._compute(arrival, loaded, compute) + compute
        self.ttfts.append(first_token - arrival)
        return first_token

    def _compute(self, arrival: float, ready: float, seconds: float) -> float:
        """When a compute of ``seconds`` ready at ``ready`` starts: the earliest idle stretch it fits."""
        idle = self.idle
        while idle and idle[0][1] <= arrival:  # no request arriving from now on can use these
            idle.pop(0)
        for index, (start, end) in enumerate(idle):
            begin = max(start, ready)
            if begin + seconds <= end:
                idle[index : index + 1] = [
                    stretch for stretch in ((start, begin), (begin + seconds, end)) if stretch[1] > stretch[0]
                ]
                return begin
        begin = max(self.gpu_free_at, ready)
        if begin > self.gpu_free_at:
            idle.append((self.gpu_free_at, begin))
        self.gpu_free_at = begin + seconds
        return begin

    def listener(self) -> Callable[[RequestOutcome], None]:
        def serve(outcome: RequestOutcome) -> None:
            self.serve(outcome.arrival, outcome.input_tokens, outcome.hit_tokens)

        return serve


@dataclass(order=True)
class _Schedule:
    due: float
    order: int
    period: float = field(compare=False)
    count: int = field(compare=False)
    hook: Hook = field(compare=False)


class Replay:
    """Replays tenants through engines sharing ``pool``; run it once with :meth:`run`.

    Without a ``pool`` every salt has limit 0 until a hook sets a quota. ``salts`` maps tenant ->
    salt, ``replicas`` tenant -> engines; hooks may read both, the pool, and :meth:`result`.
    """

    def __init__(self, tenants: Sequence[TenantWorkload], pool: IsolatedLRU | None = None) -> None:
        names = [tenant.name for tenant in tenants]
        if len(set(names)) != len(names):
            raise ValueError(f"tenant names must be unique: {names}")
        for tenant in tenants:
            if tenant.replicas < 1:
                raise ValueError(f"tenant {tenant.name}: replicas must be >= 1")
            arrivals = [request.arrival for request in tenant.requests]
            if any(a > b for a, b in zip(arrivals, arrivals[1:])):
                raise ValueError(f"tenant {tenant.name}: requests must be sorted by arrival")
        self.tenants = list(tenants)
        self.pool = pool if pool is not None else IsolatedLRU()
        self.salts = {tenant.name: tenant.salt or tenant.name for tenant in tenants}
        #: Tenant name -> its replicas' engines.
        self.replicas = {
            tenant.name: [
                Engine(tenant.params, self.pool.partition(self.salts[tenant.name])) for _ in range(tenant.replicas)
            ]
            for tenant in tenants
        }
        #: Virtual time: the arrival of the request being served, or of the hook running.
        self.now = 0.0
        self._schedules: list[_Schedule] = []
        #: Tenant name -> its replicas' prefill queues (latency and prefill work).
        self.queues = {
            tenant.name: [
                PrefillQueue(tenant.cost_model, tenant.params.cpu_read_bytes_per_second) for _ in range(tenant.replicas)
            ]
            for tenant in tenants
        }
        self._done = False

    def every(self, seconds: float, hook: Hook) -> None:
        """Call ``hook(now)`` at virtual times seconds, 2 x seconds, ... (hooks due together run in registration order)."""
        if seconds <= 0:
            raise ValueError(f"seconds must be > 0, got {seconds}")
        heapq.heappush(self._schedules, _Schedule(seconds, len(self._schedules), seconds, 1, hook))

    def set_quota(self, tenant: str, blocks: int) -> int:
        """Set a tenant's storage quota (its salt's) in blocks; returns the blocks evicted."""
        return self.pool.set_quota(self.salts[tenant], blocks)

    def quota(self, tenant: str) -> int:
        return self.pool.quota(self.salts[tenant]) or 0

    def run(self) -> ReplayResult:
        """Serve every request in arrival order, running the hooks as virtual time passes."""
        if self._done:
            raise RuntimeError("a Replay runs once")
        self._done = True
        for name, engines in self.replicas.items():
            for engine, queue in zip(engines, self.queues[name]):
                engine.listeners.append(queue.listener())
        streams = [_tagged(tenant.requests, index) for index, tenant in enumerate(self.tenants)]
        replicas = [self.replicas[tenant.name] for tenant in self.tenants]
        queues = [self.queues[tenant.name] for tenant in self.tenants]
        schedules = self._schedules
        next_due = schedules[0].due if schedules else math.inf
        for arrival, index, request in heapq.merge(*streams, key=lambda item: (item[0], item[1])):
            if arrival >= next_due:
                next_due = self._run_hooks(arrival)
            self.now = arrival
            engines = replicas[index]
            if len(engines) == 1:
                engine = engines[0]
            else:  # the replica whose GPUs free up first
                tenant_queues = queues[index]
                engine = engines[min(range(len(engines)), key=lambda replica: tenant_queues[replica].gpu_free_at)]
            engine.submit(arrival, request.blocks, request.input_tokens, request.output_tokens)
        return self.result()

    def _run_hooks(self, until: float) -> float:
        """Run every hook due at or before ``until``, in time order; returns the next due time."""
        schedules = self._schedules
        while schedules and schedules[0].due <= until:
            schedule = heapq.heappop(schedules)
            self.now = schedule.due
            schedule.hook(schedule.due)
            schedule.count += 1
            schedule.due = schedule.count * schedule.period
            heapq.heappush(schedules, schedule)
        return schedules[0].due

    def result(self) -> ReplayResult:
        """Totals so far, per tenant and over all tenants."""
        per_tenant = {
            name: _totals([engine.stats for engine in engines], self.queues[name])
            for name, engines in self.replicas.items()
        }
        overall = _totals(
            [engine.stats for engines in self.replicas.values() for engine in engines],
            [queue for queues in self.queues.values() for queue in queues],
        )
        return ReplayResult(overall, per_tenant)


def _tagged(requests: Sequence[Request], index: int) -> Iterator[tuple[float, int, Request]]:
    for request in requests:
        yield request.arrival, index, request


def _totals(stats: Sequence[EngineStats], queues: Sequence[PrefillQueue]) -> TenantResult:
    ordered = sorted(ttft for queue in queues for ttft in queue.ttfts)
    return TenantResult(
        requests=sum(s.requests for s in stats),
        accessed_blocks=sum(s.accessed_blocks for s in stats),
        hit_blocks=sum(s.total_hit_blocks for s in stats),
        prompt_tokens=sum(s.prompt_tokens for s in stats),
        hit_tokens=sum(s.total_hit_tokens for s in stats),
        hit_blocks_by_tier={tier.name.lower(): sum(s.hit_blocks[tier] for s in stats) for tier in Tier},
        hit_tokens_by_tier={tier.name.lower(): sum(s.hit_tokens[tier] for s in stats) for tier in Tier},
        prefill_seconds_saved=sum(s.prefill_seconds_saved for s in stats),
        ttft_p50_seconds=percentile(ordered, 50),
        ttft_p99_seconds=percentile(ordered, 99),
        gpu_prefill_seconds=sum(queue.gpu_seconds for queue in queues),
        gpu_prefill_seconds_saved=sum(queue.gpu_seconds_saved for queue in queues),
        storage_read_seconds=sum(queue.storage_read_seconds for queue in queues),
    )
