"""Scale, small: 50 InferenceDeployments on one pool through the same code path as the 1,000 of bench/.

Every one becomes Ready with `status.kv`, the pool's ledger records them all within its capacity, and in
steady state the operator reads its children and its pools from watches (no LIST, no GET of the pool) and
writes nothing that did not change: no child applied, no pool status written. A restarted operator picks up
from the API: no quota and no ledger entry changes, no child is applied again, and it lists each kind it
watches at most once.
The request counts come from the embedded API server's request log; on the real control plane, whose
apiserver counts requests without telling clients apart, those checks are skipped (the rest holds).
No timing asserts: the waits only bound how long a failure takes to show.
"""

from __future__ import annotations

import time

import pytest

from kvtier.api.units import parse_quantity
from kvtier.kube import INFERENCEDEPLOYMENTS, KVPOOLS, NODES
from kvtier.testing.podsim import NodeSpec
from tests.conftest import wait_for
from tests.e2e.helpers import (
    condition,
    create_deployment,
    create_pool,
    csi_pool,
    deployment,
    ensure_sim_storage_class,
    get,
    items,
    kubectl,
)

DEPLOYMENTS = 50
OPERATOR_AGENTS = ("kvtier-operator", "kopf")
#: What the operator's children are: none of them may be written in steady state or on a restart.
CHILD_KINDS = {"configmaps", "services", "statefulsets", "poddisruptionbudgets", "persistentvolumes", "podmonitors"}
WRITES = {"create", "update", "patch", "delete", "deletecollection"}
#: Extra simulated nodes, so 50 one-GPU replicas fit beside what other tests hold (removed afterwards).
EXTRA_NODES = [NodeSpec(f"sim-scale-{index}", gpus=8) for index in range(7)]


@pytest.fixture(scope="module")
def fleet(cluster):
    """A pool, 50 deployments of one replica each in one namespace, all Ready; everything removed afterwards."""
    if not getattr(cluster, "in_process", False):
        pytest.skip("adds simulated nodes: needs the in-process pod simulator")
    simulator = cluster.cluster.simulator
    simulator.nodes.extend(EXTRA_NODES)
    cluster.run(simulator.register_nodes())
    ensure_sim_storage_class(cluster)
    namespace, pool = "scale-small", "scale-small"
    kubectl(cluster, "create", "namespace", namespace)
    create_pool(cluster, csi_pool(pool, f"{DEPLOYMENTS * 2}Gi"))  # every request fits, with nothing to spare
    names = [f"d{index:02d}" for index in range(DEPLOYMENTS)]
    try:
        for name in names:
            body = deployment(namespace, name, pool, request="2Gi", minimum="1Gi")
            body["spec"]["engine"]["resources"] = {"requests": {"cpu": "1", "memory": "2Gi"}}
            body["spec"]["kvCache"]["cpu"] = {"size": "1Gi"}
            create_deployment(cluster, body)
        wait_for(
            lambda: all_ready(cluster, namespace) == DEPLOYMENTS,
            timeout=600,
            interval=1,
            message=f"{DEPLOYMENTS} deployments Ready with status.kv",
        )
        yield namespace, pool, names
    finally:
        kubectl(cluster, "delete", "infd", "--all", "-n", namespace, "--wait=false", check=False)
        wait_for(
            lambda: not items(cluster, INFERENCEDEPLOYMENTS, namespace), timeout=300, interval=1, message="cleanup"
        )
        kubectl(cluster, "delete", "kvp", pool, "--ignore-not-found", "--wait=false")
        kubectl(cluster, "delete", "namespace", namespace, "--wait=false", check=False)
        for node in EXTRA_NODES:
            simulator.nodes.remove(node)
            cluster.run(cluster.kube.delete(NODES, None, node.name))


def all_ready(cluster, namespace: str) -> int:
    found = items(cluster, INFERENCEDEPLOYMENTS, namespace)
    return sum(
        1
        for d in found
        if condition(d, "Ready").get("status") == "True" and ((d.get("status") or {}).get("kv") or {}).get("storage")
    )


def quotas(cluster, namespace: str) -> dict[str, str]:
    return {
        d["metadata"]["name"]: d["status"]["kv"]["storage"]["quota"]
        for d in items(cluster, INFERENCEDEPLOYMENTS, namespace)
    }


