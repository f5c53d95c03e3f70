"""``kvtier probe``: the pod sidecar that turns LMCache's lookup-hash log into a demand curve.

It tails the MP server's lookup-hash log (``--lookup-hash-log-dir``, a shared emptyDir; see
:mod:`kvtier.probe.tail` for rotation, restarts, partial and garbage lines), computes the exact
LRU stack distance of every chunk looked up, with prefix semantics (a chunk hits at capacity C
only if every chunk before it in the lookup does), over the top ``--max-blocks`` chunks of the
stack and a decaying window (:mod:`kvtier.probe.demand`), and serves on ``/metrics``:

``kvtier_probe_stack_distance_chunks`` (histogram)
    Buckets ``le`` = 1, 2, 3, 4, 6, 8, 11, 16, ... (``--buckets-per-octave`` geometric steps per
    doubling, 2 by default, rounded; below ``max_chunks``), ``max_chunks``, ``+Inf``.
    ``bucket{le="C"}`` is the weight of the chunk lookups an LRU cache of C chunks would hit
    (the demand curve: hit ratio at capacity C = ``bucket{le="C"} / _count``). ``+Inf`` and
    ``_count`` are every lookup, including cold chunks and chunks deeper than ``max_chunks``.
    ``_sum`` is the weighted sum of the finite distances. Weights decay (see
    ``kvtier_probe_window_seconds``), so read the series as instant values, never through
    ``rate()``; with no decay they only grow (until a restart).
``kvtier_probe_stack_distance_bytes`` (histogram, only with ``--chunk-bytes``)
    The same counts with ``le`` in bytes of cache: ``le`` = C x chunk bytes.
``kvtier_probe_lookups_total``, ``kvtier_probe_chunks_total`` (counters)
    Lookups and chunks read from the log (not decayed; ``rate()`` gives the access rate).
``kvtier_probe_decay_ticks_total`` (counter), ``kvtier_probe_tick_seconds`` (gauge)
    Decay steps applied so far, and the seconds between two: the weights of two scrapes differ by
    ``0.5 ** (ticks x tick / window)``, so a scraper can take the lookups in between exactly
    (the rebalancer's estimator windows the curve this way, :mod:`kvtier.rebalance.estimator`).
``kvtier_probe_garbage_lines_total``, ``kvtier_probe_duplicate_lookups_total`` (counters)
    Lines that were not lookups, and lookups repeating a recent request id (vLLM may look a
    waiting request up again); both skipped.
``kvtier_probe_tracked_chunks`` (gauge)
    Chunks in the tracked stack; never above ``kvtier_probe_max_chunks``.
``kvtier_probe_max_chunks``, ``kvtier_probe_chunk_bytes``, ``kvtier_probe_window_seconds`` (gauges)
    The configuration: the curve is exact up to ``max_chunks``; bytes per chunk (0 unknown); the
    half-life of an access's weight in seconds (0 = no decay).
``kvtier_probe_last_lookup_timestamp_seconds`` (gauge, once a lookup was read)
    Unix time of the newest lookup: how fresh the curve is.

:func:`kvtier.probe.demand.hit_curve` turns the scraped buckets back into a
:class:`~kvtier.probe.demand.HitCurve`.
"""
