"""Telemetry: scrape and parse the engines' metrics into per-deployment KV statistics.

- ``metrics``: the operator's own Prometheus metrics (``kvtier_*``).

The I/O half (driven by :mod:`kvtier.controllers.telemetry`, one loop per operator):

- ``targets``: ``TargetIndex``, the Ready replicas of every InferenceDeployment and the ports of
  their vLLM, LMCache, probe and quota endpoints, kept current by a pod watch (a list only at
  start and after a 410).
- ``scraper``: ``Scraper`` (one aiohttp session, bounded concurrency, per-request timeouts, a
  body size limit, errors classified into ``kvtier_scrape_errors_total{reason}``) and
  ``PrometheusClient`` (``/api/v1/query`` for ``--metrics-source prometheus``).
- ``report``: a ``Summary`` as ``status.kv``, the ``MetricsAvailable`` condition, and the
  watermark and hit-ratio alerts that become Events.

The pure half (no I/O; each module's docstring has the details):

- ``exposition``: ``parse_exposition(body: bytes | str, *, max_bytes=MAX_BYTES,
  max_series=MAX_SERIES) -> Page``; never raises. ``Page.samples`` (name on the wire ->
  ``[Sample(name, labels, value, timestamp)]``), ``Page.sum(name, **labels) -> float | None``,
  ``Page.types``, ``Page.problems`` (``[Problem(line, message)]``), ``Page.truncated``.
- ``engines``: ``replica_snapshot(vllm: Page | None = None, lmcache: Page | None = None,
  probe: Page | None = None, quota: Any = None) -> Snapshot``: one replica's cumulative
  counters and gauges under every vLLM/LMCache spelling (``quota``: the decoded JSON of the
  LMCache MP ``GET /quota``); fields it cannot read are ``None``.
- ``stats``: ``DeploymentWindow(window_seconds, stale_seconds, required=REQUIRED_VLLM)`` with
  ``.add(uid: str, time: float, snapshot: Snapshot)``, ``.remove(uid)`` and
  ``.summary(now: float, replicas: Iterable[str] | None = None) -> Summary`` (hbm watermark
  mean/max, ``HitRatio(hbm, cpu, storage, total)``, TTFT p50/p99, preemptions/s, storage
  quota/used, the demand ``HitCurve``, and ``stale``: a reason or None);
  ``materially_changed(old: Summary | None, new: Summary, tolerances=Tolerances()) -> bool``.
  ``REQUIRED_LMCACHE_MP`` / ``REQUIRED_LMCACHE_IN_PROCESS`` name the series each mode needs.
- ``promql`` (``--metrics-source prometheus``): ``deployment_queries(selector: str,
  window_seconds: float) -> dict[str, str]`` (query name -> PromQL, per pod), and
  ``summary_from_results(results: Mapping[str, Any], window_seconds: float, *,
  required=REQUIRED_VLLM, expected: Iterable[str] | None = None,
  quotas: Mapping[str, Any] | None = None) -> Summary`` over the ``/api/v1/query`` answers
  (query name -> JSON body, bytes or decoded), keyed by the ``pod`` label.
"""
