"""kvsim: a vLLM + LMCache engine model (cache tiers, latency) and its virtual-time trace replay.

- ``trace``: Mooncake JSONL traces -> :class:`Request` (arrival seconds, tokens, namespaced block ids).
- ``cache``: :class:`LRUCache` (prefix semantics, live resize) and :class:`IsolatedLRU` (per-salt quotas).
- ``engine``: one replica (:class:`Engine`): HBM -> CPU -> storage tiers, TTFT, watermark, counters.
- ``replay``: many tenants' traces merged in virtual time through engines sharing one pool, with hooks.
- ``scenario``: the replay scenario file format; ``policies``: how a policy divides the pool.
- ``server``: ``kvtier sim serve``, one engine in (scaled) real time behind vLLM's and LMCache MP's
  HTTP faces (metrics, quota API), writing ``lookuplog`` (LMCache's lookup-hash log); ``settings``:
  its sizes, speed and self-replayed trace (options, or ``KVSIM_*`` variables).

The exact LRU stack distances the oracles and the planner use are the probe's own
(:mod:`kvtier.probe.stackdist`), as is the lookup-hash log's file format (:mod:`kvtier.probe.tail`):
the simulator follows the sidecar, never the reverse.
- ``pods``: ``KvsimEngines`` for simulated pods (vllm, lmcache and probe containers); the embedded
  cluster's default factory (with a default trace load) is ``kvtier.testing.engines.embedded_engines``.
"""
