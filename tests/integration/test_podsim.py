"""The pod simulator behind the embedded cluster: StatefulSets and Deployments become scheduled,
running, probed pods with bound volumes, as kube-controller-manager, the scheduler and kubelets would do."""

import copy

import aiohttp
import pytest

from kvtier.kube import (
    DEPLOYMENTS,
    JOBS,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    PODS,
    STATEFULSETS,
    STORAGECLASSES,
)
from kvtier.testing.podsim import is_ready
from tests.conftest import wait_for

pytestmark = pytest.mark.usefixtures("embedded_only")


@pytest.fixture
def embedded_only(cluster):
    if not cluster.embedded:
        pytest.skip("tests the embedded cluster's pod simulator")


def statefulset(namespace, name="web", replicas=2, *, gpus=1, gates=(), claim_class="fast", policy="Parallel"):
    container = {
        "name": "engine",
        "image": "vllm/vllm-openai:v0.33.0",
        "ports": [{"containerPort": 8000, "name": "http"}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}},
        "resources": {
            "requests": {"cpu": "4", "memory": "64Gi", "nvidia.com/gpu": str(gpus)},
            "limits": {"nvidia.com/gpu": str(gpus)},
        },
    }
    body = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "podManagementPolicy": policy,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [container], "readinessGates": [{"conditionType": g} for g in gates]},
            },
        },
    }
    if claim_class is not None:
        body["spec"]["volumeClaimTemplates"] = [
            {
                "metadata": {"name": "kv-store"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": claim_class,
                    "volumeMode": "Block",
                    "resources": {"requests": {"storage": "1Ti"}},
                },
            }
        ]
    return body


@pytest.fixture
def storage_class(cluster):
    body = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": "fast"},
        "provisioner": "csi.example.com",
        "reclaimPolicy": "Delete",
    }
    if cluster.run(cluster.kube.get_or_none(STORAGECLASSES, None, "fast")) is None:
        cluster.run(cluster.kube.create(STORAGECLASSES, body))


def pods(cluster, namespace):
    return {p["metadata"]["name"]: p for p in cluster.run(cluster.kube.list(PODS, namespace))["items"]}


def ready_pods(cluster, namespace):
    return sorted(name for name, pod in pods(cluster, namespace).items() if is_ready(pod))


