"""Volumes after creation, end to end: a raised `max` expands CSI claims (or says why it cannot) without
ever sending a StatefulSet update the API server forbids, and a static pool's namespaces are wiped, or
retained, before anyone else may bind them."""

from __future__ import annotations

import pytest

from kvtier.api.units import parse_quantity
from kvtier.kube import (
    INFERENCEDEPLOYMENTS,
    JOBS,
    KVPOOLS,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    STATEFULSETS,
    STORAGECLASSES,
)
from tests.conftest import wait_for
from tests.e2e.helpers import condition, create_deployment, create_pool, deployment, get, items, kubectl, posted

UUID = "7d6f3a52-1c1e-4c5b-9a43-0000000000{:02d}"
OPERATOR_NAMESPACE = "kvtier-system"


def storage_class(cluster, name, expandable):
    if get(cluster, STORAGECLASSES, None, name) is None:
        body = {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": name},
            "provisioner": "csi.example.com",
            "reclaimPolicy": "Delete",
        }
        if expandable:
            body["allowVolumeExpansion"] = True
        cluster.run(cluster.kube.create(STORAGECLASSES, body))


@pytest.fixture
def pool(cluster, namespace):
    """A pool named after the test's namespace; deleted (after its deployments) at the end."""
    name = f"{namespace}-pool"
    yield name
    kubectl(cluster, "delete", "infd", "--all", "-n", namespace, "--wait=false")
    wait_for(lambda: not items(cluster, INFERENCEDEPLOYMENTS, namespace), timeout=30, message="deployments gone")
    body = get(cluster, KVPOOLS, None, name)
    if body and body["spec"].get("volumeReclaim") == "Retain":  # the administrator's part
        kubectl(cluster, "delete", "pv", "-l", f"kvtier.io/pool={name}")
    kubectl(cluster, "delete", "kvp", name, "--ignore-not-found", "--timeout=30s")


def rejected(cluster, resource, since):
    """Requests for `resource` the API server refused with 422 or 403 since `since` (a request count)."""
    return [r for r in cluster.server.requests.records[since:] if r.resource == resource and r.status in (403, 422)]


def grow(cluster, namespace, name, size):
    """Raise `max` (and `min`, which moves the ledger's quota at once, without waiting for the rebalancer)."""
    storage = {"min": size, "request": size, "max": size}
    kubectl(
        cluster,
        "patch",
        "infd",
        name,
        "-n",
        namespace,
        "--type",
        "merge",
        "-p",
        f'{{"spec": {{"kvCache": {{"storage": {storage!r}}}}}}}'.replace("'", '"'),
    )


def claim_sizes(cluster, namespace, name, key):
    claims = items(cluster, PERSISTENT_VOLUME_CLAIMS, namespace, f"kvtier.io/deployment={name}")
    if key == "capacity":
        return sorted((c.get("status") or {}).get("capacity", {}).get("storage") for c in claims)
    return sorted(c["spec"]["resources"]["requests"]["storage"] for c in claims)


def csi_pool(name, storage_class_name):
    return {
        "apiVersion": "kvtier.io/v1alpha1",
        "kind": "KVPool",
        "metadata": {"name": name},
        "spec": {
            "capacity": "8Ti",
            "storage": {"csi": {"storageClassName": storage_class_name}},
            "rebalance": {"policy": "Static"},
        },
    }


def running(cluster, namespace, name, replicas):
    return wait_for(
        lambda: (
            (d := get(cluster, INFERENCEDEPLOYMENTS, namespace, name))
            and condition(d, "Ready").get("status") == "True"
            and d["status"].get("readyReplicas") == replicas
            and d
        ),
        timeout=30,
        message=f"{name} ready",
    )


