"""The rendered example replica as the embedded cluster runs it with kvsim engines: the pod
simulator starts its vllm, lmcache and probe containers, and all three answer on the pod's IP."""

import asyncio
import time

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from kvtier.api.documents import read_documents
from kvtier.kube import CONFIGMAPS, PERSISTENT_VOLUMES, PODDISRUPTIONBUDGETS, PODS, SERVICES, STATEFULSETS
from kvtier.render.offline import render_documents
from kvtier.sim.pods import KvsimEngines
from kvtier.testing.cluster import EmbeddedCluster
from kvtier.testing.engines import stub_engine
from tests.conftest import EXAMPLES

RESOURCES = {
    "ConfigMap": CONFIGMAPS,
    "Service": SERVICES,
    "StatefulSet": STATEFULSETS,
    "PodDisruptionBudget": PODDISRUPTIONBUDGETS,
    "PersistentVolume": PERSISTENT_VOLUMES,
}


async def containers_ready_pod(kube, timeout=30.0):
    """The first pod whose containers are all ready (its Ready waits for the operator's quota gate)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pod in (await kube.list(PODS, None))["items"]:
            conditions = {c["type"]: c["status"] for c in (pod.get("status") or {}).get("conditions", [])}
            if conditions.get("ContainersReady") == "True":
                return pod
        await asyncio.sleep(0.1)
    raise AssertionError("no pod's containers became ready")


async def test_the_example_replica_serves_engine_lmcache_and_probe_metrics(tmp_path):
    objects = render_documents(read_documents([str(EXAMPLES)])).objects
    async with EmbeddedCluster(engine_factory=KvsimEngines(tmp_path, fallback=stub_engine)) as cluster:
        for body in objects:
            if body["kind"] == "StatefulSet":
                body["spec"]["replicas"] = 1
            await cluster.kube.create(RESOURCES[body["kind"]], body, namespace=body["metadata"].get("namespace"))
        pod = await containers_ready_pod(cluster.kube)
        address = pod["status"]["podIP"]
        pages = {}
        async with aiohttp.ClientSession() as http:
            async with http.put(f"http://{address}:8080/quota/_default", json={"limit_gb": 100}) as reply:
                assert reply.status == 200
            async with http.post(
                f"http://{address}:8000/v1/completions", json={"prompt": " ".join(map(str, range(600)))}
            ) as reply:
                assert reply.status == 200
            for port in (8000, 8080, 9400):  # LMCache serves /metrics on its HTTP port
                async with http.get(f"http://{address}:{port}/metrics") as reply:
                    pages[port] = {f.name for f in text_string_to_metric_families(await reply.text())}
    assert "vllm:kv_cache_usage_perc" in pages[8000]
    assert "lmcache_mp_lookup_hit_l2_tokens" in pages[8080]
    assert "kvtier_probe_stack_distance_chunks" in pages[9400]
