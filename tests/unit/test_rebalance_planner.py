"""The capacity planner (pure): exact hits of a static split, the allocator's division, prices, the pick."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.probe.stackdist import StackDistanceTracker
from kvtier.rebalance import planner, prices
from kvtier.rebalance.allocator import allocate
from kvtier.rebalance.costmodel import CostModel
from kvtier.sim import planning
from kvtier.sim.cache import LRUCache

COST = CostModel.linear(20000, 327680, 5e9)
BLOCK_TOKENS = 4


def profile(name, requests, prompts=None, **fields):
    """A tenant whose requests (block id lists) arrive one a second."""
    tracker = StackDistanceTracker()
    prompts = prompts or [len(blocks) * BLOCK_TOKENS for blocks in requests]
    return planner.TenantProfile(
        name,
        [float(i) for i in range(len(requests))],
        prompts,
        [tracker.access(blocks) for blocks in requests],
        BLOCK_TOKENS,
        COST,
        **fields,
    )


def lru_hits(requests, quota):
    """Prefix hits of a plain LRU of ``quota`` blocks (the replay engine's storage tier)."""
    cache = LRUCache(quota)
    return sum(cache.access(blocks) for blocks in requests)


REQUESTS = [[1, 2, 3], [1, 2, 4], [5, 6], [1, 2, 3, 7], [5, 6, 8], [1, 9], [2, 3], [1, 2, 3, 7, 10]]


@pytest.mark.parametrize("quota", [0, 1, 2, 3, 5, 8, 100])
def test_evaluate_hits_what_an_lru_of_the_quota_hits(quota):
    tenant = profile("a", REQUESTS)
    outcome = planning.evaluate([tenant], {"a": quota}, block_bytes=BLOCK_TOKENS * 327680)
    assert outcome.per_tenant["a"].hit_blocks == lru_hits(REQUESTS, quota)
    assert outcome.per_tenant["a"].accessed_blocks == sum(map(len, REQUESTS))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=6, unique=True), max_size=30), st.integers(0, 14))
def test_evaluate_matches_an_lru_on_any_stream(requests, quota):
    tenant = profile("a", requests)
    outcome = planning.evaluate([tenant], {"a": quota}, block_bytes=1)
    assert outcome.per_tenant["a"].hit_blocks == lru_hits(requests, quota)


def test_token_hits_count_a_partial_last_block_once():
    # Prompts of 9 tokens in 3 blocks of 4: the last block holds 1 token.
    tenant = profile("a", [[1, 2, 3], [1, 2, 3]], prompts=[9, 9])
    outcome = planning.evaluate([tenant], {"a": 10}, block_bytes=1)
    assert outcome.per_tenant["a"].hit_tokens == 9
    assert tenant.hit_tokens(10) == 9
    assert outcome.per_tenant["a"].token_hit_ratio == pytest.approx(0.5)


def test_split_is_the_allocators_division_in_whole_units():
    tenants = [profile("a", REQUESTS), profile("b", [[20 + i % 3] for i in range(12)])]
    quotas = planner.split(tenants, 6)
    demands = {t.name: t.demand(6, 1) for t in tenants}
    assert quotas == allocate(demands, 6)
    assert sum(quotas.values()) <= 6
    # A big pool is divided in about PLAN_UNITS units of whole blocks.
    big = planner.split(tenants, 3 * planner.PLAN_UNITS + 5)
    assert all(quota % 4 == 0 for quota in big.values())


def test_bounds_are_kept():
    tenants = [profile("a", REQUESTS, max_blocks=1), profile("b", [[20 + i % 3] for i in range(12)], min_blocks=4)]
    quotas = planner.split(tenants, 8)
    assert quotas["a"] <= 1 and quotas["b"] >= 4
    with pytest.raises(ValueError, match="minimums"):
        planner.plan(tenants, [3], evaluate=planning.evaluate, block_bytes=1)


def test_more_capacity_never_hits_less():
    tenants = [profile("a", REQUESTS), profile("b", [[20 + i % 5, 30 + i % 2] for i in range(20)])]
    outcomes = planner.plan(tenants, range(0, 16), evaluate=planning.evaluate, block_bytes=1)
    ratios = [o.block_hit_ratio for o in outcomes]
    assert ratios == sorted(ratios) and ratios[-1] > ratios[0]