def test_nodes_are_declared_with_their_resources(cluster):
    nodes = cluster.run(cluster.kube.list(NODES))["items"]
    assert len(nodes) == 4
    assert nodes[0]["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert nodes[0]["status"]["allocatable"]["memory"] == "2Ti"


def test_statefulset_pods_get_claims_volumes_addresses_and_readiness(cluster, namespace, storage_class):
    cluster.run(cluster.kube.create(STATEFULSETS, statefulset(namespace)))
    assert wait_for(lambda: ready_pods(cluster, namespace) == ["web-0", "web-1"], message="2 ready pods")
    running = pods(cluster, namespace)
    addresses = {pod["status"]["podIP"] for pod in running.values()}
    assert len(addresses) == 2 and all(a.startswith("127.") and a != "127.0.0.1" for a in addresses)
    claims = cluster.run(cluster.kube.list(PERSISTENT_VOLUME_CLAIMS, namespace))["items"]
    assert sorted(c["metadata"]["name"] for c in claims) == ["kv-store-web-0", "kv-store-web-1"]
    assert all(c["status"]["phase"] == "Bound" for c in claims)
    pod = running["web-0"]
    assert {"name": "kv-store", "persistentVolumeClaim": {"claimName": "kv-store-web-0"}} in pod["spec"]["volumes"]
    assert pod["spec"]["hostname"] == "web-0" and pod["metadata"]["labels"]["app"] == "web"

    async def health(address):
        async with aiohttp.ClientSession() as session, session.get(f"http://{address}:8000/health") as reply:
            return reply.status

    assert cluster.run(health(pod["status"]["podIP"])) == 200
    sts = wait_for(
        lambda: (
            cluster.run(cluster.kube.get(STATEFULSETS, namespace, "web")).get("status", {}).get("readyReplicas") == 2
            and cluster.run(cluster.kube.get(STATEFULSETS, namespace, "web"))
        )
    )
    assert sts["status"]["replicas"] == 2


def test_readiness_gate_holds_a_pod_until_its_condition_is_true(cluster, namespace, storage_class):
    gate = "kvtier.io/kv-quota-applied"
    cluster.run(cluster.kube.create(STATEFULSETS, statefulset(namespace, replicas=1, gates=[gate])))
    pod = wait_for(
        lambda: (
            pods(cluster, namespace).get("web-0", {}).get("status", {}).get("containerStatuses")
            and pods(cluster, namespace)["web-0"]
        ),
        message="a running pod",
    )
    assert wait_for(lambda: all(s["ready"] for s in pods(cluster, namespace)["web-0"]["status"]["containerStatuses"]))
    assert not is_ready(pods(cluster, namespace)["web-0"])
    conditions = pods(cluster, namespace)["web-0"]["status"]["conditions"]
    patched = [*conditions, {"type": gate, "status": "True", "lastTransitionTime": conditions[0]["lastTransitionTime"]}]
    cluster.run(
        cluster.kube.patch(
            PODS, namespace, pod["metadata"]["name"], {"status": {"conditions": patched}}, subresource="status"
        )
    )
    wait_for(lambda: ready_pods(cluster, namespace) == ["web-0"], message="the gate to open")
    assert any(c["type"] == gate for c in pods(cluster, namespace)["web-0"]["status"]["conditions"])


def test_a_deleted_pod_comes_back_with_its_volume(cluster, namespace, storage_class):
    cluster.run(cluster.kube.create(STATEFULSETS, statefulset(namespace, replicas=1)))
    first = wait_for(lambda: ready_pods(cluster, namespace) == ["web-0"] and pods(cluster, namespace)["web-0"])
    cluster.run(cluster.kube.delete(PODS, namespace, "web-0"))
    again = wait_for(
        lambda: (
            (p := pods(cluster, namespace).get("web-0"))
            and is_ready(p)
            and p["metadata"]["uid"] != first["metadata"]["uid"]
            and p
        ),
        message="web-0 to return",
    )
    claims = cluster.run(cluster.kube.list(PERSISTENT_VOLUME_CLAIMS, namespace))["items"]
    assert [c["metadata"]["uid"] for c in claims] == [c["metadata"]["uid"] for c in claims[:1]]  # one claim, reused
    assert again["spec"]["volumes"] == first["spec"]["volumes"]


def test_template_change_rolls_one_pod_at_a_time(cluster, namespace, storage_class):
    body = statefulset(namespace, replicas=3)
    cluster.run(cluster.kube.create(STATEFULSETS, body))
    wait_for(lambda: len(ready_pods(cluster, namespace)) == 3, message="3 ready pods")
    old_uids = {p["metadata"]["uid"] for p in pods(cluster, namespace).values()}
    cluster.run(
        cluster.kube.patch(
            STATEFULSETS, namespace, "web", {"spec": {"template": {"metadata": {"annotations": {"rev": "2"}}}}}
        )
    )
    fewest_ready = 3

    def rolled():
        nonlocal fewest_ready
        current = pods(cluster, namespace)
        fewest_ready = min(fewest_ready, sum(is_ready(p) for p in current.values()))
        return (
            len(current) == 3
            and all(is_ready(p) for p in current.values())
            and not old_uids & {p["metadata"]["uid"] for p in current.values()}
        )

    wait_for(rolled, timeout=30, interval=0.02, message="every pod replaced")
    assert fewest_ready >= 2, "more than one pod was down at once"
    assert all(p["metadata"]["annotations"].get("rev") == "2" for p in pods(cluster, namespace).values())


def test_scale_down_removes_the_highest_ordinal_and_keeps_its_claim(cluster, namespace, storage_class):
    cluster.run(cluster.kube.create(STATEFULSETS, statefulset(namespace, replicas=2)))
    wait_for(lambda: len(ready_pods(cluster, namespace)) == 2)
    cluster.run(cluster.kube.patch(STATEFULSETS, namespace, "web", {"spec": {"replicas": 1}}))
    wait_for(lambda: sorted(pods(cluster, namespace)) == ["web-0"], message="web-1 to go")
    claims = cluster.run(cluster.kube.list(PERSISTENT_VOLUME_CLAIMS, namespace))["items"]
    assert sorted(c["metadata"]["name"] for c in claims) == ["kv-store-web-0", "kv-store-web-1"]


def test_pod_that_fits_no_node_stays_pending_with_the_reason(cluster, namespace, storage_class):
    cluster.run(cluster.kube.create(STATEFULSETS, statefulset(namespace, replicas=1, gpus=16)))

    def unschedulable():
        pod = pods(cluster, namespace).get("web-0")
        condition = pod and next((c for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled"), None)
        return condition if condition and condition["status"] == "False" else None

    condition = wait_for(unschedulable, message="PodScheduled=False")
    assert condition["reason"] == "Unschedulable"
    assert condition["message"] == "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    assert not pods(cluster, namespace)["web-0"]["spec"].get("nodeName")


def test_static_volume_binds_by_claim_ref_and_unbound_claims_hold_the_pod(cluster, namespace):
    static = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"static-{namespace}"},
        "spec": {
            "capacity": {"storage": "2Ti"},
            "accessModes": ["ReadWriteOnce"],
            "volumeMode": "Block",
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "claimRef": {"namespace": namespace, "name": "kv-store-web-0"},
            "csi": {"driver": "csi.nvmf.com", "volumeHandle": "5b0c8d4e-0f1a-4c2b-9d3e-000000000000"},
        },
    }
    cluster.run(cluster.kube.create(PERSISTENT_VOLUMES, static))
    cluster.run(cluster.kube.create(STATEFULSETS, statefulset(namespace, replicas=2, claim_class="")))
    wait_for(lambda: ready_pods(cluster, namespace) == ["web-0"], message="web-0 on the static volume")
    claim = cluster.run(cluster.kube.get(PERSISTENT_VOLUME_CLAIMS, namespace, "kv-store-web-0"))
    assert claim["spec"]["volumeName"] == f"static-{namespace}"
    web1 = wait_for(
        lambda: (
            (
                c := next(
                    (
                        c
                        for c in pods(cluster, namespace)["web-1"]["status"].get("conditions", [])
                        if c["type"] == "PodScheduled"
                    ),
                    None,
                )
            )
            and c
        )
    )
    assert web1["status"] == "False" and "unbound" in web1["message"]
    cluster.run(cluster.kube.delete(STATEFULSETS, namespace, "web"))
    cluster.run(cluster.kube.delete(PERSISTENT_VOLUME_CLAIMS, namespace, "kv-store-web-0"))
    wait_for(
        lambda: (
            cluster.run(cluster.kube.get(PERSISTENT_VOLUMES, None, f"static-{namespace}"))
            .get("status", {})
            .get("phase")
            == "Released"
        ),
        message="the Retain volume to be Released",
    )
    cluster.run(cluster.kube.delete(PERSISTENT_VOLUMES, None, f"static-{namespace}"))


def test_deployment_pods_roll_new_before_old(cluster, namespace):
    body = statefulset(namespace, name="api", replicas=2, claim_class=None)
    body = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": copy.deepcopy(body["metadata"]),
        "spec": {k: v for k, v in body["spec"].items() if k in ("replicas", "selector", "template")},
    }
    cluster.run(cluster.kube.create(DEPLOYMENTS, body))
    wait_for(lambda: len(ready_pods(cluster, namespace)) == 2, message="2 deployment pods")
    old = set(pods(cluster, namespace))
    cluster.run(
        cluster.kube.patch(
            DEPLOYMENTS, namespace, "api", {"spec": {"template": {"metadata": {"annotations": {"rev": "2"}}}}}
        )
    )
    wait_for(
        lambda: len(ready_pods(cluster, namespace)) == 2 and not old & set(pods(cluster, namespace)),
        message="the new revision to replace the old",
    )
    status = cluster.run(cluster.kube.get(DEPLOYMENTS, namespace, "api"))["status"]
    assert status["readyReplicas"] == 2 and status["updatedReplicas"] == 2


