"""`kvtier plan --kubeconfig`: the live source reads every KVPool and the demand curves its deployments
publish in status.kv, on the embedded cluster (no operator: the statuses are written as it would)."""

from __future__ import annotations

import asyncio
import copy
import json
import sys

import yaml

from kvtier.kube import INFERENCEDEPLOYMENTS, KVPOOLS
from kvtier.rebalance.planlive import LIVE_BLOCK_BYTES
from kvtier.testing.cluster import EmbeddedCluster
from tests.conftest import EXAMPLES

POINTS = [(2**40, 0.1), (4 * 2**40, 0.3), (8 * 2**40, 0.4)]  # bytes per replica, hit ratio


def example(kind, name=None):
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for body in yaml.safe_load_all(path.read_text()):
            if body and body.get("kind") == kind and name in (None, body["metadata"]["name"]):
                return body
    raise AssertionError(kind)


def interpolate(per_replica):
    previous = (0, 0.0)
    for capacity, ratio in POINTS:
        if per_replica <= capacity:
            return previous[1] + (per_replica - previous[0]) / (capacity - previous[0]) * (ratio - previous[1])
        previous = (capacity, ratio)
    return previous[1]


async def kvtier_plan(*args):
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kvtier",
        "plan",
        *map(str, args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    return process.returncode, out.decode(), err.decode()


async def test_live_plan_reads_pools_and_the_published_curves():
    deployment = example("InferenceDeployment")
    pool = example("KVPool", deployment["spec"]["kvCache"]["storage"]["poolRef"])
    namespace = deployment["metadata"].get("namespace", "default")
    silent = copy.deepcopy(deployment)
    silent["metadata"]["name"] = "no-curve-yet"
    async with EmbeddedCluster() as cluster:
        await cluster.kube.create(KVPOOLS, pool)
        for body in (deployment, silent):
            await cluster.kube.create(INFERENCEDEPLOYMENTS, body, namespace=namespace)
        status = {
            "kv": {
                "promptTokensPerSecond": 40000.0,
                "demand": {
                    "unit": "bytes",
                    "points": [{"capacity": capacity, "hitRatio": ratio} for capacity, ratio in POINTS],
                },
            }
        }
        await cluster.kube.patch(
            INFERENCEDEPLOYMENTS, namespace, deployment["metadata"]["name"], {"status": status}, subresource="status"
        )
        code, out, err = await kvtier_plan("--kubeconfig", cluster.kubeconfig, "--json", "--target-hit-ratio", "0.25")
        table_code, table, _ = await kvtier_plan("--kubeconfig", cluster.kubeconfig, "--pool", pool["metadata"]["name"])
        missing_code, _, missing_err = await kvtier_plan("--kubeconfig", cluster.kubeconfig, "--pool", "nope")
    assert code == 0, err
    [plan] = json.loads(out)
    name = f"{namespace}/{deployment['metadata']['name']}"
    assert plan["name"] == pool["metadata"]["name"]
    assert plan["current"]["capacity_bytes"] // LIVE_BLOCK_BYTES * LIVE_BLOCK_BYTES == plan["current"]["capacity_bytes"]
    assert f"{namespace}/no-curve-yet: no status.kv.demand yet" in err and "left out" in err
    replicas = deployment["spec"]["replicas"]
    for row in plan["capacities"]:
        tenant = row["per_tenant"][name]
        assert set(row["per_tenant"]) == {name}
        expected = interpolate(tenant["quota_blocks"] * LIVE_BLOCK_BYTES / replicas)
        assert abs(row["token_hit_ratio"] - expected) < 1e-3
        assert row["ttft_p50_seconds"] is None and row["gpu_prefill_seconds_saved_per_hour"] > 0
    picked = [row for row in plan["capacities"] if row["capacity_blocks"] == plan["pick"]["capacity_blocks"]]
    assert picked and picked[0]["block_hit_ratio"] >= 0.25, plan["pick"]
    assert table_code == 0 and table.startswith(f"{pool['metadata']['name']}:\n") and "pick:" in table
    assert missing_code == 2 and "no KVPool 'nope'" in missing_err
