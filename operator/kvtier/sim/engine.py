"""One vLLM + LMCache (MP) replica in virtual time: three cache tiers and a latency model.

Tiers, fastest first: the HBM prefix cache (vLLM, ``hbm_blocks``), the L1 CPU tier (LMCache,
``cpu_blocks``) and the L2 storage tier: an :class:`~kvtier.sim.cache.LRUCache` (usually one
salt's partition of an :class:`~kvtier.sim.cache.IsolatedLRU` pool), or a whole ``IsolatedLRU``
pool whose partition each request picks by its ``salt`` (one replica serving several
``cache_salt`` s, as LMCache's MP server does). A tier of size 0 is absent.

Lookup: the HBM prefix first; the rest of the prompt continues block by block in L1, else L2,
and stops at the first block no tier holds (prefix semantics across tiers). Store: all the
prompt's blocks become resident in every present tier (inclusive tiers, touched last to first),
so each tier sees the whole access stream and, with HBM and L1 absent, the storage tier behaves
exactly as the scenario format's pool.

Latency: requests are admitted in arrival order into a running batch of at most
``max_running_requests`` (a FIFO queue waits for a free slot); an admitted request first loads
its hit KV from the lower tiers (hit bytes / tier read bandwidth), then prefills its missed
tokens on the replica's one prefill engine (missed tokens / ``prefill_tokens_per_second``,
requests one after the other); its first token ends the prefill and it then decodes
``output_tokens`` at ``decode_seconds_per_token`` while holding its slot and its KV blocks in
HBM. TTFT = first token - arrival. The cache is looked up at arrival, so hit ratios do not
depend on the latency model.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from kvtier.sim.cache import IsolatedLRU, LRUCache


class Tier(IntEnum):
    HBM = 0
    CPU = 1
    STORAGE = 2


@dataclass(frozen=True, slots=True)
class EngineParams:
    """A replica's sizes and speeds (block counts per replica, bandwidths in bytes/s)."""

    block_tokens: int = 512
    kv_bytes_per_token: int = 327_680
    prefill_tokens_per_second: float = 20_000.0
    hbm_blocks: int = 0
    cpu_blocks: int = 0
    cpu_read_bytes_per_second: float = 20e9
    storage_read_bytes_per_second: float = 5e9
    max_running_requests: int = 64
    decode_seconds_per_token: float = 0.02

    def __post_init__(self) -> None:
        for name in ("block_tokens", "kv_bytes_per_token", "max_running_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        for name in ("prefill_tokens_per_second", "cpu_read_bytes_per_second", "storage_read_bytes_per_second"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if self.hbm_blocks < 0 or self.cpu_blocks < 0 or self.decode_seconds_per_token < 0:
            raise ValueError("hbm_blocks, cpu_blocks and decode_seconds_per_token must be >= 0")

    @property
    def block_bytes(self) -> int:
        """KV bytes of one block (to turn byte quotas such as LMCache's ``limit_gb`` into blocks)."""
        return self.block_tokens * self.kv_bytes_per_token

    def prefill_seconds_saved_per_block(self, tier: Tier) -> float:
        """Prefill seconds a hit block saves: its recompute time minus its load time from ``tier``."""
        recompute = self.block_tokens / self.prefill_tokens_per_second
        if tier is Tier.HBM:
            return recompute
        bandwidth = self.cpu_read_bytes_per_second if tier is Tier.CPU else self.storage_read_bytes_per_second
        return recompute - self.block_bytes / bandwidth


@dataclass(slots=True)
class EngineStats:
    """Cumulative counters of one replica (what its vLLM and LMCache metrics are made of)."""

    requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    accessed_blocks: int = 0
    #: Indexed by :class:`Tier`.
    hit_blocks: list[int] = field(default_factory=lambda: [0, 0, 0])
    hit_tokens: list[int] = field(default_factory=lambda: [0, 0, 0])
    prefill_seconds_saved: float = 0.0

    @property
    def total_hit_blocks(self) -> int:
        return sum(self.hit_blocks)

    @property
    def total_hit_tokens(self) -> int:
        return sum(self.hit_tokens)

    @property
    def external_query_tokens(self) -> int:
        """Prompt tokens the HBM prefix cache missed, so vLLM asked LMCache for them."""
        return self.prompt_tokens - self.hit_tokens[Tier.HBM]

    @property
    def external_hit_tokens(self) -> int:
        """Tokens LMCache served (CPU and storage tiers)."""
        return self.hit_tokens[Tier.CPU] + self.hit_tokens[Tier.STORAGE]

    @property
    def block_hit_ratio(self) -> float:
        return self.total_hit_blocks / self.accessed_blocks if self.accessed_blocks else 0.0

    @property
    def token_hit_ratio(self) -> float:
        return self.total_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """What happened to one request (handed to the engine's listeners)."""

    arrival: float
    blocks: Sequence[int]
    input_tokens: int
    output_tokens: int
    #: Hit blocks and tokens per :class:`Tier`.
    hit_blocks: tuple[int, int, int]
    hit_tokens: tuple[int, int, int]
    #: Admission into the running batch, first token, end of decode (virtual seconds).
    started: float
    first_token: float
    finished: float

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival


Listener = Callable[[RequestOutcome], None]


class Engine:
    """One replica: ``submit`` requests in arrival order; read ``stats`` and the gauges."""

    def __init__(
        self, params: EngineParams, storage: LRUCache | None = None, *, pool: IsolatedLRU | None = None
    ) -> None:
        if storage is not None and pool is not None:
            raise ValueError("give an engine one storage partition or a pool, not both")
        self.params = params
        self.hbm = LRUCache(params.hbm_blocks) if params.hbm_blocks else None
        self.cpu = LRUCache(params.cpu_blocks) if params.cpu_blocks else None
        #: The L2 tier; an IsolatedLRU partition may have capacity 0 now and grow later.
        self.storage = storage
        #: With a pool, each request stores into the partition of its ``salt``.
        self.pool = pool
        self.stats = EngineStats()
        #: Called with every request's outcome (the lookup-hash log and TTFT collectors hook here).
        self.listeners: list[Listener] = []
        self._saved_per_block = tuple(params.prefill_seconds_saved_per_block(tier) for tier in Tier)
        self._last_arrival = float("-inf")
        self._prefill_free_at = float("-inf")
        # Decode end times of the requests holding batch slots (a min-heap of at most max_running).
        self._slots: list[float] = []
        # (started, finished, KV blocks) of requests not known to be finished, for the gauges;
        # pruned when read and whenever it has doubled since the last pruning.
        self._in_flight: list[tuple[float, float, int]] = []
        self._prune_above = 64

    def submit(
        self, arrival: float, blocks: Sequence[int], input_tokens: int, output_tokens: int, salt: str = ""
    ) -> RequestOutcome:
        """Serve one request arriving at ``arrival`` (not before the previous one's arrival).

        ``salt`` (LMCache's ``cache_salt``) picks the storage partition when the engine has a pool.
        """
        if arrival < self._last_arrival:
            raise ValueError(f"requests must arrive in order: {arrival} < {self._last_arrival}")
        self._last_arrival = arrival
        params = self.params
        storage = self.storage if self.pool is None else self.pool.partition(salt)
        hit_blocks, last_tier = self._lookup_and_store(blocks, storage)
        hit_tokens = self._hit_tokens(hit_blocks, last_tier, input_tokens)

        stats = self.stats
        stats.requests += 1
        stats.prompt_tokens += input_tokens
        stats.generation_tokens += output_tokens
        stats.accessed_blocks += len(blocks)
        saved = self._saved_per_block
        for tier in (0, 1, 2):
            if hit_blocks[tier]:
                stats.hit_blocks[tier] += hit_blocks[tier]
                stats.hit_tokens[tier] += hit_tokens[tier]
                stats.prefill_seconds_saved += hit_blocks[tier] * saved[tier]

        slots = self._slots
        started = max(arrival, heapq.heappop(slots)) if len(slots) >= params.max_running_requests else arrival
        load = params.kv_bytes_per_token * (
            hit_tokens[1] / params.cpu_read_bytes_per_second + hit_tokens[2] / params.storage_read_bytes_per_second
        )
        missed = max(0, input_tokens - hit_tokens[0] - hit_tokens[1] - hit_tokens[2])
        first_token = max(started + load, self._prefill_free_at) + missed / params.prefill_tokens_per_second
        self._prefill_free_at = first_token
        finished = first_token + output_tokens * params.decode_seconds_per_token
        heapq.heappush(slots, finished)
        kv_blocks = len(blocks) + -(-output_tokens // params.block_tokens)
        self._in_flight.append((started, finished, kv_blocks))
        if len(self._in_flight) > self._prune_above:
            self._prune_above = 2 * len(self._settle(arrival)) + 64

        outcome = RequestOutcome(
            arrival, blocks, input_tokens, output_tokens, hit_blocks, hit_tokens, started, first_token, finished
        )
        for listener in self.listeners:
            listener(outcome)
        return outcome

    @property
    def prefill_free_at(self) -> float:
        """When the replica's prefill engine finishes the work it has been given."""
        return self._prefill_free_at

    def _lookup_and_store(self, blocks: Sequence[int], storage: LRUCache | None) -> tuple[tuple[int, int, int], int]:
        """Hit blocks per tier, and the tier that served the last hit block."""
        hbm, cpu = self.hbm, self.cpu
        if hbm is None and cpu is None:
            return (0, 0, storage.access(blocks) if storage is not None else 0), Tier.STORAGE
        count = len(blocks)
        in_hbm = hbm.prefix_hits(blocks) if hbm is not None else 0
        in_cpu = in_storage = 0
        last_tier = Tier.HBM
        if in_hbm < count:
            if cpu is not None and storage is not None:
                for index in range(in_hbm, count):
                    block = blocks[index]
                    if block in cpu:
                        in_cpu += 1
                        last_tier = Tier.CPU
                    elif block in storage:
                        in_storage += 1
                        last_tier = Tier.STORAGE
                    else:
                        break
            elif cpu is not None:
                in_cpu = cpu.prefix_hits(blocks, in_hbm)
                last_tier = Tier.CPU if in_cpu else Tier.HBM
            elif storage is not None:
                in_storage = storage.prefix_hits(blocks, in_hbm)
                last_tier = Tier.STORAGE if in_storage else Tier.HBM
        for tier in (hbm, cpu, storage):
            if tier is not None:
                tier.touch(blocks)
        return (in_hbm, in_cpu, in_storage), last_tier

    def _hit_tokens(self, hit_blocks: tuple[int, int, int], last_tier: int, input_tokens: int) -> tuple[int, int, int]:
        """Tokens of the hit blocks: full blocks, except that hits never exceed the prompt.

        Only the prompt's last block may be partial; the tier that served it gives up the rest.
        """
        block_tokens = self.params.block_tokens
        tokens = [hits * block_tokens for hits in hit_blocks]
        excess = sum(tokens) - input_tokens
        if excess > 0:
            tokens[last_tier] = max(0, tokens[last_tier] - excess)
        return (tokens[0], tokens[1], tokens[2])

    def _settle(self, now: float) -> list[tuple[float, float, int]]:
        """Forget the requests finished by ``now``; gauges are read at times >= the last arrival."""
        self._in_flight = [entry for entry in self._in_flight if entry[1] > now]
        return self._in_flight

    def running(self, now: float) -> int:
        """Requests in the running batch at ``now`` (vLLM ``num_requests_running``)."""
        return sum(1 for started, _, _ in self._settle(now) if started <= now)

    def waiting(self, now: float) -> int:
        """Requests queued for a batch slot at ``now`` (vLLM ``num_requests_waiting``)."""
        return sum(1 for started, _, _ in self._settle(now) if started > now)

    def watermark(self, now: float) -> float:
        """The GPU KV watermark at ``now``: HBM blocks held by running requests / HBM blocks (0..1).

        0 when the replica models no HBM tier.
        """
        if not self.params.hbm_blocks:
            return 0.0
        held = sum(blocks for started, _, blocks in self._settle(now) if started <= now)
        return min(1.0, held / self.params.hbm_blocks)
