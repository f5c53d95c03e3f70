"""Behaviours where the embedded API emulator once disagreed with a real kube-apiserver: pinned on every ground,
so the emulator (the default of `kvtier demo` and `kvtier dev up`) stays true to Kubernetes."""

from __future__ import annotations

from kvtier.kube import PODS
from tests.conftest import wait_for
from tests.e2e.helpers import get


def test_an_empty_env_value_is_stored_as_no_value(cluster, namespace):
    """`value` is omitempty in the Go type: `value: ""` reads back as a variable without `value`."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "env", "namespace": namespace},
           "spec": {"containers": [{"name": "c", "image": "busybox:1",
                                    "env": [{"name": "EMPTY", "value": ""}, {"name": "SET", "value": "x"}]}]}}
    created = cluster.run(cluster.kube.create(PODS, pod))
    assert created["spec"]["containers"][0]["env"] == [{"name": "EMPTY"}, {"name": "SET", "value": "x"}]


def test_a_scheduled_pod_is_deleted_gracefully_and_goes_once_its_kubelet_stops_it(cluster, namespace):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "graceful", "namespace": namespace},
           "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}}
    cluster.run(cluster.kube.create(PODS, pod))
    wait_for(lambda: (get(cluster, PODS, namespace, "graceful") or {}).get("status", {}).get("phase") == "Running",
             timeout=60, message="the pod Running")
    cluster.run(cluster.kube.delete(PODS, namespace, "graceful"))
    wait_for(lambda: get(cluster, PODS, namespace, "graceful") is None, timeout=30, message="the pod gone")
