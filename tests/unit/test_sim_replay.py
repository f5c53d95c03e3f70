"""The engine model (tiers, latency, gauges), the virtual-time replay with hooks, scenarios and
the pool policies that need no rebalancer (shared, equal) on the three-phased scenario."""

import pathlib

import pytest
import yaml
from pydantic import ValidationError

from kvtier.rebalance.costmodel import CostModel
from kvtier.sim.cache import IsolatedLRU, LRUCache
from kvtier.sim.engine import Engine, EngineParams, Tier
from kvtier.sim.policies import EqualPolicy, SharedPolicy, run_policy, split_evenly
from kvtier.sim.replay import Replay, TenantWorkload, percentile
from kvtier.sim.scenario import auto_replicas, load_scenario
from kvtier.sim.trace import Request
from tests.conftest import SHARED

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCENARIOS = SHARED / "scenarios"
TRACES = SHARED / "traces" / "mooncake"

PARAMS = EngineParams(
    block_tokens=512,
    kv_bytes_per_token=1000,
    prefill_tokens_per_second=10_000,
    cpu_read_bytes_per_second=1e9,
    storage_read_bytes_per_second=1e8,
    max_running_requests=4,
    decode_seconds_per_token=0.01,
)


def test_lookup_walks_the_tiers_in_order_and_stores_into_all():
    params = EngineParams(
        kv_bytes_per_token=1000,
        prefill_tokens_per_second=10_000,
        cpu_read_bytes_per_second=1e9,
        storage_read_bytes_per_second=1e8,
        hbm_blocks=2,
        cpu_blocks=4,
    )
    engine = Engine(params, LRUCache(100))
    prompt = [1, 2, 3, 4, 5, 6]
    first = engine.submit(0.0, prompt, 6 * 512 - 100, 1)
    assert first.hit_blocks == (0, 0, 0)
    again = engine.submit(100.0, prompt, 6 * 512 - 100, 1)
    # HBM keeps the 2 most recent (blocks 1, 2), the CPU tier 4, storage everything.
    assert again.hit_blocks == (2, 2, 2)
    assert again.hit_tokens == (1024, 1024, 1024 - 100)
    stats = engine.stats
    assert stats.accessed_blocks == 12 and stats.total_hit_blocks == 6
    assert stats.block_hit_ratio == 0.5
    assert stats.token_hit_ratio == (3 * 1024 - 100) / (2 * (6 * 512 - 100))
    assert stats.external_query_tokens == 2 * (6 * 512 - 100) - 1024
    assert stats.external_hit_tokens == 2 * 1024 - 100
    saved = sum(2 * params.prefill_seconds_saved_per_block(tier) for tier in Tier)
    assert stats.prefill_seconds_saved == pytest.approx(saved)
    assert params.prefill_seconds_saved_per_block(Tier.HBM) == 512 / 10_000
    assert params.prefill_seconds_saved_per_block(Tier.STORAGE) == pytest.approx(512 / 10_000 - 512 * 1000 / 1e8)
    # Load from the lower tiers, then prefill of the 0 missed tokens.
    assert again.ttft == pytest.approx((1024 * 1000) / 1e9 + (924 * 1000) / 1e8)


def test_a_storage_block_behind_a_cpu_block_still_counts_in_the_prefix():
    params = EngineParams(cpu_blocks=1)
    storage = LRUCache(10)
    engine = Engine(params, storage)
    storage.touch([2])
    engine.cpu.touch([1])
    assert engine.submit(0.0, [1, 2, 3], 1536, 1).hit_blocks == (0, 1, 1)


def test_prefill_is_serial_and_ttft_grows_with_load():
    engine = Engine(PARAMS)
    ttfts = [engine.submit(0.0, [i], 1000, 10).ttft for i in range(3)]
    assert ttfts == pytest.approx([0.1, 0.2, 0.3])


