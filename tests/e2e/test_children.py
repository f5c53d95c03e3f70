"""Children the spec no longer renders are pruned: a mode switch drops the LMCache config map, and stray
objects carrying a deployment's label are deleted (while the rendered ones stay). A child the API does
not take is named on the deployment (condition and Warning Event) and applied once the cause is gone.

Runs on the embedded cluster, or on a real one with KVTIER_E2E_KUBECONFIG (the operator installed).
"""

from __future__ import annotations

import json

import pytest

from kvtier.contract import DEPLOYMENT_LABEL
from kvtier.kube import CONFIGMAPS, INFERENCEDEPLOYMENTS, PODDISRUPTIONBUDGETS, SERVICES, STATEFULSETS
from tests.conftest import wait_for
from tests.e2e.helpers import condition, create, create_deployment, deployment, events, get, kubectl


def test_switching_mode_prunes_the_in_process_config_map(cluster, namespace):
    body = deployment(namespace, "inproc", None)
    body["spec"]["kvCache"]["mode"] = "LMCacheInProcess"
    create_deployment(cluster, body)
    config = wait_for(
        lambda: get(cluster, CONFIGMAPS, namespace, "inproc-lmcache"), timeout=30, message="the LMCache config map"
    )
    assert config["metadata"]["labels"][DEPLOYMENT_LABEL] == "inproc"
    kubectl(
        cluster,
        "patch",
        "infd",
        "inproc",
        "-n",
        namespace,
        "--type",
        "merge",
        "-p",
        json.dumps({"spec": {"kvCache": {"mode": "LMCacheMP"}}}),
    )
    wait_for(
        lambda: get(cluster, CONFIGMAPS, namespace, "inproc-lmcache") is None,
        timeout=30,
        message="the config map pruned after the switch to LMCacheMP",
    )
    assert get(cluster, STATEFULSETS, namespace, "inproc") is not None


def test_stray_children_with_the_deployments_label_are_pruned(cluster, namespace):
    create_deployment(cluster, deployment(namespace, "tidy", None))
    wait_for(lambda: get(cluster, STATEFULSETS, namespace, "tidy"), timeout=30, message="the StatefulSet")
    labels = {DEPLOYMENT_LABEL: "tidy"}
    metadata = {"name": "tidy-stray", "namespace": namespace, "labels": labels}
    strays = {
        CONFIGMAPS: {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {"k": "v"}},
        SERVICES: {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": metadata,
            "spec": {"selector": labels, "ports": [{"port": 80}]},
        },
        PODDISRUPTIONBUDGETS: {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": metadata,
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}},
        },
    }
    for resource, body in strays.items():
        create(cluster, resource, body)
    for resource in strays:
        wait_for(
            lambda: get(cluster, resource, namespace, "tidy-stray") is None,
            timeout=30,
            message=f"the stray {resource.plural} pruned",
        )
    assert get(cluster, SERVICES, namespace, "tidy") is not None
    assert get(cluster, PODDISRUPTIONBUDGETS, namespace, "tidy") is not None


def _stopped_by(cluster, namespace: str, name: str, reason: str) -> dict:
    """The deployment once its pass stops for `reason` (Degraded=True and Ready=False say it)."""
    return wait_for(
        lambda: (
            (d := get(cluster, INFERENCEDEPLOYMENTS, namespace, name))
            and condition(d, "Degraded").get("reason") == reason
            and d
        ),
        timeout=60,
        message=f"Degraded=True, reason {reason}",
    )


def _recovers(cluster, namespace: str, name: str) -> None:
    wait_for(lambda: get(cluster, SERVICES, namespace, name), timeout=60, message="the Service applied")
    wait_for(
        lambda: condition(get(cluster, INFERENCEDEPLOYMENTS, namespace, name), "Degraded").get("status") == "False",
        timeout=60,
        message="Degraded=False once the API takes the Service",
    )


def test_a_child_the_api_fails_to_apply_is_named_on_the_deployment(cluster, namespace):
    """The 300-deployment scale run met this on a real cluster: a full Service range (500 on every apply)."""
    if not cluster.embedded:
        pytest.skip("injects the failure with the embedded API server's fault injector")
    full = 'Internal error occurred: failed to allocate a serviceIP for Service "full": range is full'
    fault = cluster.server.faults.add(
        verb="patch", resource="services", namespace=namespace, status=500, message=full, times=None
    )
    try:
        create_deployment(cluster, deployment(namespace, "full", None))
        infd = _stopped_by(cluster, namespace, "full", "ApplyFailed")
        for kind in ("Degraded", "Ready"):
            message = condition(infd, kind)["message"]
            assert (
                message.startswith("Service full") and "was not applied: 500 " in message and "range is full" in message
            ), message
        assert condition(infd, "Ready")["status"] == "False"
        wait_for(
            lambda: any(
                e["type"] == "Warning" and e["reason"] == "ApplyFailed" and "range is full" in e["message"]
                for e in events(cluster, namespace, "full")
            ),
            timeout=30,
            message="a Warning Event ApplyFailed",
        )
        assert fault.hits > 0
    finally:
        cluster.server.faults.remove(fault)
    _recovers(cluster, namespace, "full")


def test_a_child_over_the_namespaces_resource_quota_is_named_on_the_deployment(cluster, namespace):
    if cluster.embedded:
        pytest.skip("the embedded API server has no ResourceQuota admission")
    kubectl(cluster, "create", "quota", "no-services", "--hard=services=0", "-n", namespace)
    wait_for(
        lambda: (
            json.loads(kubectl(cluster, "get", "quota", "no-services", "-n", namespace, "-o", "json").stdout)
            .get("status", {})
            .get("hard")
        ),
        timeout=60,
        message="the quota's usage computed",
    )
    create_deployment(cluster, deployment(namespace, "capped", None))
    message = condition(_stopped_by(cluster, namespace, "capped", "Forbidden"), "Degraded")["message"]
    assert message.startswith("Service capped") and "exceeded quota: no-services" in message, message
    kubectl(cluster, "delete", "quota", "no-services", "-n", namespace)
    _recovers(cluster, namespace, "capped")