def test_read_bandwidth_peak_and_saturation():
    tenant = profile("a", [[1, 2]] * 4)  # one request a second, 2 blocks hit from the second on
    outcome = planning.evaluate([tenant], {"a": 2}, block_bytes=1, read_bandwidth=1.0)
    read = 3 * 2 * BLOCK_TOKENS * 327680
    assert outcome.read_bytes_per_second_peak == pytest.approx(read / planner.PEAK_WINDOW_SECONDS)
    assert outcome.saturated
    assert not planning.evaluate([tenant], {"a": 2}, block_bytes=1, read_bandwidth=1e12).saturated


PRICES = {
    "currency": "CNY",
    "amortizationYears": 2,
    "options": [
        {"name": "slow", "perArray": {"price": 100, "capacity": "10", "readBandwidth": "1"}},
        {"name": "fast", "perArray": {"price": 300, "capacity": "10", "readBandwidth": "100"}},
        {"name": "by-tb", "perTB": 5e12},
    ],
}


def test_prices_per_array_round_up_and_per_tb_is_linear():
    table = prices.price_table(PRICES)
    slow, fast, by_tb = table.options
    assert slow.price(10) == 100 and slow.price(11) == 200 and slow.arrays(25) == 3
    assert by_tb.price(3) == pytest.approx(15)
    assert table.choose(3, read_bytes_per_second=2.0)[0].name == "by-tb"
    # The cheapest option whose arrays carry the reads, else the cheapest of all.
    arrays = prices.PriceTable("CNY", (slow, fast))
    assert arrays.choose(10, read_bytes_per_second=0.5) == (slow, 100)
    assert arrays.choose(10, read_bytes_per_second=2.0) == (fast, 300)
    assert arrays.choose(20, read_bytes_per_second=2.0) == (slow, 200)  # two slow arrays read 2 bytes/s
    assert arrays.choose(10, read_bytes_per_second=2.0, read_bandwidth=1.0) == (slow, 100)  # the pool's limit


def test_price_table_from_a_configmap_and_errors_name_the_field():
    import yaml

    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "p"},
        "data": {"prices.yaml": yaml.safe_dump(PRICES)},
    }
    assert prices.price_table(configmap).amortization_years == 2
    with pytest.raises(ValueError, match=r"data.prices.yaml"):
        prices.price_table({"kind": "ConfigMap", "data": {}})
    with pytest.raises(ValueError, match=r"options\[0\] \(x\).*exactly one of perArray and perTB"):
        prices.price_table({"options": [{"name": "x"}]})
    with pytest.raises(ValueError, match=r"options\[0\] \(x\)"):
        prices.price_table({"options": [{"name": "x", "perArray": {"price": 1, "capacity": "lots"}}]})
    with pytest.raises(ValueError, match="options"):
        prices.price_table({"currency": "CNY"})


def outcome(blocks, ratio, ttft=1.0, saved=3600.0, price=None):
    per_tenant = {"a": planner.TenantOutcome(blocks, 1, 100, round(100 * ratio), 100, round(100 * ratio), 0, 0)}
    return planner.CapacityOutcome(blocks, blocks, per_tenant, saved, ttft, ttft, 0, 0, None, price, None)


def test_pick_the_smallest_capacity_meeting_every_target():
    outcomes = [outcome(30, 0.5, ttft=2.0), outcome(10, 0.1), outcome(20, 0.3, ttft=3.0)]
    chosen = planner.pick(outcomes, planner.Targets(hit_ratio=0.3))
    assert chosen.capacity.capacity_blocks == 20 and "block hit ratio 0.300 >= 0.3" in chosen.reason
    chosen = planner.pick(outcomes, planner.Targets(hit_ratio=0.3, ttft_p50_seconds=2.5))
    assert chosen.capacity.capacity_blocks == 30
    none = planner.pick(outcomes, planner.Targets(hit_ratio=0.9))
    assert none.capacity is None and "no capacity tried meets block hit ratio >= 0.9" in none.reason
    assert "try larger --capacities" in none.reason
    flat = planner.pick([*outcomes, outcome(40, 0.5)], planner.Targets(hit_ratio=0.9))
    assert "from 30 blocks" in flat.reason and "more capacity does not help" in flat.reason
    assert planner.pick(outcomes, planner.Targets()).capacity is None


def test_pick_by_price_per_saved_gpu_hour():
    # 1 GPU-hour saved per hour over 2 years: 17,520 GPU-hours.
    outcomes = [outcome(10, 0.1, saved=0.0, price=1.0), outcome(20, 0.2, saved=3600.0, price=17520.0)]
    assert outcomes[0].price_per_saved_gpu_hour(2) == math.inf
    chosen = planner.pick(outcomes, planner.Targets(max_price_per_saved_gpu_hour=1.0), amortization_years=2)
    assert chosen.capacity.capacity_blocks == 20
    unpriced = [outcome(10, 0.1)]
    assert "needs a price table" in planner.pick(unpriced, planner.Targets(max_price_per_saved_gpu_hour=1)).reason


