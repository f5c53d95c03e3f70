"""Capacity planning against a running cluster: the operator writes `status.recommendation` on a KVPool whose
deployments publish demand curves, `kubectl get kvp -o wide` shows the recommended capacity, and the live
form of `kvtier plan` prints a table with a pick for the same pool.

The load is the demo's (a trace the simulated engines replay, as in test_rebalance.py), so the curves are the
probes' own; the recommendation interval is shortened so the test does not wait minutes.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvtier.api.units import parse_quantity
from kvtier.demo.manifests import DEPLOYMENTS, DemoManifests
from kvtier.demo.workload import Workload
from kvtier.kube import INFERENCEDEPLOYMENTS, KVPOOLS
from tests.conftest import wait_for
from tests.e2e.helpers import condition, create_deployment, create_pool, delete_pool, get, items, kubectl

INTERVAL = 2.0
WORKLOAD = Workload()


@pytest.fixture(scope="module")
def loaded_pool(cluster, tmp_path_factory):
    """The demo's pool and three deployments under the demo's load, with a 2s recommendation interval."""
    if not cluster.in_process:
        pytest.skip("the simulated load is a trace file on the machine running the simulated pods")
    namespace, pool = "recommend-e2e", "recommend-e2e-pool"
    kubectl(cluster, "create", "namespace", namespace)
    directory = tmp_path_factory.mktemp("recommend")
    trace = directory / "load.jsonl"
    WORKLOAD.write(trace)
    manifests = DemoManifests(
        trace=str(trace),
        pool_path=str(directory / "pool"),
        workload=WORKLOAD,
        interval_seconds=INTERVAL,
        cooldown_seconds=INTERVAL,
    )
    for obj in manifests.objects():
        if obj["kind"] == "KVPool":
            obj["metadata"]["name"] = pool
            obj["spec"]["recommendation"] = {"interval": "2s"}
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
        timeout=90,
        interval=0.5,
        message="the three deployments Ready",
    )
    yield pool
    kubectl(cluster, "delete", "infd", "--all", "-n", namespace, "--wait=false")
    wait_for(lambda: not items(cluster, INFERENCEDEPLOYMENTS, namespace), timeout=60, message="deployments gone")
    delete_pool(cluster, pool)
    kubectl(cluster, "delete", "namespace", namespace, "--wait=false")


def recommendation(cluster, pool: str) -> dict:
    return ((get(cluster, KVPOOLS, None, pool) or {}).get("status") or {}).get("recommendation") or {}


def test_the_operator_recommends_a_capacity_and_kubectl_wide_shows_it(cluster, loaded_pool):
    pool = loaded_pool
    # A recommendation may be written before the probes publish curves (without a capacity): wait for one with.
    current = wait_for(
        lambda: (r := recommendation(cluster, pool)).get("recommendedCapacity") and r,
        timeout=120,
        interval=0.5,
        message="status.recommendation with a recommended capacity",
    )
    capacity = parse_quantity(get(cluster, KVPOOLS, None, pool)["spec"]["capacity"])
    assert parse_quantity(current["capacity"]) == capacity and current["deployments"] >= 1
    assert [point["factor"] for point in current["points"]] == [0.5, 1.0, 2.0]
    for point in current["points"]:
        assert abs(parse_quantity(point["capacity"]) - point["factor"] * capacity) < 2**30  # whole GiB
        assert 0 <= point["hitRatio"] <= 1 and point["gpuSecondsSavedPerHour"] >= 0
    ratios = [point["hitRatio"] for point in current["points"]]
    assert ratios == sorted(ratios), ratios  # the allocator never predicts less for more
    assert current["reason"] and current["observedAt"]

    def wide_column() -> str | None:
        """The Recommended cell of `kubectl get kvp -o wide` when the status did not change around it."""
        before = recommendation(cluster, pool).get("recommendedCapacity")
        lines = kubectl(cluster, "get", "kvp", pool, "-o", "wide").stdout.splitlines()
        header, row = lines[0].split(), lines[1].split()
        assert "RECOMMENDED" in header, header
        cell = row[header.index("RECOMMENDED")]
        return cell if cell == before == recommendation(cluster, pool).get("recommendedCapacity") else None

    cell = wait_for(wide_column, timeout=30, interval=0.5, message="a stable recommendation in kubectl -o wide")
    assert parse_quantity(cell) > 0
    narrow = kubectl(cluster, "get", "kvp", pool).stdout.splitlines()[0].split()
    assert "RECOMMENDED" not in narrow  # priority 1: -o wide only


def test_kvtier_plan_live_prints_a_table_with_a_pick(cluster, loaded_pool):
    pool = loaded_pool
    wait_for(
        lambda: recommendation(cluster, pool).get("recommendedCapacity"),
        timeout=120,
        interval=0.5,
        message="the deployments' curves planned",
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvtier",
            "plan",
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--pool",
            pool,
            "--target-hit-ratio",
            "0.001",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"{pool}:"
    picks = [line for line in lines if line.startswith("pick:")]
    assert len(picks) == 1 and not picks[0].startswith("pick: none"), result.stdout
    assert any(line.lstrip().startswith("*") for line in lines), result.stdout  # the picked row is marked in the table
