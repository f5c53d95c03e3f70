"""The rebalancer end to end: three deployments on one pool whose simulated load shifts from one to
another; quotas follow the busy one, every move is explained, and an operator killed in the middle of
a round leaves the ledger and the engines' quotas consistent.

The shifting-load tests need the embedded cluster (the load is a trace file on this machine that the
simulated engines replay); the Static and dry-run ones run anywhere.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from kvtier.api.units import parse_quantity
from kvtier.demo.manifests import DEPLOYMENTS, DemoManifests
from kvtier.demo.workload import Workload
from kvtier.kube import INFERENCEDEPLOYMENTS, KVPOOLS, PODS
from tests.conftest import wait_for
from tests.e2e.helpers import (
    TI,
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

INTERVAL = 2.0
SPEED = 10.0
WORKLOAD = Workload()  # each deployment busy for 200 simulated seconds in turn: 20 s here


@pytest.fixture
def shifting_load(cluster, namespace, tmp_path):
    """The demo's pool (renamed per test) and three deployments, Ready; yields (pool, time the load started)."""
    if not cluster.in_process:
        pytest.skip("the simulated load is a trace file on the machine running the simulated pods")
    pool = f"{namespace}-pool"
    trace = tmp_path / "load.jsonl"
    WORKLOAD.write(trace)
    manifests = DemoManifests(
        trace=str(trace),
        pool_path=str(tmp_path / "pool"),
        speed=SPEED,
        workload=WORKLOAD,
        interval_seconds=INTERVAL,
        cooldown_seconds=INTERVAL,
    )
    for obj in manifests.objects():
        if obj["kind"] == "KVPool":
            obj["metadata"]["name"] = pool
            create_pool(cluster, obj)
        elif obj["kind"] == "InferenceDeployment":
            obj["metadata"]["namespace"] = namespace
            obj["spec"]["kvCache"]["storage"]["poolRef"] = pool
            create_deployment(cluster, obj)
    wait_for(
        lambda: all(
            condition(get(cluster, INFERENCEDEPLOYMENTS, namespace, name), "Ready").get("status") == "True"
            for name in DEPLOYMENTS
        ),
        timeout=60,
        interval=0.2,
        message="the three deployments Ready",
    )
    yield pool, time.monotonic()
    kubectl(cluster, "delete", "infd", "--all", "-n", namespace, "--wait=false")
    wait_for(lambda: not items(cluster, INFERENCEDEPLOYMENTS, namespace), timeout=60, message="deployments gone")
    delete_pool(cluster, pool)


def quotas(cluster, pool: str) -> dict[str, int]:
    status = get(cluster, KVPOOLS, None, pool).get("status") or {}
    return {a["name"]: parse_quantity(a["quota"]) for a in status.get("allocations", [])}


def at(started: float, seconds: float) -> None:
    time.sleep(max(0.0, started + seconds - time.monotonic()))


def test_quotas_move_toward_the_busy_deployment_and_each_move_is_explained(cluster, namespace, shifting_load):
    pool, started = shifting_load
    phase = WORKLOAD.phase_seconds / SPEED
    request = parse_quantity("32Gi")
    # Phase 0: chat is busy (the others replay their quiet phases).
    wait_for(
        lambda: quotas(cluster, pool)["chat"] > request,
        timeout=phase,
        interval=0.2,
        message="chat, the busy one, to get more than its request",
    )
    # Phase 1: code becomes the busy one; within three intervals its quota grows.
    at(started, phase)
    before = quotas(cluster, pool)["code"]
    wait_for(
        lambda: quotas(cluster, pool)["code"] > before,
        timeout=3 * INTERVAL + 1,
        interval=0.2,
        message=f"code's quota to grow within three intervals of becoming busy (from {before})",
    )
    at(started, 2 * phase - 1)
    end_of_phase = quotas(cluster, pool)
    assert end_of_phase["code"] == max(end_of_phase.values()), end_of_phase
    assert sum(end_of_phase.values()) <= parse_quantity("96Gi")
    # Explained: Events on the pool with the numbers, on each deployment that moved, and in the status.
    record = get(cluster, KVPOOLS, None, pool)["status"]["lastRebalance"]
    assert record["moves"] and record["predictedGain"] > 0 and parse_quantity(record["movedBytes"]) > 0
    pool_events = posted(cluster, "default", pool, "Rebalanced")
    assert all("tokens/s" in e["message"] and "->" in e["message"] for e in pool_events)
    code_events = posted(cluster, namespace, "code", "StorageQuotaChanged")
    assert f"KVPool {pool} moved" in code_events[-1]["message"]
    if cluster.server is not None:  # the rounds found the replicas in the pod watch's index, not by listing
        lists = [
            r.path
            for r in cluster.server.requests.records
            if r.verb == "list"
            and r.resource == "pods"
            and r.namespace == namespace
            and r.user_agent.split("/")[0] == "kvtier-operator"
        ]
        assert lists == [], f"the operator listed the replicas: {lists[:5]}"


def engine_quota(pod: dict) -> int:
    """The `_default` quota a replica's LMCache server holds, read from the server itself."""
    with urllib.request.urlopen(f"http://{pod['status']['podIP']}:8080/quota/_default", timeout=5) as reply:
        return round(json.load(reply)["limit_gb"] * 2**30)