def test_refine_bisects_toward_the_smallest_capacity_meeting_the_target():
    tenant = profile("a", [[i % 40] for i in range(400)])  # a loop of 40 blocks: hits only from 40 blocks on
    coarse = planner.plan([tenant], [10, 80], evaluate=planning.evaluate, block_bytes=1)
    refined = planner.refine(
        [tenant], coarse, planner.Targets(hit_ratio=0.5), evaluate=planning.evaluate, block_bytes=1, steps=8
    )
    chosen = planner.pick(refined, planner.Targets(hit_ratio=0.5))
    assert chosen.capacity.capacity_blocks == 40


def test_caveats_name_tenants_with_tiers_in_front_of_the_pool(tmp_path):
    from kvtier.sim.scenario import Scenario

    tenant = {"trace": "t.jsonl", "kvBytesPerToken": 1, "prefillTokensPerSecond": 1, "storageReadBytesPerSecond": 1}
    scenario = Scenario.model_validate(
        {
            "version": 1,
            "name": "s",
            "epochSeconds": 1,
            "scrapeSeconds": 1,
            "pool": {"capacityBlocks": 4},
            "policies": ["equal"],
            "tenants": [{"name": "plain", **tenant}, {"name": "fronted", "cpuBlocks": 8, **tenant}],
        }
    )
    assert planning.caveats(scenario) == [
        "tenants fronted have HBM/CPU tiers in front of the pool (hbmBlocks/cpuBlocks); the plan takes the pool as "
        "their only tier, so it over-states the pool's hits for them"
    ]
    assert planning.caveats(scenario.model_copy(update={"tenants": scenario.tenants[:1]})) == []


def test_live_pools_read_chunk_curves_bounds_and_say_who_is_left_out():
    import copy

    import yaml

    from kvtier.rebalance.costmodel import preset
    from kvtier.rebalance.planlive import LIVE_BLOCK_BYTES, live_pools
    from tests.conftest import EXAMPLES

    pool = next(d for d in yaml.safe_load_all((EXAMPLES / "kvpool.yaml").read_text()) if d)
    deployment = next(d for d in yaml.safe_load_all((EXAMPLES / "inferencedeployment.yaml").read_text()) if d)
    deployment["metadata"]["namespace"] = "ml"
    chunk_bytes = deployment["spec"]["kvCache"].get("chunkSize", 256) * 253952  # the example's model
    published = copy.deepcopy(deployment)
    published["status"] = {
        "kv": {
            "promptTokensPerSecond": 100.0,
            "demand": {"unit": "chunks", "points": [{"capacity": 1000, "hitRatio": 0.5}]},
        }
    }
    silent = copy.deepcopy(deployment)
    silent["metadata"]["name"] = "silent"
    broken = {"kind": "InferenceDeployment", "metadata": {"name": "broken"}, "spec": {"replicas": "many"}}
    [live] = live_pools([pool], [published, silent, broken], preset("llama-3-70b-4xh100"))
    [profile] = live.profiles
    assert profile.name == "ml/coder-480b" and live.without_curve == [
        "ml/silent: no status.kv.demand yet (the probe publishes it once lookups arrive)"
    ]
    replicas = deployment["spec"]["replicas"]
    assert profile.points == [(1000 * chunk_bytes, 0.5)]
    assert profile.hit_ratio(500 * chunk_bytes * replicas / LIVE_BLOCK_BYTES) == pytest.approx(0.25)
    assert profile.hit_ratio(10**9) == 0.5
    outcome = planner.evaluate_curves([profile], {profile.name: 10**9}, block_bytes=LIVE_BLOCK_BYTES)
    assert outcome.token_hit_ratio == pytest.approx(0.5) and outcome.ttft_p50_seconds is None
    assert outcome.gpu_seconds_saved_per_hour == pytest.approx(100 * 3600 * 0.5 * profile.saved_per_hit_token)
    assert live.read_bandwidth == 5e9 * replicas  # spec.readBandwidth is what one replica reads
    ttft = planner.pick([outcome], planner.Targets(ttft_p50_seconds=1.0))
    assert ttft.capacity is None and "needs requests to queue" in ttft.reason