def ledger(cluster, pool: str) -> dict[str, tuple[str, int]]:
    status = get(cluster, KVPOOLS, None, pool)["status"]
    return {a["name"]: (a["quota"], a["replicas"]) for a in status["allocations"]}


def operator_requests(cluster, since: int) -> list:
    return [r for r in cluster.server.requests.records[since:] if r.user_agent.split("/")[0] in OPERATOR_AGENTS]


def passes(cluster, count: int) -> None:
    """Let `count` resync periods go by (every deployment's timer fires in each)."""
    time.sleep(count * cluster.cluster.operator.resync_seconds)


def test_fifty_deployments_are_ready_and_recorded_in_the_ledger(cluster, fleet):
    namespace, pool, names = fleet
    status = get(cluster, KVPOOLS, None, pool)["status"]
    uids = {d["metadata"]["uid"] for d in items(cluster, INFERENCEDEPLOYMENTS, namespace)}
    assert {a["uid"] for a in status["allocations"]} == uids and len(uids) == DEPLOYMENTS
    total = sum(parse_quantity(a["quota"]) * a["replicas"] for a in status["allocations"])
    assert total <= parse_quantity(status["capacity"]), "over-committed"
    assert parse_quantity(status["allocated"]) == total
    recorded = ledger(cluster, pool)
    served = {name: parse_quantity(quota) for name, quota in quotas(cluster, namespace).items()}
    assert served == {name: parse_quantity(quota) for name, (quota, _) in recorded.items()}
    assert set(served) == set(names)


def test_steady_state_lists_nothing_and_writes_nothing_that_did_not_change(cluster, fleet):
    if cluster.server is None:
        pytest.skip("counts the operator's requests in the embedded API server's request log (none on this ground)")
    namespace, pool, _ = fleet
    passes(cluster, 3)  # the last writes of convergence land
    since = len(cluster.server.requests)
    passes(cluster, 5)
    seen = operator_requests(cluster, since)
    mine = [r for r in seen if r.namespace in (namespace, None)]
    lists = sorted({(r.resource, r.namespace) for r in mine if r.verb == "list"})
    assert lists == [], f"LIST requests in steady state: {lists}"
    child_writes = [(r.verb, r.resource, r.name) for r in mine if r.verb in WRITES and r.resource in CHILD_KINDS]
    assert child_writes == [], f"children written in steady state: {child_writes[:10]}"
    pool_writes = [(r.verb, r.subresource) for r in seen if r.resource == "kvpools" and r.verb in WRITES]
    assert pool_writes == [], f"the pool written in steady state: {pool_writes}"
    pool_reads = [r.name for r in seen if r.resource == "kvpools" and r.verb == "get"]
    assert pool_reads == [], f"{len(pool_reads)} GETs of the pool in steady state (passes read the pool view)"
    conflicts = [(r.verb, r.resource, r.name) for r in seen if r.status == 409]
    assert conflicts == [], f"conflicts in steady state: {conflicts[:10]}"


def test_a_restarted_operator_resumes_without_changing_quotas_or_reapplying(cluster, fleet):
    namespace, pool, _ = fleet
    passes(cluster, 2)
    before = quotas(cluster, namespace), ledger(cluster, pool)
    since = len(cluster.server.requests) if cluster.server is not None else 0
    cluster.run(cluster.cluster.stop_operator(crash=True))
    cluster.run(cluster.cluster.start_operator())
    passes(cluster, 5)
    assert all_ready(cluster, namespace) == DEPLOYMENTS
    assert (quotas(cluster, namespace), ledger(cluster, pool)) == before, "a restart changed quotas or the ledger"
    if cluster.server is None:
        return
    seen = operator_requests(cluster, since)
    mine = [r for r in seen if r.namespace in (namespace, None)]
    child_writes = [(r.verb, r.resource, r.name) for r in mine if r.verb in WRITES and r.resource in CHILD_KINDS]
    assert child_writes == [], f"children applied again after a restart: {child_writes[:10]}"
    pool_writes = [(r.verb, r.subresource) for r in seen if r.resource == "kvpools" and r.verb in WRITES]
    assert pool_writes == [], f"the pool written after a restart: {pool_writes}"
    lists = [(r.resource, r.namespace) for r in seen if r.verb == "list"]
    repeated = {entry for entry in lists if lists.count(entry) > 1}
    assert not repeated, f"kinds listed more than once on the way back (watches, not lists): {repeated}"
