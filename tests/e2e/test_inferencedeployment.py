"""InferenceDeployment end to end: the examples run, edits roll, drift is corrected, deletion cleans up,
and specs that cannot work say why instead of creating pods.

Runs on the embedded cluster, or on a real one with KVTIER_E2E_KUBECONFIG (the operator installed).
"""

from __future__ import annotations

import json

import pytest

from kvtier.contract import CONFIG_HASH_ANNOTATION, QUOTA_GATE
from kvtier.kube import (
    INFERENCEDEPLOYMENTS,
    KVPOOLS,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    PODS,
    SERVICES,
    STATEFULSETS,
)
from tests.conftest import EXAMPLES, wait_for
from tests.e2e.helpers import (
    condition,
    create_deployment,
    create_pool,
    csi_pool,
    delete_pool,
    deployment,
    ensure_sim_storage_class,
    events,
    get,
    items,
    kubectl,
    posted,
)

SELECTOR = "app.kubernetes.io/instance=coder-480b"


def ready_pods(cluster, namespace, selector):
    pods = items(cluster, PODS, namespace, selector)
    return [p for p in pods if condition(p, "Ready").get("status") == "True"]


@pytest.fixture(scope="module")
def examples(cluster):
    """`kubectl apply -f manifests/examples/`, and everything deleted afterwards."""
    kubectl(cluster, "apply", "-f", str(EXAMPLES))
    yield
    kubectl(cluster, "delete", "-f", str(EXAMPLES), "--wait=false", check=False)
    wait_for(lambda: get(cluster, INFERENCEDEPLOYMENTS, "default", "coder-480b") is None, timeout=60)
    wait_for(lambda: get(cluster, KVPOOLS, None, "fx100-a") is None, timeout=60)


def test_examples_yield_ready_pods_on_their_array_volumes(cluster, examples):
    wait_for(lambda: len(ready_pods(cluster, "default", SELECTOR)) == 2, timeout=60, message="2 ready replicas")
    infd = wait_for(
        lambda: (
            (d := get(cluster, INFERENCEDEPLOYMENTS, "default", "coder-480b"))
            and condition(d, "Ready").get("status") == "True"
            and d
        ),
        message="Ready=True",
    )
    assert condition(infd, "StorageBound")["status"] == "True"
    assert infd["status"]["observedGeneration"] == infd["metadata"]["generation"]
    assert infd["status"]["kv"]["storage"]["quota"] == "4Ti"
    pool = get(cluster, KVPOOLS, None, "fx100-a")
    assert (pool["status"]["allocated"], pool["status"]["available"]) == ("8Ti", "82Ti")
    [allocation] = pool["status"]["allocations"]
    assert allocation["uid"] == infd["metadata"]["uid"] and len(allocation["volumes"]) == 2
    for pod in ready_pods(cluster, "default", SELECTOR):
        assert condition(pod, QUOTA_GATE)["status"] == "True"
        claim = get(cluster, PERSISTENT_VOLUME_CLAIMS, "default", f"kv-store-{pod['metadata']['name']}")
        volume = get(cluster, PERSISTENT_VOLUMES, None, claim["spec"]["volumeName"])
        assert volume["spec"]["csi"]["driver"] == "csi.nvmf.com"
        assert volume["spec"]["csi"]["volumeHandle"] in allocation["volumes"]
        assert volume["spec"]["csi"]["volumeAttributes"]["targetTrType"] == "tcp"
    table = kubectl(cluster, "get", "infd", "coder-480b", "-n", "default").stdout
    assert "AllReplicasReady" in table and "4Ti" in table
    assert "True" in kubectl(cluster, "get", "kvp", "fx100-a").stdout


def test_a_normal_start_says_so_in_words_without_a_warning(cluster, examples):
    wait_for(
        lambda: condition(get(cluster, INFERENCEDEPLOYMENTS, "default", "coder-480b"), "Ready").get("status") == "True",
        timeout=60,
        message="Ready=True",
    )
    posted(cluster, "default", "coder-480b", "AllReplicasReady")
    posted(cluster, "default", "fx100-a", "Available")
    # kvtier's own Events (on the real ground the endpoints controller also warns that the simulated pods'
    # loopback addresses cannot back a Service: that is the test ground's, not the operator's).
    ours = [
        e
        for e in events(cluster, "default", "coder-480b") + events(cluster, "default", "fx100-a")
        if e["involvedObject"]["kind"] in ("InferenceDeployment", "KVPool")
    ]
    assert [(e["reason"], e["message"]) for e in ours if e["type"] == "Warning"] == []
    messages = {e["reason"]: e["message"] for e in ours}
    assert messages["AllReplicasReady"] == "InferenceDeployment default/coder-480b: 2/2 replicas ready"
    assert messages["Available"].startswith("KVPool fx100-a: ")
    assert "(s)" not in " ".join(messages.values())


