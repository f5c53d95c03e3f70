"""The recommendation refresh against the embedded API server (no operator: the test calls the refresh the
daemon calls with the deployments its index holds, and writes the deployment's published curve as the
telemetry controller would): the status is
written on material change only, and an undersized pool gets one Warning Event after the sustained period
and one Normal Event once it is sized again."""

from __future__ import annotations

import copy

import yaml

from kvtier.api.units import parse_quantity
from kvtier.controllers.recommendation import refresh_recommendation
from kvtier.kube import EVENTS, INFERENCEDEPLOYMENTS, KVPOOLS
from kvtier.testing.cluster import EmbeddedCluster
from tests.conftest import EXAMPLES

TI = 2**40


def example(kind):
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for body in yaml.safe_load_all(path.read_text()):
            if body and body.get("kind") == kind:
                return copy.deepcopy(body)
    raise AssertionError(kind)


async def reasons(kube, pool):
    events = (await kube.list(EVENTS, "default")).get("items", [])
    return sorted(e["reason"] for e in events if e["involvedObject"]["name"] == pool)


async def test_an_undersized_pool_is_reported_once_after_sustained_refreshes_and_once_when_sized():
    deployment = example("InferenceDeployment")  # 2 replicas, storage min 1Ti, max 12Ti per replica
    pool = example("KVPool")
    name = pool["metadata"]["name"]
    deployment["spec"]["kvCache"]["storage"]["poolRef"] = name
    pool["spec"]["capacity"] = "4Ti"
    pool["spec"]["recommendation"] = {"undersizedRefreshes": 2, "undersizedMargin": 0.25}
    namespace = deployment["metadata"].get("namespace", "default")
    async with EmbeddedCluster() as cluster:
        kube = cluster.kube
        await kube.create(KVPOOLS, pool)
        await kube.create(INFERENCEDEPLOYMENTS, deployment, namespace=namespace)
        # The hit ratio grows linearly up to the deployment's max (12Ti per replica, 24Ti in all).
        status = {
            "kv": {
                "promptTokensPerSecond": 40000.0,
                "demand": {"unit": "bytes", "points": [{"capacity": 12 * TI, "hitRatio": 0.6}]},
            }
        }
        await kube.patch(
            INFERENCEDEPLOYMENTS, namespace, deployment["metadata"]["name"], {"status": status}, subresource="status"
        )
        # What the daemon's index holds: the deployment with its published curve.
        deployments = [await kube.get(INFERENCEDEPLOYMENTS, namespace, deployment["metadata"]["name"])]

        first = await refresh_recommendation(kube, name, deployments)
        assert first is not None and first.recommended_capacity is not None
        assert first.recommended_capacity > 1.25 * 4 * TI and not first.undersized and first.streak == 1
        assert await reasons(kube, name) == []

        second = await refresh_recommendation(kube, name, deployments)
        assert second is not None and second.undersized and second.streak == 0
        assert await reasons(kube, name) == ["PoolUndersized"]

        # The state holds: no new Event, and nothing material changed, so the status is not rewritten.
        version = (await kube.get(KVPOOLS, None, name))["metadata"]["resourceVersion"]
        third = await refresh_recommendation(kube, name, deployments)
        assert third == second and await reasons(kube, name) == ["PoolUndersized"]
        assert (await kube.get(KVPOOLS, None, name))["metadata"]["resourceVersion"] == version

        # Sized to the recommendation: not undersized any more, said once after two agreeing refreshes.
        await kube.patch(KVPOOLS, None, name, {"spec": {"capacity": "32Ti"}})
        fourth = await refresh_recommendation(kube, name, deployments)
        assert fourth is not None and fourth.undersized and fourth.streak == 1
        assert fourth.capacity == parse_quantity("32Ti") and fourth.recommended_capacity <= 1.25 * 32 * TI
        fifth = await refresh_recommendation(kube, name, deployments)
        assert fifth is not None and not fifth.undersized
        assert await reasons(kube, name) == ["PoolSized", "PoolUndersized"]
        await refresh_recommendation(kube, name, deployments)
        assert await reasons(kube, name) == ["PoolSized", "PoolUndersized"]