def test_an_expanded_claim_gets_its_volume_and_capacity_grown(cluster, namespace):
    if cluster.run(cluster.kube.get_or_none(STORAGECLASSES, None, "expandable")) is None:
        cluster.run(
            cluster.kube.create(
                STORAGECLASSES,
                {
                    "apiVersion": "storage.k8s.io/v1",
                    "kind": "StorageClass",
                    "metadata": {"name": "expandable"},
                    "provisioner": "csi.example.com",
                    "reclaimPolicy": "Delete",
                    "allowVolumeExpansion": True,
                },
            )
        )
    cluster.run(cluster.kube.create(STATEFULSETS, statefulset(namespace, replicas=1, claim_class="expandable")))
    wait_for(lambda: ready_pods(cluster, namespace) == ["web-0"], message="web-0 ready")
    cluster.run(
        cluster.kube.patch(
            PERSISTENT_VOLUME_CLAIMS,
            namespace,
            "kv-store-web-0",
            {"spec": {"resources": {"requests": {"storage": "2Ti"}}}},
        )
    )
    claim = wait_for(
        lambda: (
            (c := cluster.run(cluster.kube.get(PERSISTENT_VOLUME_CLAIMS, namespace, "kv-store-web-0")))["status"][
                "capacity"
            ]["storage"]
            == "2Ti"
            and c
        ),
        message="the claim's capacity to grow",
    )
    volume = cluster.run(cluster.kube.get(PERSISTENT_VOLUMES, None, claim["spec"]["volumeName"]))
    assert volume["spec"]["capacity"]["storage"] == "2Ti"


