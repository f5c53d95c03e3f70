"""The pod contract: what the operator renders into an engine pod and what it later finds there.

Render writes these names into every pod; telemetry finds its scrape targets by them, the actuator sets
quotas through them, and kvsim and the probe serve them. One module, so the sides cannot drift apart.
"""

from __future__ import annotations

from typing import Final

#: Label on every child of an InferenceDeployment (its name); pods are selected by it.
DEPLOYMENT_LABEL: Final = "kvtier.io/deployment"
#: On cluster-scoped children (PersistentVolumes), which carry labels instead of an owner reference.
DEPLOYMENT_NAMESPACE_LABEL: Final = "kvtier.io/deployment-namespace"
#: Pod annotation: a hash of the rendered LMCache configuration (a change rolls the pods).
CONFIG_HASH_ANNOTATION: Final = "kvtier.io/config-hash"
#: Readiness gate: a pod is not Ready until the operator has set its storage quota.
QUOTA_GATE: Final = "kvtier.io/kv-quota-applied"

#: Containers of an engine pod.
VLLM_CONTAINER: Final = "vllm"
LMCACHE_CONTAINER: Final = "lmcache"
PROBE_CONTAINER: Final = "kvtier-probe"

#: Port names (also the PodMonitor's endpoints): vLLM's API and /metrics; the LMCache MP server's HTTP port
#: (its API, `/quota` and `/healthcheck`, and its `/metrics`); the probe's /metrics.
HTTP_PORT: Final = "http"
LMCACHE_API_PORT: Final = "lmcache-api"
PROBE_METRICS_PORT: Final = "probe-metrics"
#: The probe's port number unless the operator is told otherwise (`kvtier run` renders it, `kvtier probe`
#: listens there).
PROBE_DEFAULT_PORT: Final = 9400

#: Endpoint paths.
METRICS_PATH: Final = "/metrics"
HEALTH_PATH: Final = "/health"
"""vLLM's and the probe's health check."""
LMCACHE_HEALTH_PATH: Final = "/healthcheck"
QUOTA_PATH: Final = "/quota"
"""LMCache's quota API: `GET /quota` (every salt), `GET`/`PUT /quota/{salt}` (`{"limit_gb": x}`)."""

#: The cache salt of requests that name none: the quota kvtier sets on every replica.
DEFAULT_SALT: Final = "_default"


def quota_path(salt: str = DEFAULT_SALT) -> str:
    """The quota API's path for one salt."""
    return f"{QUOTA_PATH}/{salt}"