def test_raising_max_expands_the_claims_when_the_class_allows(cluster, namespace, pool):
    if not cluster.embedded:
        pytest.skip("reads the embedded API server's request log")
    storage_class(cluster, "sim-expandable", expandable=True)
    create_pool(cluster, csi_pool(pool, "sim-expandable"))
    create_deployment(cluster, deployment(namespace, "grow", pool, replicas=2, request="1Ti"))
    running(cluster, namespace, "grow", 2)
    since = len(cluster.server.requests.records)
    grow(cluster, namespace, "grow", "2Ti")
    wait_for(
        lambda: claim_sizes(cluster, namespace, "grow", "capacity") == ["2Ti", "2Ti"],
        timeout=20,
        message="both claims expanded",
    )
    assert claim_sizes(cluster, namespace, "grow", "request") == ["2Ti", "2Ti"]
    wait_for(
        lambda: get(cluster, INFERENCEDEPLOYMENTS, namespace, "grow")["status"]["kv"]["storage"]["quota"] == "2Ti",
        message="the quota to follow the expanded volumes",
    )
    template = get(cluster, STATEFULSETS, namespace, "grow")["spec"]["volumeClaimTemplates"][0]
    assert template["spec"]["resources"]["requests"]["storage"] == "1Ti", "claim templates never change"
    assert condition(get(cluster, INFERENCEDEPLOYMENTS, namespace, "grow"), "Degraded")["status"] == "False"
    assert not rejected(cluster, "statefulsets", since) and not rejected(cluster, "persistentvolumeclaims", since)


def test_raising_max_says_plainly_when_the_class_forbids_expansion(cluster, namespace, pool):
    if not cluster.embedded:
        pytest.skip("reads the embedded API server's request log")
    storage_class(cluster, "sim-fixed", expandable=False)
    create_pool(cluster, csi_pool(pool, "sim-fixed"))
    create_deployment(cluster, deployment(namespace, "stuck", pool, request="1Ti"))
    running(cluster, namespace, "stuck", 1)
    since = len(cluster.server.requests.records)
    grow(cluster, namespace, "stuck", "2Ti")
    infd = wait_for(
        lambda: (
            (d := get(cluster, INFERENCEDEPLOYMENTS, namespace, "stuck"))
            and condition(d, "Degraded").get("reason") == "VolumeExpansionNotAllowed"
            and d
        ),
        message="the Degraded condition",
    )
    message = condition(infd, "Degraded")["message"]
    assert "spec.kvCache.storage.max grew to 2Ti" in message and "hold 1Ti" in message
    assert "StorageClass sim-fixed does not allow volume expansion" in message
    assert infd["status"]["kv"]["storage"]["quota"] == "1Ti", "the quota stays capped by the volume"
    assert get(cluster, KVPOOLS, None, pool)["status"]["allocations"][0]["quota"] == "2Ti"
    assert all(e["type"] == "Warning" for e in posted(cluster, namespace, "stuck", "VolumeExpansionNotAllowed"))
    wait_for(
        lambda: (
            len(cluster.server.requests.filter(resource="inferencedeployments", subresource="status", verb="patch")) > 0
        ),
        message="more passes",
    )
    assert claim_sizes(cluster, namespace, "stuck", "request") == ["1Ti"]
    assert not rejected(cluster, "statefulsets", since) and not rejected(cluster, "persistentvolumeclaims", since)


def test_a_changed_volume_mode_is_reported_not_applied(cluster, namespace, pool):
    if not cluster.embedded:
        pytest.skip("reads the embedded API server's request log")
    storage_class(cluster, "sim-fixed", expandable=False)
    create_pool(cluster, csi_pool(pool, "sim-fixed"))
    create_deployment(cluster, deployment(namespace, "moved", pool, request="1Ti"))
    running(cluster, namespace, "moved", 1)
    since = len(cluster.server.requests.records)
    kubectl(
        cluster,
        "patch",
        "kvp",
        pool,
        "--type",
        "merge",
        "-p",
        '{"spec": {"storage": {"csi": {"storageClassName": "sim-fixed", "volumeMode": "Filesystem"}}}}',
    )
    infd = wait_for(
        lambda: (
            (d := get(cluster, INFERENCEDEPLOYMENTS, namespace, "moved"))
            and condition(d, "Ready").get("reason") == "StatefulSetImmutable"
            and d
        ),
        message="reported",
    )
    message = condition(infd, "Ready")["message"]
    assert (
        message.startswith(
            "spec.kvCache.storage: StatefulSet moved cannot be updated: kv-store.volumeMode 'Block' -> 'Filesystem'"
        )
        and "kubectl delete statefulset moved" in message
    )
    assert not rejected(cluster, "statefulsets", since)


