"""Real RBAC: the operator runs with its own ServiceAccount's token and exactly the chart's ClusterRole, so the
real authorizer judges it. Without one verb it needs, a flow fails with a clear 403 in the operator's log and
a condition on the object, not a crash; given the verb back, the same operator (no restart) heals it.
"""

from __future__ import annotations

import copy
import logging

import pytest

from kvtier.kube import INFERENCEDEPLOYMENTS, STATEFULSETS, Resource
from tests.conftest import wait_for
from tests.e2e.helpers import condition, create_deployment, deployment, get

CLUSTER_ROLES = Resource("rbac.authorization.k8s.io", "v1", "clusterroles", namespaced=False)


@pytest.fixture
def operator_role(cluster):
    if not cluster.in_process or getattr(cluster.cluster, "operator_rbac", None) is None:
        pytest.skip("needs the operator running with its ServiceAccount under a real authorizer (the real ground)")
    role = next(obj for obj in cluster.cluster.operator_rbac if obj["kind"] == "ClusterRole")
    return role["metadata"]["name"]


def _without(role: dict, verb: str, group: str, resource: str) -> dict:
    trimmed = copy.deepcopy(role)
    for rule in trimmed["rules"]:
        if group in rule.get("apiGroups", []) and resource in rule.get("resources", []) and verb in rule["verbs"]:
            rule["verbs"] = [v for v in rule["verbs"] if v != verb]
    return trimmed


def test_a_missing_verb_is_a_403_in_the_log_and_a_condition_not_a_crash(cluster, namespace, operator_role, caplog):
    live = cluster.run(cluster.kube.get(CLUSTER_ROLES, None, operator_role))
    # Children are server-side applied: without `patch` on StatefulSets the deployment cannot run.
    cluster.run(cluster.kube.replace(CLUSTER_ROLES, _without(live, "patch", "apps", "statefulsets")))
    try:
        with caplog.at_level(logging.WARNING):
            create_deployment(cluster, deployment(namespace, "denied", None))
            infd = wait_for(
                lambda: (
                    (d := get(cluster, INFERENCEDEPLOYMENTS, namespace, "denied"))
                    and condition(d, "Degraded").get("reason") == "Forbidden"
                    and d
                ),
                timeout=60,
                message="Degraded=True, reason Forbidden",
            )
            message = condition(infd, "Degraded")["message"]
            assert "403" in message and "statefulsets" in message, message
            assert condition(infd, "Ready")["status"] == "False"
            wait_for(
                lambda: any(
                    "403" in record.getMessage() and "statefulsets" in record.getMessage() for record in caplog.records
                ),
                timeout=30,
                message="the 403 in the operator's log",
            )
        assert get(cluster, STATEFULSETS, namespace, "denied") is None
    finally:
        restored = cluster.run(cluster.kube.get(CLUSTER_ROLES, None, operator_role))
        restored["rules"] = live["rules"]
        cluster.run(cluster.kube.replace(CLUSTER_ROLES, restored))
    # The operator kept running: with the verb back, its retries create the StatefulSet.
    wait_for(lambda: get(cluster, STATEFULSETS, namespace, "denied"), timeout=60, message="the StatefulSet")
