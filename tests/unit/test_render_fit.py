"""The fit check: a replica that no node can hold is refused with reasons, before any pod exists."""

import pytest

from kvtier.api import InferenceDeployment, KVPool
from kvtier.render import NodeResources, RenderOptions, UnsupportedStorage, check_fit, pod_sizing

GiB = 2**30


def deployment(mode="LMCacheMP", tp=8, cpu_tier="200Gi", engine_memory="256Gi", node_selector=None, storage=None):
    kv_cache = {"mode": mode}
    if mode != "None":
        kv_cache["cpu"] = {"size": cpu_tier}
    if storage:
        kv_cache["storage"] = storage
    engine = {
        "image": "vllm/vllm-openai:v0.33.0",
        "tensorParallelSize": tp,
        "resources": {"requests": {"cpu": "32", "memory": engine_memory}},
        "nodeSelector": node_selector or {},
    }
    return InferenceDeployment.model_validate(
        {
            "apiVersion": "kvtier.io/v1alpha1",
            "kind": "InferenceDeployment",
            "metadata": {"name": "big", "namespace": "ml"},
            "spec": {"model": {"name": "m", "kvBytesPerToken": 253952}, "engine": engine, "kvCache": kv_cache},
        }
    )


def node(name="gpu-0", memory="2000Gi", gpus="8", cpu="192", labels=None):
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
        "status": {"allocatable": {"memory": memory, "nvidia.com/gpu": gpus, "cpu": cpu, "pods": "110"}},
    }


def test_sizing_adds_every_term():
    sizing = pod_sizing(deployment(), RenderOptions())
    # engine 256Gi + /dev/shm 8 x 2Gi + LMCache L1 200Gi + 4Gi overhead
    assert sizing.memory == (256 + 16 + 204) * GiB
    assert sizing.gpus == 8 and sizing.cpu_millis == 36_000
    in_process = pod_sizing(deployment(mode="LMCacheInProcess"), RenderOptions())
    assert in_process.memory == (256 + 8 * 200 + 16) * GiB  # one CPU tier per TP rank


def test_a_node_big_enough_fits():
    assert check_fit(deployment(), [node()]) == []
    assert check_fit(deployment(), [node("small", memory="64Gi"), node()]) == []


def test_node_dicts_with_kubelet_units():
    # 500Gi in Ki as the kubelet reports it, CPU in millicores
    fits = node(memory=f"{500 * 2**20}Ki", cpu="95500m")
    assert check_fit(deployment(tp=8, cpu_tier="100Gi", engine_memory="200Gi"), [fits]) == []
    assert NodeResources.from_node(fits) == NodeResources("gpu-0", 500 * GiB, 8, 95_500, {})


def test_too_few_gpus_per_node():
    (reason,) = check_fit(deployment(tp=8), [node(gpus="4"), node("cpu-only", gpus="0")])
    assert "8 GPUs" in reason and "tensorParallelSize" in reason and "offers is 4" in reason


def test_cpu_tier_that_does_not_fit_names_every_term():
    (reason,) = check_fit(deployment(mode="LMCacheInProcess", cpu_tier="200Gi"), [node(memory="1000Gi")])
    assert "1872Gi of memory" in reason
    assert "engine 256Gi + in-process CPU tier 1600Gi + /dev/shm 16Gi" in reason
    assert "the most any node with enough GPUs offers is 1000Gi" in reason


def test_gpus_and_memory_both_short():
    reasons = check_fit(deployment(), [node(gpus="4", memory="128Gi")])
    assert len(reasons) == 2 and "GPUs" in reasons[0] and "memory" in reasons[1]


def test_cpu_short():
    (reason,) = check_fit(deployment(), [node(cpu="16")])
    assert reason == "a replica needs 36 CPUs, the most any node with enough GPUs offers is 16"


def test_resources_spread_over_nodes_do_not_add_up():
    nodes = [node("memory-rich", cpu="16"), node("cpu-rich", memory="300Gi")]
    (reason,) = check_fit(deployment(), nodes)
    assert reason.startswith("no single node offers 8 GPUs, 476Gi of memory and 36 CPUs")


def test_node_selector_limits_the_candidates():
    pinned = deployment(node_selector={"gpu": "h200"})
    assert check_fit(pinned, [node()]) == ["no node with labels {'gpu': 'h200'} in the cluster"]
    assert check_fit(pinned, [node(labels={"gpu": "h200"})]) == []
    assert check_fit(deployment(), []) == ["no node in the cluster"]


def test_nodes_as_dataclasses():
    small = deployment(tp=1, cpu_tier="8Gi", engine_memory="16Gi")
    assert check_fit(small, [NodeResources("n", 40 * GiB, 1, 36_000)]) == []


def test_the_probe_counts_when_the_pool_rebalances():
    pool = KVPool.model_validate(
        {
            "apiVersion": "kvtier.io/v1alpha1",
            "kind": "KVPool",
            "metadata": {"name": "p"},
            "spec": {"capacity": "1Ti", "storage": {"csi": {"storageClassName": "fast"}}},
        }
    )
    infd = deployment(tp=1, cpu_tier="8Gi", engine_memory="16Gi", storage={"poolRef": "p", "request": "100Gi"})
    # 16Gi engine + 2Gi shm + 12Gi LMCache = exactly 30Gi, plus the probe's 256Mi with the pool
    exact = [NodeResources("n", 30 * GiB, 1, 64_000)]
    assert check_fit(infd, exact) == []
    assert check_fit(infd, exact, pool=pool) != []


def test_an_unrenderable_spec_is_an_error_not_a_fit():
    pool = KVPool.model_validate(
        {
            "apiVersion": "kvtier.io/v1alpha1",
            "kind": "KVPool",
            "metadata": {"name": "p"},
            "spec": {"capacity": "1Ti", "storage": {"csi": {"storageClassName": "fast", "volumeMode": "Block"}}},
        }
    )
    infd = deployment(mode="LMCacheInProcess", storage={"poolRef": "p", "request": "100Gi"})
    with pytest.raises(UnsupportedStorage):
        check_fit(infd, [node()], pool=pool)


def test_a_tensor_parallel_size_that_strands_gpus_does_not_fit():
    """Issue #23: `tensorParallelSize: 3` on 8-GPU nodes was accepted silently."""
    reasons = check_fit(deployment(tp=3, engine_memory="64Gi", cpu_tier="16Gi"), [node(), node("gpu-1")])
    assert len(reasons) == 1 and "tensorParallelSize 3 does not divide the GPUs of any node" in reasons[0]
    assert "(8)" in reasons[0] and "such as 2" in reasons[0]
    assert check_fit(deployment(tp=4, engine_memory="64Gi", cpu_tier="16Gi"), [node()]) == []


def test_more_replicas_than_the_nodes_hold_at_once_does_not_fit():
    """Issue #23: `replicas: 10000` created thousands of pods; now the fit check refuses before any exists."""
    infd = deployment(tp=2, engine_memory="64Gi", cpu_tier="16Gi")
    nodes = [node(f"gpu-{i}") for i in range(4)]  # 4 nodes x 8 GPUs: 16 replicas of TP 2
    assert check_fit(infd.model_copy(update={"spec": infd.spec.model_copy(update={"replicas": 16})}), nodes) == []
    reasons = check_fit(infd.model_copy(update={"spec": infd.spec.model_copy(update={"replicas": 17})}), nodes)
    assert len(reasons) == 1 and "spec.replicas 17 is more than the nodes hold at once: 16 replica(s)" in reasons[0]