def test_editing_the_spec_rolls_the_pods(cluster, examples):
    wait_for(lambda: len(ready_pods(cluster, "default", SELECTOR)) == 2, timeout=60)
    before = {p["metadata"]["uid"] for p in items(cluster, PODS, "default", SELECTOR)}
    old_hash = get(cluster, STATEFULSETS, "default", "coder-480b")["spec"]["template"]["metadata"]["annotations"][
        CONFIG_HASH_ANNOTATION
    ]
    kubectl(
        cluster,
        "patch",
        "infd",
        "coder-480b",
        "-n",
        "default",
        "--type",
        "merge",
        "-p",
        json.dumps({"spec": {"engine": {"args": ["--enable-expert-parallel", "--max-num-seqs", "16"]}}}),
    )

    def rolled():
        pods = ready_pods(cluster, "default", SELECTOR)
        return len(pods) == 2 and not before & {p["metadata"]["uid"] for p in pods} and pods

    pods = wait_for(rolled, timeout=90, message="both replicas replaced")
    args = next(c for c in pods[0]["spec"]["containers"] if c["name"] == "vllm")["args"]
    assert "16" in args
    template = get(cluster, STATEFULSETS, "default", "coder-480b")["spec"]["template"]
    assert template["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] != old_hash


def test_a_deleted_child_comes_back(cluster, examples):
    original = get(cluster, SERVICES, "default", "coder-480b")
    assert original is not None
    kubectl(cluster, "delete", "service", "coder-480b", "-n", "default")
    restored = wait_for(
        lambda: (
            (s := get(cluster, SERVICES, "default", "coder-480b"))
            and s["metadata"]["uid"] != original["metadata"]["uid"]
            and s
        ),
        message="the Service back",
    )
    assert restored["spec"]["ports"] == original["spec"]["ports"]
    assert restored["metadata"]["ownerReferences"][0]["kind"] == "InferenceDeployment"


def test_kubectl_scale_claims_another_volume(cluster, examples):
    kubectl(cluster, "scale", "infd", "coder-480b", "-n", "default", "--replicas=3")
    wait_for(lambda: len(ready_pods(cluster, "default", SELECTOR)) == 3, timeout=60, message="3 ready replicas")
    pool = get(cluster, KVPOOLS, None, "fx100-a")
    assert pool["status"]["allocated"] == "12Ti" and len(pool["status"]["allocations"][0]["volumes"]) == 3
    kubectl(cluster, "scale", "infd", "coder-480b", "-n", "default", "--replicas=2")
    wait_for(lambda: get(cluster, KVPOOLS, None, "fx100-a")["status"]["allocated"] == "8Ti", message="release")
    wait_for(lambda: len(items(cluster, PODS, "default", SELECTOR)) == 2)


def test_deleting_the_deployment_removes_everything_and_frees_the_pool(cluster, namespace):
    ensure_sim_storage_class(cluster)
    pool = f"{namespace}-pool"
    create_pool(cluster, csi_pool(pool, "4Ti"))
    create_deployment(cluster, deployment(namespace, "small", pool, replicas=2))
    wait_for(lambda: len(ready_pods(cluster, namespace, "app.kubernetes.io/instance=small")) == 2, timeout=60)
    assert get(cluster, KVPOOLS, None, pool)["status"]["allocated"] == "2Ti"
    kubectl(cluster, "delete", "infd", "small", "-n", namespace)
    wait_for(lambda: get(cluster, INFERENCEDEPLOYMENTS, namespace, "small") is None, message="the deployment gone")
    selector = "kvtier.io/deployment=small"
    wait_for(
        lambda: (
            not items(cluster, PODS, namespace, selector)
            and not items(cluster, STATEFULSETS, namespace)
            and not items(cluster, SERVICES, namespace, selector)
            and not items(cluster, PERSISTENT_VOLUME_CLAIMS, namespace, selector)
        ),
        message="children gone",
    )
    status = get(cluster, KVPOOLS, None, pool)["status"]
    assert (status["allocated"], status["allocations"]) == ("0", [])
    delete_pool(cluster, pool)


@pytest.mark.parametrize(
    ("tp", "said"),
    [(16, "GPU"), (3, "does not divide the GPUs of any node")],
    ids=["more-gpus-than-a-node", "tp-strands-gpus"],
)
def test_a_spec_that_fits_no_node_says_so_and_creates_no_pods(cluster, namespace, tp, said):
    create_deployment(cluster, deployment(namespace, "too-wide", None, tp=tp))
    infd = wait_for(
        lambda: (
            (d := get(cluster, INFERENCEDEPLOYMENTS, namespace, "too-wide"))
            and condition(d, "Ready").get("reason") == "DoesNotFit"
            and d
        ),
        message="DoesNotFit",
    )
    assert said in condition(infd, "Ready")["message"]
    assert condition(infd, "Degraded")["status"] == "True"
    assert get(cluster, STATEFULSETS, namespace, "too-wide") is None
    assert all(e["type"] == "Warning" for e in posted(cluster, namespace, "too-wide", "DoesNotFit"))


def test_a_horizontal_pod_autoscaler_targets_the_scale_subresource(cluster, examples):
    """What an HPA controller needs: an autoscaling/v2 HPA naming the kind is accepted, and the scale
    subresource's selector picks exactly the deployment's replicas. (The embedded cluster runs no HPA
    controller, and `kubectl autoscale` posts protobuf, which it does not speak: the HPA is applied.)"""
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "coder-480b", "namespace": "default"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "kvtier.io/v1alpha1", "kind": "InferenceDeployment", "name": "coder-480b"},
            "minReplicas": 1,
            "maxReplicas": 3,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}},
                }
            ],
        },
    }
    kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(hpa))
    try:
        path = "/apis/kvtier.io/v1alpha1/namespaces/default/inferencedeployments/coder-480b/scale"
        scale = wait_for(
            lambda: (s := json.loads(kubectl(cluster, "get", "--raw", path).stdout))["status"].get("replicas") and s,
            message="the scale subresource to report replicas",
        )
        pods = items(cluster, PODS, "default", scale["status"]["selector"])
        assert sorted(p["metadata"]["name"] for p in pods) == [
            f"coder-480b-{i}" for i in range(scale["status"]["replicas"])
        ]
    finally:
        kubectl(cluster, "delete", "hpa", "coder-480b", "-n", "default", "--ignore-not-found")
