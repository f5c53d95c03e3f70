"""Models: wire format round trips, defaults, and the derived values other packages rely on."""

import yaml

from kvtier.api import InferenceDeployment, KVPool
from tests.conftest import EXAMPLES


def _load(name):
    return yaml.safe_load((EXAMPLES / name).read_text())


def test_kv_bytes_per_token_of_the_480b_example():
    infd = InferenceDeployment.model_validate(_load("inferencedeployment.yaml"))
    # 2 (K and V) x 62 layers x 8 KV heads x 128 head dim x 2 bytes (bf16)
    assert infd.spec.model.bytes_per_token == 253_952
    assert infd.spec.chunk_bytes == 256 * 253_952
    assert infd.spec.served_name == "coder"


def test_cpu_tier_memory_counts_every_rank_only_in_process():
    body = _load("inferencedeployment.yaml")
    mp = InferenceDeployment.model_validate(body)
    assert mp.spec.cpu_tier_memory_bytes == 200 * 2**30
    body["spec"]["kvCache"]["mode"] = "LMCacheInProcess"
    in_process = InferenceDeployment.model_validate(body)
    assert in_process.spec.cpu_tier_memory_bytes == 8 * 200 * 2**30
    body["spec"]["kvCache"] = {"mode": "None"}
    assert InferenceDeployment.model_validate(body).spec.cpu_tier_memory_bytes == 0


def test_storage_bounds_default_to_zero_and_request():
    body = _load("inferencedeployment.yaml")
    body["spec"]["kvCache"]["storage"] = {"poolRef": "fx100-a", "request": "2Ti"}
    storage = InferenceDeployment.model_validate(body).spec.kv_cache.storage
    assert (storage.effective_min, storage.request, storage.effective_max) == (0, 2 * 2**40, 2 * 2**40)


def test_wire_round_trip_keeps_camel_case_and_units():
    body = _load("kvpool.yaml")
    body["spec"]["storage"]["nvmeof"]["connect"] = {"ctrlLossTmo": 600, "reconnectDelay": 10}
    pool = KVPool.model_validate(body)
    wire = pool.to_wire()
    assert wire["spec"]["capacity"] == "90Ti"
    assert wire["spec"]["storage"]["nvmeof"]["hostNQN"] == body["spec"]["storage"]["nvmeof"]["hostNQN"]
    assert wire["spec"]["storage"]["nvmeof"]["connect"] == {"ctrlLossTmo": 600, "reconnectDelay": 10}
    assert wire["spec"]["rebalance"]["interval"] == "1m"
    assert KVPool.model_validate(wire) == pool


def test_defaults_match_the_crd_defaults():
    pool = KVPool.model_validate(_load("kvpool-csi.yaml"))
    assert pool.spec.rebalance.policy == "MarginalGain"
    assert (pool.spec.rebalance.interval, pool.spec.rebalance.cooldown) == (60, 60)
    assert pool.spec.rebalance.max_step == 0.5
    assert pool.spec.storage.backend == "csi"
    assert pool.spec.storage.csi.volume_mode == "Block"
