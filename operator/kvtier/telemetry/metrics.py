"""The operator's own Prometheus metrics (served on ``kvtier run --metrics-port``).

One :class:`OperatorMetrics` per operator process, on its own registry (so tests and the
embedded cluster can run several operators side by side). Every name starts with ``kvtier_``,
follows Prometheus naming rules (base units, ``_total`` on counters, ``_seconds``/``_bytes``
suffixes) and is documented here; the Grafana dashboard queries only these and the engines'.

Labels: ``namespace``/``deployment`` name an InferenceDeployment, ``pool`` a KVPool,
``tier`` is one of ``hbm``, ``cpu``, ``storage``, ``total``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

DEPLOYMENT = ("namespace", "deployment")
TIERS = ("hbm", "cpu", "storage", "total")
STATS = ("mean", "max")
QUANTILES = ("0.5", "0.99")


class OperatorMetrics:
    """The metric families of one operator process."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        # Per deployment (from the engines' metrics, over the telemetry window).
        self.hbm_watermark = Gauge(
            "kvtier_deployment_hbm_watermark_ratio",
            "GPU KV-cache usage of the deployment's replicas, 0..1 (stat: mean or max over replicas).",
            [*DEPLOYMENT, "stat"],
            registry=r,
        )
        self.hit_ratio = Gauge(
            "kvtier_deployment_hit_ratio",
            "Share of prompt tokens served from each KV tier over the window (token-weighted).",
            [*DEPLOYMENT, "tier"],
            registry=r,
        )
        self.ttft = Gauge(
            "kvtier_deployment_ttft_seconds",
            "Time to first token over the window, from the engines' histograms (quantile: 0.5, 0.99).",
            [*DEPLOYMENT, "quantile"],
            registry=r,
        )
        self.preemptions = Gauge(
            "kvtier_deployment_preemptions_per_second",
            "Requests preempted for lack of KV blocks, per second over the window.",
            DEPLOYMENT,
            registry=r,
        )
        self.storage_quota = Gauge(
            "kvtier_deployment_storage_quota_bytes",
            "Storage-tier quota per replica, as granted by the pool's ledger.",
            DEPLOYMENT,
            registry=r,
        )
        self.storage_used = Gauge(
            "kvtier_deployment_storage_used_bytes",
            "Storage-tier bytes in use, summed over replicas.",
            DEPLOYMENT,
            registry=r,
        )
        self.metrics_stale = Gauge(
            "kvtier_deployment_metrics_stale",
            "1 when the deployment's metrics are stale or missing (its quota is frozen), else 0.",
            DEPLOYMENT,
            registry=r,
        )
        # Per pool.
        self.pool_capacity = Gauge(
            "kvtier_pool_capacity_bytes", "Bytes the pool may hand out (spec.capacity).", ["pool"], registry=r
        )
        self.pool_allocated = Gauge(
            "kvtier_pool_allocated_bytes", "Bytes the pool's ledger has granted.", ["pool"], registry=r
        )
        # Scraping.
        self.scrape_duration = Histogram(
            "kvtier_scrape_duration_seconds",
            "Duration of one scrape of one target.",
            ["endpoint"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.scrape_errors = Counter(
            "kvtier_scrape_errors", "Failed scrapes by endpoint and reason.", ["endpoint", "reason"], registry=r
        )
        self.scrape_targets = Gauge("kvtier_scrape_targets", "Targets scraped per cycle.", ["endpoint"], registry=r)
        self.scrape_cycle_duration = Gauge(
            "kvtier_scrape_cycle_duration_seconds", "Duration of the last complete scrape cycle.", registry=r
        )
        # Reconciling.
        self.reconciles = Counter(
            "kvtier_reconcile", "Reconciles by kind and result (success, retry, error).", ["kind", "result"], registry=r
        )
        self.reconcile_duration = Histogram(
            "kvtier_reconcile_duration_seconds",
            "Duration of one reconcile.",
            ["kind"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        # Rebalancing.
        self.rebalance_rounds = Counter(
            "kvtier_rebalance_rounds",
            "Rebalance rounds by outcome (moved, below-min-gain, cooldown, frozen, dry-run, static).",
            ["pool", "outcome"],
            registry=r,
        )
        self.rebalance_moves = Counter(
            "kvtier_rebalance_moves",
            "Quota changes applied (one per deployment whose quota changed).",
            ["pool"],
            registry=r,
        )
        self.rebalance_moved_bytes = Counter(
            "kvtier_rebalance_moved_bytes", "Bytes of quota moved between deployments.", ["pool"], registry=r
        )
        self.rebalance_predicted_gain = Gauge(
            "kvtier_rebalance_predicted_gain",
            "Relative gain of the pool's objective the last move predicted (0.05: 5%).",
            ["pool"],
            registry=r,
        )
        self.rebalance_realised_gain = Gauge(
            "kvtier_rebalance_realised_gain",
            "Relative change of the pool's measured storage hit rate one interval after the last move.",
            ["pool"],
            registry=r,
        )
        self.rebalance_quota = Gauge(
            "kvtier_rebalance_quota_bytes",
            "Storage quota per replica the rebalancer set last.",
            ["pool", *DEPLOYMENT],
            registry=r,
        )
        self.actuation_errors = Counter(
            "kvtier_rebalance_actuation_errors", "Quota API calls that failed or did not verify.", ["pool"], registry=r
        )

    def forget_deployment(self, namespace: str, name: str) -> None:
        """Drop every series of a deleted deployment."""
        series = [
            *((self.hbm_watermark, (stat,)) for stat in STATS),
            *((self.hit_ratio, (tier,)) for tier in TIERS),
            *((self.ttft, (quantile,)) for quantile in QUANTILES),
            *((family, ()) for family in (self.preemptions, self.storage_quota, self.storage_used, self.metrics_stale)),
        ]
        for family, extra in series:
            try:
                family.remove(namespace, name, *extra)
            except KeyError:
                pass
