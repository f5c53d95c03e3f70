"""Children the spec no longer renders are pruned: a mode switch drops the LMCache config map, and stray
objects carrying a deployment's label are deleted (while the rendered ones stay).

Runs on the embedded cluster, or on a real one with KVTIER_E2E_KUBECONFIG (the operator installed).
"""

from __future__ import annotations

import json

from kvtier.contract import DEPLOYMENT_LABEL
from kvtier.kube import CONFIGMAPS, PODDISRUPTIONBUDGETS, SERVICES, STATEFULSETS
from tests.conftest import wait_for
from tests.e2e.helpers import create, create_deployment, deployment, get, kubectl


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