def test_a_full_batch_queues_requests_and_gauges_follow():
    params = EngineParams(
        hbm_blocks=100, prefill_tokens_per_second=1e6, max_running_requests=2, decode_seconds_per_token=1.0
    )
    engine = Engine(params)
    for i in range(3):
        engine.submit(0.0, [10 * i, 10 * i + 1], 1000, 10)  # 2 prompt blocks + 1 output block each
    assert engine.running(5.0) == 2 and engine.waiting(5.0) == 1
    assert engine.watermark(5.0) == pytest.approx(0.06)
    # The first two decode until ~10 s; the third takes a freed slot then and decodes until ~20 s.
    assert engine.running(10.5) == 1 and engine.waiting(10.5) == 0
    assert engine.watermark(10.5) == pytest.approx(0.03)
    assert engine.running(100.0) == 0 and engine.watermark(100.0) == 0.0
    assert Engine(PARAMS).watermark(0.0) == 0.0  # no HBM tier modelled


def test_requests_must_arrive_in_order():
    engine = Engine(PARAMS)
    engine.submit(5.0, [1], 10, 1)
    with pytest.raises(ValueError):
        engine.submit(4.0, [1], 10, 1)


def test_engine_params_are_validated():
    with pytest.raises(ValueError):
        EngineParams(prefill_tokens_per_second=0)
    with pytest.raises(ValueError):
        EngineParams(hbm_blocks=-1)


def _workload(name, arrivals, blocks, salt=None, replicas=1):
    requests = [Request(t, 512 * len(blocks), 1, tuple(blocks)) for t in arrivals]
    return TenantWorkload(name, requests, PARAMS, salt=salt, replicas=replicas)


def test_hooks_run_in_virtual_time_and_can_move_quota():
    replay = Replay([_workload("a", range(0, 100, 5), [1, 2])], IsolatedLRU())
    calls = []

    def epoch(now):
        calls.append(("epoch", now, replay.now))
        if now == 30:
            replay.set_quota("a", 2)

    replay.every(30, epoch)
    replay.every(15, lambda now: calls.append(("scrape", now)))
    result = replay.run()
    assert calls == [
        ("scrape", 15),
        ("epoch", 30, 30),
        ("scrape", 30),
        ("scrape", 45),
        ("epoch", 60, 60),
        ("scrape", 60),
        ("scrape", 75),
        ("epoch", 90, 90),
        ("scrape", 90),
    ]
    # Quota 0 until t=30: the requests at 30 (a miss: the partition starts empty), 35, ..., 95 hit.
    assert result.overall.hit_blocks == 2 * 13
    assert replay.quota("a") == 2
    with pytest.raises(RuntimeError):
        replay.run()
    with pytest.raises(ValueError):
        replay.every(0, print)


def test_tenants_merge_in_time_order_and_share_or_split_the_pool():
    seen = []
    a = _workload("a", [0, 2, 4], [1])
    b = _workload("b", [1, 2, 3], [1])  # the same block id: tenants never share blocks unless namespaced alike
    replay = Replay([a, b], IsolatedLRU({"a": 1, "b": 1}))
    for name, engines in replay.replicas.items():
        engines[0].listeners.append(lambda outcome, name=name: seen.append((outcome.arrival, name)))
    result = replay.run()
    assert seen == [(0, "a"), (1, "b"), (2, "a"), (2, "b"), (3, "b"), (4, "a")]
    assert result.per_tenant["a"].hit_blocks == 2 and result.per_tenant["b"].hit_blocks == 2
    shared = Replay(
        [_workload("a", [0, 2], [1, 2], salt="s"), _workload("b", [1], [3, 4], salt="s")], IsolatedLRU({"s": 2})
    ).run()
    assert shared.overall.hit_blocks == 0  # b's request evicted a's blocks from the shared LRU
    assert shared.to_dict()["per_tenant"]["a"]["accessed_blocks"] == 4


def test_replicas_share_the_tenant_partition_and_split_the_load():
    # Without storage every request prefills for the same time: the replicas take turns.
    replay = Replay([_workload("a", [0, 0, 0, 0], [1], replicas=2)])
    replay.run()
    assert [engine.stats.requests for engine in replay.replicas["a"]] == [2, 2]
    # With a quota, a block stored through one replica hits through the other.
    replay = Replay([_workload("a", [0, 1], [1], replicas=2)], IsolatedLRU({"a": 10}))
    assert replay.run().overall.hit_blocks == 1
    assert [engine.stats.total_hit_blocks for engine in replay.replicas["a"]] == [0, 1]
    with pytest.raises(ValueError):
        Replay([_workload("a", [1, 0], [1])])
    with pytest.raises(ValueError):
        Replay([_workload("a", [0], [1]), _workload("a", [0], [1])])


