"""kopf peering as the chart sets it up (peering.enabled): kopf's CRDs from the chart, a ClusterKopfPeering,
and `kvtier run --peering kvtier --priority N` joins it (and keeps reconciling)."""

from __future__ import annotations

import asyncio
import time

import yaml

from kvtier.controllers import OperatorConfig
from kvtier.kube import CUSTOMRESOURCEDEFINITIONS, KVPOOLS, Resource
from kvtier.testing.cluster import EmbeddedCluster
from tests.chart import CHART

CLUSTER_PEERINGS = Resource("kopf.dev", "v1", "clusterkopfpeerings", namespaced=False)


async def _until(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not (value := await predicate()):
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.2)
    return value


async def test_the_operator_joins_the_charts_cluster_peering():
    async with EmbeddedCluster() as cluster:
        for crd in yaml.safe_load_all((CHART / "crds" / "kopf.dev_peerings.yaml").read_text()):
            await cluster.kube.create(CUSTOMRESOURCEDEFINITIONS, crd)
        await cluster.kube.create(
            CLUSTER_PEERINGS,
            {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "kvtier"}},
        )
        cluster.operator = OperatorConfig(
            kubeconfig=cluster.kubeconfig, resync_seconds=1.0, peering="kvtier", priority=5
        )
        await cluster.start_operator()

        async def peers():
            status = (await cluster.kube.get(CLUSTER_PEERINGS, None, "kvtier")).get("status") or {}
            return status

        status = await _until(peers)
        (entry,) = status.values()
        assert entry["priority"] == 5
        # Still the only operator: it serves KVPools as usual.
        await cluster.kube.create(
            KVPOOLS,
            {
                "apiVersion": "kvtier.io/v1alpha1",
                "kind": "KVPool",
                "metadata": {"name": "peered"},
                "spec": {"capacity": "1Ti", "storage": {"hostPath": {"path": "/x"}}},
            },
        )

        async def served():
            pool = await cluster.kube.get(KVPOOLS, None, "peered")
            return (pool.get("status") or {}).get("capacity")

        assert await _until(served) == "1Ti"
        await cluster.stop_operator()

        async def left():
            return not any((await peers()).values())

        assert await _until(left), "the operator did not leave the peering when it stopped"
