"""Behaviours where the embedded API emulator once disagreed with a real kube-apiserver: pinned on every ground,
so the emulator (the default of `kvtier demo` and `kvtier dev up`) stays true to Kubernetes."""

from __future__ import annotations

from kvtier.kube import PODS
from tests.conftest import wait_for
from tests.e2e.helpers import get


def test_an_empty_env_value_is_stored_as_no_value(cluster, namespace):
    """`value` is omitempty in the Go type: `value: ""` reads back as a variable without `value`."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "env", "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "busybox:1",
                    "env": [{"name": "EMPTY", "value": ""}, {"name": "SET", "value": "x"}],
                }
            ]
        },
    }
    created = cluster.run(cluster.kube.create(PODS, pod))
    assert created["spec"]["containers"][0]["env"] == [{"name": "EMPTY"}, {"name": "SET", "value": "x"}]


def test_a_scheduled_pod_is_deleted_gracefully_and_goes_once_its_kubelet_stops_it(cluster, namespace):
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "graceful", "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "busybox:1"}]},
    }
    cluster.run(cluster.kube.create(PODS, pod))
    wait_for(
        lambda: (get(cluster, PODS, namespace, "graceful") or {}).get("status", {}).get("phase") == "Running",
        timeout=60,
        message="the pod Running",
    )
    cluster.run(cluster.kube.delete(PODS, namespace, "graceful"))
    wait_for(lambda: get(cluster, PODS, namespace, "graceful") is None, timeout=30, message="the pod gone")


def test_a_pod_on_a_node_is_deleted_gracefully_an_unscheduled_one_at_once(cluster, namespace):
    """A pod bound to a node gets `deletionTimestamp` and the grace period and stays until it is deleted with grace
    0 (what its kubelet does once the containers stopped); a pod no scheduler bound goes at once."""

    def pod(name, **spec):
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"name": "c", "image": "busybox:1"}], **spec},
        }

    cluster.run(cluster.kube.create(PODS, pod("bound", nodeName="node-without-a-kubelet")))
    cluster.run(cluster.kube.create(PODS, pod("pending", schedulerName="no-such-scheduler")))
    cluster.run(cluster.kube.delete(PODS, namespace, "pending"))
    assert get(cluster, PODS, namespace, "pending") is None
    cluster.run(cluster.kube.delete(PODS, namespace, "bound"))
    terminating = get(cluster, PODS, namespace, "bound")
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 30 and terminating["metadata"]["deletionTimestamp"]
    cluster.run(cluster.kube.delete(PODS, namespace, "bound", grace_period_seconds=0))
    wait_for(lambda: get(cluster, PODS, namespace, "bound") is None, timeout=10, message="the pod gone")


def _crd(group: str, rule: dict) -> dict:
    schema = {
        "type": "object",
        "properties": {
            "spec": {"type": "object", "properties": {"size": {"type": "integer"}}, "x-kubernetes-validations": [rule]}
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"gadgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "listKind": "GadgetList"},
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}],
        },
    }


def test_a_crd_rule_whose_field_path_names_an_undeclared_field_is_refused(cluster):
    from kvtier.kube import CUSTOMRESOURCEDEFINITIONS, APIError

    refused = _crd("refused.example.com", {"rule": "self.size > 0", "fieldPath": ".metadata.name"})
    try:
        cluster.run(cluster.kube.request("POST", CUSTOMRESOURCEDEFINITIONS.path(), refused, params={"dryRun": "All"}))
    except APIError as error:
        assert error.status == 422 and "fieldPath" in str(error), error
    else:
        raise AssertionError("the CRD was accepted")
    accepted = _crd("accepted.example.com", {"rule": "self.size > 0", "fieldPath": ".size"})
    cluster.run(cluster.kube.request("POST", CUSTOMRESOURCEDEFINITIONS.path(), accepted, params={"dryRun": "All"}))


def test_a_crd_whose_metadata_schema_says_more_than_name_and_generate_name_is_refused(cluster):
    """Found on the real control plane: a description on the root's `metadata` made it refuse our CRDs."""
    from kvtier.kube import CUSTOMRESOURCEDEFINITIONS, APIError

    refused = _crd("described.example.com", {"rule": "self.size > 0"})
    refused["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["metadata"] = {
        "type": "object",
        "description": "object metadata",
    }
    try:
        cluster.run(cluster.kube.request("POST", CUSTOMRESOURCEDEFINITIONS.path(), refused, params={"dryRun": "All"}))
    except APIError as error:
        assert error.status == 422 and "metadata" in str(error) and "generateName" in str(error), error
    else:
        raise AssertionError("the CRD was accepted")
    accepted = _crd("named.example.com", {"rule": "self.size > 0"})
    accepted["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["metadata"] = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 20, "description": "at most 20"}},
    }
    cluster.run(cluster.kube.request("POST", CUSTOMRESOURCEDEFINITIONS.path(), accepted, params={"dryRun": "All"}))


def test_a_crd_whose_default_fails_its_own_rule_is_refused(cluster):
    """(kvtier's `kvCache: {}` default once failed its `cpu is required` rule: the real API server refused the CRD.)"""
    from kvtier.kube import CUSTOMRESOURCEDEFINITIONS, APIError

    crd = _crd("defaults.example.com", {"rule": "has(self.size)", "message": "size is required"})
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["default"] = {}
    try:
        cluster.run(cluster.kube.request("POST", CUSTOMRESOURCEDEFINITIONS.path(), crd, params={"dryRun": "All"}))
    except APIError as error:
        assert error.status == 422 and "default" in str(error) and "size is required" in str(error), error
    else:
        raise AssertionError("the CRD was accepted")
