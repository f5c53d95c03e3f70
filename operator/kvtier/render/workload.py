"""All children of one InferenceDeployment, in the order they are applied.

ConfigMap (LMCacheInProcess) -> headless Service -> API Service -> StatefulSet -> PodDisruptionBudget
-> PodMonitor (when asked) -> PersistentVolumes (static pools: NVMe-oF, hostPath).

The StatefulSet's claims outlive pods (`whenDeleted: Retain`): a StatefulSet deleted by hand and
re-created gets its volumes, and LMCache's raw-block index, back; the controller deletes the claims
(label `kvtier.io/deployment`) when the InferenceDeployment itself goes. Scaling down deletes the
claims of the removed ordinals (`whenScaled: Delete`): their volume and quota return to the pool.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import yaml

from kvtier.api.inferencedeployment import InferenceDeployment
from kvtier.api.kvpool import KVPool
from kvtier.contract import CONFIG_HASH_ANNOTATION, HTTP_PORT, LMCACHE_API_PORT, METRICS_PATH, PROBE_METRICS_PORT
from kvtier.render import lmcache
from kvtier.render.meta import (
    config_map_name,
    headless_service_name,
    name_of,
    object_meta,
    selector_labels,
)
from kvtier.render.options import RenderOptions
from kvtier.render.pod import PodPlan, pod_template
from kvtier.render.volumes import KVVolume, StorageBinding, kv_volume, persistent_volumes


def config_hash(template: dict[str, Any], config: dict[str, str] | None) -> str:
    """A digest of everything a pod runs with: its template and its LMCache config file."""
    canonical = json.dumps({"template": template, "config": config}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def config_map_data(plan: PodPlan) -> dict[str, str] | None:
    """The LMCache config file of LMCacheInProcess (None in other modes)."""
    if plan.mode != "LMCacheInProcess":
        return None
    config = lmcache.in_process_config(plan.deployment, plan.volume)
    return {lmcache.CONFIG_KEY: yaml.safe_dump(config, sort_keys=False)}


def config_map(deployment: InferenceDeployment, data: dict[str, str]) -> dict[str, Any]:
    metadata = object_meta(deployment, config_map_name(deployment))
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def _service(deployment: InferenceDeployment, name: str, ports: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(deployment, name),
        "spec": {"selector": selector_labels(deployment), "ports": ports, **spec},
    }


def _port(name: str, number: int) -> dict[str, Any]:
    return {"name": name, "port": number, "targetPort": name, "protocol": "TCP"}


def services(plan: PodPlan) -> list[dict[str, Any]]:
    """The StatefulSet's headless Service (which also lists unready pods: the rebalancer sets their quota
    before they are Ready), and the ClusterIP Service of the OpenAI API."""
    deployment, options = plan.deployment, plan.options
    api = _port(HTTP_PORT, options.vllm_port)
    headless_ports = [api]
    if plan.mode == "LMCacheMP":
        headless_ports.append(_port(LMCACHE_API_PORT, options.lmcache_http_port))
    headless = _service(
        deployment, headless_service_name(deployment), headless_ports, clusterIP="None", publishNotReadyAddresses=True
    )
    return [headless, _service(deployment, name_of(deployment), [api], type="ClusterIP")]


def statefulset(plan: PodPlan, config: dict[str, str] | None) -> dict[str, Any]:
    deployment = plan.deployment
    template = pod_template(plan)
    template["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] = config_hash(template, config)
    spec: dict[str, Any] = {
        "replicas": deployment.spec.replicas,
        "serviceName": headless_service_name(deployment),
        "podManagementPolicy": "Parallel",
        "selector": {"matchLabels": selector_labels(deployment)},
        "template": template,
    }
    if plan.volume is not None:
        spec["volumeClaimTemplates"] = [plan.volume.backend.claim_template(deployment, template["metadata"]["labels"])]
        spec["persistentVolumeClaimRetentionPolicy"] = {"whenDeleted": "Retain", "whenScaled": "Delete"}
    metadata = object_meta(deployment, name_of(deployment))
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": metadata, "spec": spec}


def pod_disruption_budget(deployment: InferenceDeployment) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(deployment, name_of(deployment)),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(deployment)}},
    }


def pod_monitor(plan: PodPlan) -> dict[str, Any]:
    """A Prometheus Operator PodMonitor scraping every metrics port of the pod."""
    ports = [HTTP_PORT]
    if plan.mode == "LMCacheMP":
        ports.append(LMCACHE_API_PORT)
    if plan.probe:
        ports.append(PROBE_METRICS_PORT)
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": object_meta(plan.deployment, name_of(plan.deployment)),
        "spec": {
            "selector": {"matchLabels": selector_labels(plan.deployment)},
            "podMetricsEndpoints": [{"port": port, "path": METRICS_PATH} for port in ports],
        },
    }


def pod_plan(
    deployment: InferenceDeployment,
    pool: KVPool | None,
    options: RenderOptions,
    binding: StorageBinding | None = None,
) -> PodPlan:
    """Decide what a replica runs; raises `RenderError` for a spec that cannot work.

    A deployment with a storage tier whose pool is not given (unknown `poolRef`) is planned without it.
    """
    volume: KVVolume | None = None
    if pool is not None and deployment.spec.kv_cache.storage is not None:
        volume = kv_volume(deployment, pool, binding)
    lmcache.check_supported(deployment, volume)
    return PodPlan(deployment, volume, options)


def render_deployment(
    deployment: InferenceDeployment,
    pool: KVPool | None = None,
    options: RenderOptions | None = None,
    binding: StorageBinding | None = None,
) -> list[dict[str, Any]]:
    """Every child of `deployment`, in apply order (see the module docstring).

    `pool` is the KVPool named by `spec.kvCache.storage.poolRef` (None: render without a storage tier);
    `binding` is the pool ledger's grant (default: `default_binding`, for offline rendering).
    Raises a `RenderError` subclass, with a `reason` for a condition, when the spec cannot work.
    """
    options = options or RenderOptions()
    plan = pod_plan(deployment, pool, options, binding)
    config = config_map_data(plan)
    objects = [config_map(deployment, config)] if config is not None else []
    objects += services(plan)
    objects += [statefulset(plan, config), pod_disruption_budget(deployment)]
    if options.pod_monitor:
        objects.append(pod_monitor(plan))
    if plan.volume is not None:
        objects += persistent_volumes(deployment, plan.volume)
    return objects