def engines_match_the_ledger(cluster, namespace: str, pool: str) -> bool:
    ledger = quotas(cluster, pool)
    for name in DEPLOYMENTS:
        pods = items(cluster, PODS, namespace, f"app.kubernetes.io/instance={name}")
        if not pods or any(engine_quota(pod) != ledger[name] for pod in pods):
            return False
    return True


def test_an_operator_killed_mid_round_leaves_ledger_and_engines_consistent(cluster, namespace, shifting_load):
    pool, _ = shifting_load
    wait_for(
        lambda: (get(cluster, KVPOOLS, None, pool).get("status") or {}).get("lastRebalance"),
        timeout=30,
        interval=0.2,
        message="a first rebalance",
    )
    if cluster.embedded:
        # Slow the ledger writes down, and kill the operator while one is in flight.
        slow = cluster.server.faults.add(verb="update", resource="kvpools", subresource="status", delay=1.0, times=None)
        try:
            in_flight = wait_for(
                lambda: [
                    r
                    for r in cluster.server.requests.filter(
                        verb="update", resource="kvpools", subresource="status", name=pool
                    )
                    if r.status is None and r.user_agent == "kvtier-operator"
                ],
                timeout=30,
                interval=0.05,
                message="a ledger write of a rebalance round in flight",
            )
            cluster.run(cluster.cluster.stop_operator(crash=True))
            assert in_flight
        finally:
            cluster.server.faults.remove(slow)
    else:
        # No fault injector in a real API server: kill the operator the moment a round's ledger write lands,
        # while its quota PUTs to the engines follow.
        last = get(cluster, KVPOOLS, None, pool)["status"]["lastRebalance"]["time"]
        wait_for(
            lambda: get(cluster, KVPOOLS, None, pool)["status"]["lastRebalance"]["time"] != last,
            timeout=30,
            interval=0.05,
            message="the next rebalance round",
        )
        cluster.run(cluster.cluster.stop_operator(crash=True))
    ledger = quotas(cluster, pool)
    assert sum(ledger.values()) <= parse_quantity("96Gi"), ledger
    cluster.run(cluster.cluster.start_operator())
    # Restarted, the operator brings every engine to the ledger's quota (whatever round was cut short).
    wait_for(
        lambda: engines_match_the_ledger(cluster, namespace, pool),
        timeout=30,
        interval=0.5,
        message="every engine's quota equal to its ledger entry",
    )
    status = get(cluster, KVPOOLS, None, pool)["status"]
    assert parse_quantity(status["allocated"]) == sum(quotas(cluster, pool).values()) <= parse_quantity("96Gi")


@pytest.fixture
def static_pool(cluster, namespace):
    """A 3Ti Static pool rebalanced every second, and two deployments asking 2Ti each (min 1Ti): the
    second is admitted short, at 1Ti. Yields the pool's name."""
    pool = f"{namespace}-pool"
    body = csi_pool(pool, "3Ti")
    body["spec"]["rebalance"] = {"policy": "Static", "interval": "1s", "cooldown": "1s"}
    ensure_sim_storage_class(cluster)
    create_pool(cluster, body)
    create_deployment(cluster, deployment(namespace, "first", pool, request="2Ti", minimum="1Ti"))
    wait_for(lambda: quotas(cluster, pool).get("first") == 2 * TI, message="first admitted at its request")
    create_deployment(cluster, deployment(namespace, "second", pool, request="2Ti", minimum="1Ti"))
    wait_for(lambda: quotas(cluster, pool).get("second") == TI, message="second admitted short")
    yield pool
    kubectl(cluster, "delete", "infd", "--all", "-n", namespace, "--wait=false")
    wait_for(lambda: not items(cluster, INFERENCEDEPLOYMENTS, namespace), timeout=60, message="deployments gone")
    delete_pool(cluster, pool)


def test_static_brings_a_deployment_back_to_exactly_its_request_once_there_is_room(cluster, namespace, static_pool):
    kubectl(cluster, "delete", "infd", "first", "-n", namespace, "--wait=false")
    wait_for(
        lambda: quotas(cluster, static_pool) == {"second": 2 * TI},
        timeout=30,
        interval=0.2,
        message="second at exactly its 2Ti request",
    )
    record = get(cluster, KVPOOLS, None, static_pool)["status"]["lastRebalance"]
    assert not record["dryRun"] and record["reason"].startswith("policy Static")


def test_a_dry_run_reports_once_and_moves_nothing(cluster, namespace, static_pool):
    kubectl(cluster, "patch", "kvp", static_pool, "--type=merge", "-p", '{"spec": {"rebalance": {"dryRun": true}}}')
    kubectl(cluster, "delete", "infd", "first", "-n", namespace, "--wait=false")
    record = wait_for(
        lambda: (
            (get(cluster, KVPOOLS, None, static_pool)["status"].get("lastRebalance") or {}).get("dryRun")
            and get(cluster, KVPOOLS, None, static_pool)["status"]["lastRebalance"]
        ),
        timeout=30,
        interval=0.2,
        message="a dry-run record",
    )
    assert record["moves"] == [{"namespace": namespace, "name": "second", "fromQuota": "1Ti", "toQuota": "2Ti"}]
    time.sleep(3)  # three more rounds
    assert quotas(cluster, static_pool) == {"second": TI}
    reported = [e for e in events(cluster, "default", static_pool) if e["reason"] == "RebalanceDryRun"]
    assert len(reported) == 1 and "would move" in reported[0]["message"]