def test_percentile_interpolates():
    assert percentile([], 50) == 0.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([1.0, 2.0], 99) == pytest.approx(1.99)


def test_split_evenly():
    assert split_evenly(13531, 3) == [4511, 4510, 4510]
    assert sum(split_evenly(7, 7)) == 7


def _scenario(tmp_path, **overrides):
    (tmp_path / "t.jsonl").write_text(
        '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0, 1]}\n'
        '{"timestamp": 1000, "input_length": 600, "output_length": 1, "hash_ids": [0, 1]}\n'
    )
    tenant = {
        "name": "a",
        "trace": "t.jsonl",
        "kvBytesPerToken": 1000,
        "prefillTokensPerSecond": 100,
        "storageReadBytesPerSecond": 1e9,
    }
    data = {
        "version": 1,
        "name": "s",
        "epochSeconds": 300,
        "scrapeSeconds": 15,
        "pool": {"capacityBlocks": 10},
        "tenants": [tenant, {**tenant, "name": "b"}],
        "policies": ["equal", "shared"],
        **overrides,
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_scenario_loading_and_pool_capacity(tmp_path):
    scenario = load_scenario(_scenario(tmp_path))
    assert scenario.capacity_blocks == 10
    workloads = scenario.workloads()
    assert [w.name for w in workloads] == ["a", "b"]
    assert workloads[0].requests[1].arrival == 1.0
    assert workloads[0].requests[0].blocks != workloads[1].requests[0].blocks  # namespaced per tenant
    assert workloads[0].params.kv_bytes_per_token == 1000
    result = run_policy(EqualPolicy(), scenario, workloads)
    assert result.overall.hit_blocks == 4
    in_bytes = load_scenario(_scenario(tmp_path, pool={"capacity": "1Mi"}))
    assert in_bytes.capacity_blocks == 2**20 // (512 * 1000)


@pytest.mark.parametrize(
    "overrides",
    [
        {"pool": {"capacityBlocks": 10, "capacity": "1Gi"}},
        {"pool": {}},
        {"pool": {"capacity": "lots"}},
        {"policies": ["best"]},
        {"version": 2},
        {"surprise": True},
        {"tenants": []},
    ],
)
def test_invalid_scenarios_are_rejected(tmp_path, overrides):
    with pytest.raises(ValidationError):
        load_scenario(_scenario(tmp_path, **overrides))


def test_duplicate_tenants_and_mixed_block_sizes_are_rejected(tmp_path):
    path = _scenario(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["tenants"][1]["name"] = "a"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValidationError, match="unique"):
        load_scenario(path)
    data["tenants"][1].update(name="b", kvBytesPerToken=2000)
    data["pool"] = {"capacity": "1Gi"}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValidationError, match="kvBytesPerToken"):
        load_scenario(path)


def test_auto_replicas_follow_the_prefill_demand():
    requests = [Request(float(t), 10_000, 1, (t,)) for t in range(101)]  # 10,000 tokens/s for 100 s
    assert auto_replicas(requests, CostModel.linear(7_000, 1, 1.0)) == 3
    assert auto_replicas(requests[:1], CostModel.linear(1, 1, 1.0)) == 1


@pytest.fixture(scope="module")
def three_phased():
    path = SCENARIOS / "three-phased.yaml"
    if not path.exists() or not TRACES.exists():
        pytest.skip(f"scenario fixture {path} or its traces are absent (expected beside the repository in shared/)")
    scenario = load_scenario(path)
    return scenario, scenario.workloads()


@pytest.mark.parametrize("policy, expected", [(SharedPolicy(), 0.2662), (EqualPolicy(), 0.1753)])
def test_three_phased_static_policies_match_the_reference(three_phased, policy, expected):
    scenario, workloads = three_phased
    result = run_policy(policy, scenario, workloads)
    assert result.overall.accessed_blocks == 532_254
    assert result.overall.block_hit_ratio == pytest.approx(expected, abs=0.003)
    assert result.overall.hit_blocks == sum(r.hit_blocks for r in result.per_tenant.values())
    assert 0 < result.overall.ttft_p50_seconds < result.overall.ttft_p99_seconds
