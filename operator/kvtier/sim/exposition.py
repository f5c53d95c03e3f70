"""The simulated replica's Prometheus faces: vLLM 0.33's metrics and the LMCache MP server's instruments."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kvtier.contract import DEFAULT_SALT
from kvtier.sim.cache import IsolatedLRU
from kvtier.sim.engine import Engine, EngineParams, RequestOutcome, Tier

#: The L2 adapter kvtier renders (LMCache labels L2 series ``l2_name`` with the adapter type).
L2_NAME = "raw_block"
#: vLLM's TTFT buckets (seconds).
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
_QUEUE_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class Replica(Protocol):
    """What the metrics read of a :class:`~kvtier.sim.server.SimServer`."""

    model: str
    params: EngineParams
    engine: Engine
    pool: IsolatedLRU
    vllm_registry: CollectorRegistry
    mp_registry: CollectorRegistry

    def now(self) -> float: ...


class VllmMetrics:
    """vLLM 0.33's Prometheus metrics of one engine (labels ``model_name``, ``engine``)."""

    def __init__(self, server: Replica) -> None:
        registry = server.vllm_registry
        labels = {"model_name": server.model, "engine": "0"}
        names = list(labels)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, names, registry=registry).labels(**labels)

        def gauge(name: str, doc: str, read: Callable[[float], float]) -> None:
            Gauge(name, doc, names, registry=registry).labels(**labels).set_function(lambda: read(server.now()))

        engine = server.engine
        gauge("vllm:num_requests_running", "Requests in the running batch.", engine.running)
        gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", engine.waiting)
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage: 1 means 100 percent.", engine.watermark)
        self.queries = counter("vllm:prefix_cache_queries", "Prefix cache queries, in tokens.")
        self.hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.")
        self.external_queries = counter(
            "vllm:external_prefix_cache_queries", "External prefix cache queries, in tokens."
        )
        self.external_hits = counter("vllm:external_prefix_cache_hits", "External prefix cache hits, in tokens.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative preemptions (the model never preempts).")
        self.prompt = counter("vllm:prompt_tokens", "Prefill tokens processed.")
        self.cached = counter("vllm:prompt_tokens_cached", "Prompt tokens served from a cache.")
        self.generation = counter("vllm:generation_tokens", "Generation tokens processed.")
        by_source = Counter(
            "vllm:prompt_tokens_by_source", "Prompt tokens by source.", [*names, "source"], registry=registry
        )
        self.by_source = {
            source: by_source.labels(**labels, source=source)
            for source in ("local_compute", "local_cache_hit", "external_kv_transfer")
        }
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token, in seconds.",
            names,
            buckets=TTFT_BUCKETS,
            registry=registry,
        ).labels(**labels)
        self.queue = Histogram(
            "vllm:request_queue_time_seconds",
            "Time spent waiting for a batch slot.",
            names,
            buckets=_QUEUE_BUCKETS,
            registry=registry,
        ).labels(**labels)

    def record(self, outcome: RequestOutcome) -> None:
        hbm, cpu, storage = outcome.hit_tokens
        external = cpu + storage
        prompt = outcome.input_tokens
        self.queries.inc(prompt)
        self.hits.inc(hbm)
        self.external_queries.inc(prompt - hbm)
        self.external_hits.inc(external)
        self.prompt.inc(prompt)
        self.cached.inc(hbm + external)
        self.generation.inc(outcome.output_tokens)
        self.by_source["local_compute"].inc(max(0, prompt - hbm - external))
        self.by_source["local_cache_hit"].inc(hbm)
        self.by_source["external_kv_transfer"].inc(external)
        self.ttft.observe(outcome.ttft)
        self.queue.observe(outcome.started - outcome.arrival)


class MpMetrics:
    """LMCache MP instruments as its OpenTelemetry Prometheus exporter spells them: dots become underscores,
    the unit is appended (unless the name ends in it) and counters end in ``_total``."""

    _LOOKUP = (
        ("lmcache_mp_lookup_requested_tokens", "Tokens asked of LMCache."),
        ("lmcache_mp_lookup_hit_tokens", "Tokens LMCache found."),
        ("lmcache_mp_lookup_hit_l1_tokens", "Tokens found in L1."),
        ("lmcache_mp_lookup_hit_l2_tokens", "Tokens found in L2."),
        ("lmcache_mp_lookup_hit_l1_keys", "Chunks found in L1."),
        ("lmcache_mp_lookup_hit_l2_keys", "Chunks found in L2."),
        ("lmcache_mp_lookups_requests", "Lookups."),
    )

    def __init__(self, server: Replica) -> None:
        self.model = server.model
        self.counters = {
            name: Counter(name, doc, ["model_name", "cache_salt"], registry=server.mp_registry)
            for name, doc in self._LOOKUP
        }
        server.mp_registry.register(EvictionCollector(server))

    def record(self, outcome: RequestOutcome, salt: str) -> None:
        _, cpu, storage = outcome.hit_tokens
        _, cpu_keys, storage_keys = outcome.hit_blocks
        values = {
            "lmcache_mp_lookup_requested_tokens": outcome.input_tokens - outcome.hit_tokens[Tier.HBM],
            "lmcache_mp_lookup_hit_tokens": cpu + storage,
            "lmcache_mp_lookup_hit_l1_tokens": cpu,
            "lmcache_mp_lookup_hit_l2_tokens": storage,
            "lmcache_mp_lookup_hit_l1_keys": cpu_keys,
            "lmcache_mp_lookup_hit_l2_keys": storage_keys,
            "lmcache_mp_lookups_requests": 1,
        }
        for name, value in values.items():
            self.counters[name].labels(model_name=self.model, cache_salt=salt).inc(value)


class EvictionCollector:
    """Tier usage and eviction counters read from the cache model at scrape time."""

    def __init__(self, server: Replica) -> None:
        self.server = server

    def collect(self) -> Any:
        engine, pool = self.server.engine, self.server.pool
        block_bytes = self.server.params.block_bytes
        l1_usage = GaugeMetricFamily(
            "lmcache_mp_l1_memory_usage_bytes", "Bytes held in L1.", labels=["backend", "l1_tag"]
        )
        l1_usage.add_metric(["dram", DEFAULT_SALT], len(engine.cpu) * block_bytes if engine.cpu is not None else 0)
        l2_usage = GaugeMetricFamily("lmcache_mp_l2_usage_bytes", "Bytes held in each L2 adapter.", labels=["l2_name"])
        l2_usage.add_metric([L2_NAME], pool.used * block_bytes)
        l1 = CounterMetricFamily("lmcache_mp_l1_evicted_chunks", "Chunks evicted from L1.")
        l1.add_metric([], engine.cpu.evicted if engine.cpu is not None else 0)
        l2 = CounterMetricFamily("lmcache_mp_l2_evicted_objects_chunks", "Objects evicted from L2.", labels=["l2_name"])
        l2.add_metric([L2_NAME], sum(pool.partition(salt).evicted for salt in pool.salts()))
        return [l1_usage, l2_usage, l1, l2]


# HTTP faces.