def job(namespace, name, backoff_limit=1):
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "backoffLimit": backoff_limit,
            "template": {
                "metadata": {},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox", "command": ["true"]}],
                },
            },
        },
    }


def test_a_job_runs_one_pod_to_completion(cluster, namespace):
    cluster.run(cluster.kube.create(JOBS, job(namespace, "once")))
    done = wait_for(
        lambda: (
            (j := cluster.run(cluster.kube.get(JOBS, namespace, "once"))).get("status", {}).get("succeeded") == 1 and j
        ),
        message="the Job to succeed",
    )
    assert [c["type"] for c in done["status"]["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    [pod] = pods(cluster, namespace).values()
    assert pod["status"]["phase"] == "Succeeded" and pod["metadata"]["labels"]["job-name"] == "once"
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0


def test_a_failing_job_retries_until_its_backoff_limit(cluster, namespace):
    simulator = cluster.cluster.simulator
    simulator.exit_code = lambda pod: 1 if pod["metadata"]["namespace"] == namespace else 0
    try:
        cluster.run(cluster.kube.create(JOBS, job(namespace, "doomed", backoff_limit=1)))
        failed = wait_for(
            lambda: (
                (j := cluster.run(cluster.kube.get(JOBS, namespace, "doomed"))).get("status", {}).get("conditions")
                and j
            ),
            message="the Job to fail",
        )
    finally:
        simulator.exit_code = lambda pod: 0
    assert failed["status"]["failed"] == 2 and failed["status"]["conditions"][-1]["reason"] == "BackoffLimitExceeded"
    assert sorted(p["status"]["phase"] for p in pods(cluster, namespace).values()) == ["Failed", "Failed"]