def static_pool(name, reclaim, count=1):
    namespaces = [
        {"nqn": f"nqn.2024-06.com.example:{name}-{i}", "uuid": UUID.format(i), "size": "2Ti"} for i in range(count)
    ]
    return {
        "apiVersion": "kvtier.io/v1alpha1",
        "kind": "KVPool",
        "metadata": {"name": name},
        "spec": {
            "capacity": f"{2 * count}Ti",
            "volumeReclaim": reclaim,
            "rebalance": {"policy": "Static"},
            "storage": {"nvmeof": {"targets": [{"address": "192.0.2.10"}], "namespaces": namespaces}},
        },
    }


def pool_status(cluster, pool):
    return get(cluster, KVPOOLS, None, pool).get("status") or {}


def volume_name(pool):
    return f"kvtier-{pool}-{UUID.format(0)}"


def test_a_deleted_deployments_namespace_is_wiped_before_it_is_free(cluster, namespace, pool):
    if not cluster.in_process:
        pytest.skip("fails the first wipe through the pod simulator")
    simulator = cluster.cluster.simulator
    simulator.exit_code = lambda pod: 1 if pod["metadata"]["namespace"] == OPERATOR_NAMESPACE else 0
    try:
        create_pool(cluster, static_pool(pool, "Wipe"))
        create_deployment(cluster, deployment(namespace, "first", pool, request="1Ti"))
        running(cluster, namespace, "first", 1)
        kubectl(cluster, "delete", "infd", "first", "-n", namespace)
        assert pool_status(cluster, pool)["reclaiming"] == [UUID.format(0)]
        create_deployment(cluster, deployment(namespace, "second", pool, request="1Ti"))
        degraded = wait_for(
            lambda: (
                condition(get(cluster, KVPOOLS, None, pool), "Degraded").get("reason") == "WipeFailed"
                and condition(get(cluster, KVPOOLS, None, pool), "Degraded")
            ),
            timeout=90,
            message="the failed wipe (a real Job controller backs off 10s, 20s between retries)",
        )
        assert volume_name(pool) in degraded["message"] and "delete the Job to retry" in degraded["message"]
        [job] = [
            j
            for j in items(cluster, JOBS, OPERATOR_NAMESPACE)
            if j["metadata"]["annotations"]["kvtier.io/volume"] == volume_name(pool)
        ]
        command = job["spec"]["template"]["spec"]["containers"][0]["command"]
        assert "blkdiscard -f" in command[-1] and "dd if=/dev/zero" in command[-1]
        assert get(cluster, PERSISTENT_VOLUMES, None, volume_name(pool)) is not None
        second = wait_for(
            lambda: condition(get(cluster, INFERENCEDEPLOYMENTS, namespace, "second"), "StorageBound"),
            message="the second deployment's StorageBound condition",
        )
        assert second["status"] == "False" and "0 free NVMe-oF namespace" in second["message"]
    finally:
        simulator.exit_code = lambda pod: 0
    cluster.run(cluster.kube.delete(JOBS, OPERATOR_NAMESPACE, job["metadata"]["name"]))
    wait_for(
        lambda: get(cluster, PERSISTENT_VOLUMES, None, volume_name(pool)) is None,
        timeout=20,
        message="the wiped volume deleted",
    )
    wait_for(
        lambda: (
            condition(get(cluster, INFERENCEDEPLOYMENTS, namespace, "second"), "StorageBound").get("status") == "True"
        ),
        timeout=20,
        message="the wiped namespace bound again",
    )
    assert not pool_status(cluster, pool)["reclaiming"]
    assert condition(get(cluster, KVPOOLS, None, pool), "Degraded")["status"] == "False"
    assert not [j for j in items(cluster, JOBS, OPERATOR_NAMESPACE) if j["metadata"]["name"] == job["metadata"]["name"]]


