"""kvsim: a vLLM + LMCache engine model (cache tiers, latency) and its virtual-time trace replay.

Modules: ``trace`` (Mooncake traces), ``cache`` (LRU and IsolatedLRU with prefix semantics),
``stackdist`` (exact LRU stack distances), ``engine`` (one replica), ``replay`` (many tenants in
virtual time), ``scenario`` (the replay scenario format), ``policies`` (pool-division policies).
"""