def test_a_retained_namespace_stays_released_until_an_admin_deletes_its_volume(cluster, namespace, pool):
    create_pool(cluster, static_pool(pool, "Retain"))
    create_deployment(cluster, deployment(namespace, "first", pool, request="1Ti"))
    running(cluster, namespace, "first", 1)
    kubectl(cluster, "delete", "infd", "first", "-n", namespace)
    create_deployment(cluster, deployment(namespace, "second", pool, request="1Ti"))
    released = wait_for(
        lambda: (
            (v := get(cluster, PERSISTENT_VOLUMES, None, volume_name(pool)))
            and (v.get("status") or {}).get("phase") == "Released"
            and v
        ),
        message="the volume Released",
    )
    assert released["metadata"]["labels"]["kvtier.io/released"] == "true"
    assert released["spec"]["claimRef"]["namespace"] == namespace, "never re-pointed at a wipe claim"
    assert pool_status(cluster, pool)["reclaiming"] == [UUID.format(0)]
    second = wait_for(
        lambda: condition(get(cluster, INFERENCEDEPLOYMENTS, namespace, "second"), "StorageBound"),
        message="the second deployment's StorageBound condition",
    )
    assert second["status"] == "False" and "0 free NVMe-oF namespace" in second["message"]
    wait_for(
        lambda: (
            "1 released NVMe-oF namespace retained until its PersistentVolume is deleted"
            in condition(get(cluster, KVPOOLS, None, pool), "Ready")["message"]
        ),
        message="the pool to say so",
    )
    kubectl(cluster, "delete", "pv", volume_name(pool))
    wait_for(
        lambda: (
            condition(get(cluster, INFERENCEDEPLOYMENTS, namespace, "second"), "StorageBound").get("status") == "True"
        ),
        timeout=20,
        message="the namespace bound once its volume was deleted",
    )
    assert not pool_status(cluster, pool)["reclaiming"]


def test_a_host_path_pool_gives_each_replica_its_own_directory_and_wipes_it_when_freed(cluster, namespace, pool):
    """hostPath pools (kind, development clusters) through the same claims as an array: one static volume per
    replica, pre-bound to its claim and sized for the quota plus the filesystem's reserve; deleting the
    deployment gives the volumes back (wiped by a Job in the operator's namespace, then deleted) and frees the
    pool."""
    path = f"/var/lib/kvtier-e2e/{namespace}"
    create_pool(
        cluster,
        {
            "apiVersion": "kvtier.io/v1alpha1",
            "kind": "KVPool",
            "metadata": {"name": pool},
            "spec": {"capacity": "4Ti", "rebalance": {"policy": "Static"}, "storage": {"hostPath": {"path": path}}},
        },
    )
    create_deployment(cluster, deployment(namespace, "local", pool, replicas=2, request="1Ti"))
    ready = running(cluster, namespace, "local", 2)
    assert ready["status"]["kv"]["storage"]["quota"] == "1Ti"
    volumes = sorted(
        items(cluster, PERSISTENT_VOLUMES, None, f"kvtier.io/pool={pool}"), key=lambda v: v["spec"]["hostPath"]["path"]
    )
    claims = {
        c["metadata"]["name"]: c
        for c in items(cluster, PERSISTENT_VOLUME_CLAIMS, namespace, "kvtier.io/deployment=local")
    }
    assert [v["spec"]["hostPath"]["path"] for v in volumes] == [
        f"{path}/{namespace}/{claim}" for claim in sorted(claims)
    ]
    for volume in volumes:
        claim = claims[volume["spec"]["claimRef"]["name"]]
        assert claim["status"]["phase"] == "Bound" and claim["spec"]["volumeName"] == volume["metadata"]["name"]
        # The engine may store its whole quota: the filesystem's 5% reserve comes on top.
        assert parse_quantity(volume["spec"]["capacity"]["storage"]) >= 2**40 / 0.95
    assert [(a["name"], a["quota"], a["replicas"]) for a in pool_status(cluster, pool)["allocations"]] == [
        ("local", "1Ti", 2)
    ]
    kubectl(cluster, "delete", "infd", "local", "-n", namespace)
    wait_for(
        lambda: not items(cluster, PERSISTENT_VOLUMES, None, f"kvtier.io/pool={pool}"),
        timeout=60,
        message="the wiped volumes deleted",
    )
    status = pool_status(cluster, pool)
    assert status["allocations"] == [] and not status.get("reclaiming")
