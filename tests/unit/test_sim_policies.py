"""The replay policies that divide the pool (proportional, the oracles, dynamic re-division) and
`kvtier sim replay`'s outputs."""

import json
import pathlib
import random
import subprocess
import sys

import pytest
import yaml

from kvtier.api.kvpool import RebalanceSpec
from kvtier.rebalance.allocator import Demand, apportion, predict
from kvtier.sim.cache import LRUCache
from kvtier.sim.engine import Engine, EngineParams
from kvtier.sim.hindsight import DepthPartition, Hindsight, HindsightPool
from kvtier.sim.policies import DynamicPolicy, EqualPolicy, Timeline, build_policies, run_policy
from kvtier.sim.references import ExactCurvesPolicy, extrapolated, foresight_reference, intervals
from kvtier.sim.replay import TenantWorkload
from kvtier.sim.scenario import load_scenario
from kvtier.sim.trace import Request
from tests.conftest import SHARED

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCENARIOS = SHARED / "scenarios"
TRACES = SHARED / "traces" / "mooncake"


def _stream(seed, count=400, universe=60):
    rng = random.Random(seed)
    return [tuple(rng.sample(range(universe), rng.randint(1, 6))) for _ in range(count)]


@pytest.mark.parametrize("seed", range(3))
def test_a_depth_partition_of_fixed_size_is_an_lru(seed):
    lru, depth = LRUCache(17), DepthPartition(17)
    for blocks in _stream(seed):
        assert all((block in depth) == (block in lru) for block in blocks)
        assert depth.prefix_hits(blocks, 1) == lru.prefix_hits(blocks, 1)
        assert depth.access(blocks) == lru.access(blocks)
    assert len(depth) == len(lru) == 17


def test_a_depth_partition_gets_its_blocks_back_when_it_grows():
    depth, lru = DepthPartition(4), LRUCache(4)
    for cache in (depth, lru):
        cache.access([1, 2, 3, 4])
        assert cache.resize(1) == (0 if cache is depth else 3)
        cache.resize(4)
    assert depth.access([1, 2, 3, 4]) == 4 and lru.access([1, 2, 3, 4]) == 1


def test_a_hindsight_pool_serves_engines_with_upper_tiers():
    pool = HindsightPool({"a": 2})
    engine = Engine(EngineParams(cpu_blocks=1), pool.partition("a"))
    engine.submit(0.0, [1, 2, 3], 1536, 1)
    assert engine.submit(1.0, [1, 2, 3], 1536, 1).hit_blocks == (0, 1, 1)  # block 1 in the CPU tier, 2 in the pool
    assert pool.set_quota("a", 0) == 0 and pool.usage("a") == 0


def _workload(name, arrivals, blocks):
    return TenantWorkload(name, [Request(t, 512 * len(blocks), 1, tuple(blocks)) for t in arrivals], EngineParams())


def _toy_scenario(tmp_path, capacity=10):
    path = tmp_path / "toy.yaml"
    tenant = {
        "trace": "unused.jsonl",
        "kvBytesPerToken": 1000,
        "prefillTokensPerSecond": 1000,
        "storageReadBytesPerSecond": 1e9,
    }
    path.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "name": "toy",
                "epochSeconds": 10,
                "scrapeSeconds": 5,
                "pool": {"capacityBlocks": capacity},
                "tenants": [{**tenant, "name": "a"}, {**tenant, "name": "b"}],
                "policies": ["equal"],
            }
        )
    )
    return load_scenario(path)


class _Swing(DynamicPolicy):
    """All of the pool to a, then to b, then back to a."""

    name = "swing"
    splits = [{"a": 10, "b": 0}, {"a": 0, "b": 10}, {"a": 10, "b": 0}]

    def initial_quotas(self, scenario):
        return dict(self.splits[0])

    def decide(self, now, current):
        index = round(now / 10)
        return self.splits[index] if index < len(self.splits) else None


def test_dynamic_policies_move_quota_every_epoch_and_the_timeline_counts_moves(tmp_path):
    scenario = _toy_scenario(tmp_path)
    workloads = [_workload("a", range(0, 30, 2), [1, 2]), _workload("b", range(1, 30, 2), [1, 2, 3])]
    timeline = Timeline()
    result = run_policy(_Swing(), scenario, workloads, timeline)
    assert timeline.times[:3] == [0.0, 10, 20]
    assert timeline.quotas[:3] == [{"a": 10, "b": 0}, {"a": 0, "b": 10}, {"a": 10, "b": 0}]
    assert timeline.moves == 4 and timeline.moved_blocks == 20
    # a hits in epoch 0 (4 of its 5 requests) and again in epoch 2 after starting empty; b hits in epoch 1.
    assert result.per_tenant["a"].hit_blocks == 2 * 4 + 2 * 4
    assert result.per_tenant["b"].hit_blocks == 3 * 4
    assert timeline.hit_blocks[-1] == result.overall.hit_blocks
    assert timeline.accessed_blocks[-1] == result.overall.accessed_blocks


def test_a_dynamic_policy_may_not_oversubscribe_the_pool(tmp_path):
    class Greedy(_Swing):
        splits = [{"a": 10, "b": 0}, {"a": 10, "b": 10}]

    with pytest.raises(ValueError, match="does not divide"):
        run_policy(Greedy(), _toy_scenario(tmp_path), [_workload("a", [0, 15], [1]), _workload("b", [1], [2])])


def test_hindsight_epochs_cover_every_tenant_and_sum_to_the_whole_run():
    workloads = [_workload("a", [0, 5, 25], [1, 2]), _workload("b", [12], [1])]
    hindsight = Hindsight(workloads, 10)
    assert hindsight.count == 3 and hindsight.tenants == ["a", "b"]
    assert [hindsight.epoch("a", i).total for i in range(3)] == [4, 0, 2]
    assert hindsight.epoch("b", 2).total == 0
    assert hindsight.whole("a").hits(2) == 4


@pytest.fixture(scope="module")
def three_phased():
    """Every implemented policy on three-phased, once (the oracles share one hindsight)."""
    path = SCENARIOS / "three-phased.yaml"
    if not path.exists() or not TRACES.exists():
        pytest.skip(f"scenario fixture {path} or its traces are absent (expected beside the repository in shared/)")
    scenario = load_scenario(path)
    workloads = scenario.workloads()
    policies = build_policies(["equal", "proportional", "oracle-static", "oracle-dynamic"], scenario, workloads)
    runs = {}
    for name, policy in policies.items():
        timeline = Timeline()
        runs[name] = (policy, run_policy(policy, scenario, workloads, timeline), timeline)
    return scenario, workloads, runs


def _ratio(runs, name):
    return runs[name][1].overall.block_hit_ratio


def test_oracle_static_is_the_best_fixed_split(three_phased):
    scenario, _, runs = three_phased
    policy, result, timeline = runs["oracle-static"]
    assert _ratio(runs, "oracle-static") >= 0.1815
    assert _ratio(runs, "oracle-static") >= max(_ratio(runs, "equal"), _ratio(runs, "proportional"))
    quotas = timeline.quotas[0]
    assert sum(quotas.values()) == scenario.capacity_blocks and timeline.moves == 0
    # The whole-run curves are exact: the allocator's prediction is what the replay measured.
    capacity = scenario.capacity_blocks
    demands = {name: Demand(policy.hindsight.whole(name).hit_curve(capacity)) for name in quotas}
    assert predict(demands, quotas) == result.overall.hit_blocks


def test_oracle_dynamic_reaches_the_reference_upper_bound(three_phased):
    scenario, _, runs = three_phased
    policy, result, timeline = runs["oracle-dynamic"]
    assert _ratio(runs, "oracle-dynamic") == pytest.approx(0.2883, abs=0.01)
    assert _ratio(runs, "oracle-dynamic") > _ratio(runs, "oracle-static")
    assert timeline.moves > 0 and timeline.moved_blocks > 0
    assert all(sum(quotas.values()) <= scenario.capacity_blocks for quotas in timeline.quotas)
    # Replayed through the hindsight pool, the hits are exactly the epoch curves' prediction.
    capacity = scenario.capacity_blocks
    oracle = runs["oracle-static"][0].hindsight
    predicted = sum(
        predict({name: Demand(oracle.epoch(name, index).hit_curve(capacity)) for name in split}, split)
        for index, split in enumerate(policy.splits)
    )
    assert predicted == result.overall.hit_blocks


def test_proportional_shares_follow_the_request_rates(three_phased):
    scenario, workloads, runs = three_phased
    _, result, timeline = runs["proportional"]
    requests = {w.name: len(w.requests) for w in workloads}
    assert requests == {"conv": 12_031, "synA": 3_993, "synB": 3_993}
    assert (
        timeline.quotas[0]
        == apportion(requests, scenario.capacity_blocks)
        == {"conv": 8133, "synA": 2699, "synB": 2699}
    )
    assert _ratio(runs, "equal") < _ratio(runs, "proportional") <= _ratio(runs, "oracle-static")
    assert timeline.moves == 0


def _prefix_scenario(tmp_path, lines=300):
    """Two tenants replaying the first ``lines`` requests of each Mooncake trace, on a 200-block pool."""
    if not TRACES.exists():
        pytest.skip(f"traces {TRACES} are absent")
    tenants = []
    for name, trace in (("conv", "conversation"), ("syn", "synthetic")):
        with open(TRACES / f"mooncake_{trace}_trace.jsonl", encoding="utf-8") as source:
            head = [next(source) for _ in range(lines)]
        (tmp_path / f"{name}.jsonl").write_text("".join(head))
        tenants.append(
            {
                "name": name,
                "trace": f"{name}.jsonl",
                "kvBytesPerToken": 327680,
                "prefillTokensPerSecond": 20000,
                "storageReadBytesPerSecond": 5e9,
            }
        )
    path = tmp_path / "prefix.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "name": "prefix",
                "blockTokens": 512,
                "epochSeconds": 10,
                "scrapeSeconds": 5,
                "pool": {"capacityBlocks": 200},
                "tenants": tenants,
                "policies": ["equal", "proportional", "shared", "oracle-static", "oracle-dynamic", "kvtier"],
            }
        )
    )
    return path


POLICY_KEYS = {
    "block_hit_ratio",
    "hit_blocks",
    "accessed_blocks",
    "token_hit_ratio",
    "prefill_seconds_saved",
    "ttft_p50_seconds",
    "ttft_p99_seconds",
    "moves",
    "moved_blocks",
    "per_tenant",
    # Beyond the format: the cost model's figures and the replay's speed.
    "gpu_prefill_seconds",
    "gpu_prefill_seconds_saved",
    "storage_read_seconds",
    "block_accesses_per_second",
}


def test_cli_replay_writes_the_readme_json_markdown_and_plots(tmp_path):
    scenario = _prefix_scenario(tmp_path)
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "kvtier",
        "sim",
        "replay",
        "--scenario",
        str(scenario),
        "--json",
        str(out / "prefix.json"),
        "--markdown",
        str(out / "prefix.md"),
        "--plot",
        str(out / "prefix.png"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "[6/6] kvtier: block hit ratio" in done.stderr and done.stdout == ""
    report = json.loads((out / "prefix.json").read_text())
    assert set(report) == {"scenario", "policies"} and report["scenario"] == "prefix"
    policies = report["policies"]
    assert list(policies) == ["equal", "proportional", "shared", "oracle-static", "oracle-dynamic", "kvtier"]
    for name in ["equal", "proportional", "shared", "oracle-static", "oracle-dynamic", "kvtier"]:
        entry = policies[name]
        assert set(entry) == POLICY_KEYS
        assert set(entry["per_tenant"]) == {"conv", "syn"}
        for tenant in entry["per_tenant"].values():
            assert set(tenant) == {
                "block_hit_ratio",
                "hit_blocks",
                "accessed_blocks",
                "gpu_prefill_seconds_saved",
                "ttft_p50_seconds",
            }
        assert entry["hit_blocks"] == sum(t["hit_blocks"] for t in entry["per_tenant"].values())
        assert entry["block_hit_ratio"] == pytest.approx(entry["hit_blocks"] / entry["accessed_blocks"])
    assert policies["equal"]["moves"] == 0 and policies["oracle-dynamic"]["moves"] > 0
    assert policies["oracle-static"]["hit_blocks"] >= policies["equal"]["hit_blocks"]
    assert policies["oracle-dynamic"]["hit_blocks"] >= policies["oracle-static"]["hit_blocks"]
    markdown = (out / "prefix.md").read_text()
    assert "| oracle-dynamic |" in markdown and "## `kvtier` rounds" in markdown
    assert "](prefix.png)" in markdown
    assert (out / "prefix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_replay_runs_only_the_named_policies_and_rejects_unknown_ones(tmp_path):
    scenario = _prefix_scenario(tmp_path, lines=50)
    out = tmp_path / "only.json"
    base = [sys.executable, "-m", "kvtier", "sim", "replay", "--scenario", str(scenario), "--json", str(out)]
    done = subprocess.run(base + ["--policies", "equal,shared"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert list(json.loads(out.read_text())["policies"]) == ["equal", "shared"]
    done = subprocess.run(base + ["--policies", "equal,best"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and "best" in done.stderr


def test_equal_policy_quotas_through_the_timeline(tmp_path):
    scenario = _toy_scenario(tmp_path, capacity=7)
    timeline = Timeline()
    run_policy(EqualPolicy(), scenario, [_workload("a", [0, 12], [1]), _workload("b", [1], [2])], timeline)
    assert timeline.quotas[0] == timeline.quotas[-1] == {"a": 4, "b": 3} and timeline.moves == 0


def test_a_least_squares_trend_reads_a_linear_growth_exactly_and_stays_a_hit_curve():
    growing = [[(1 + index) * units for units in range(5)] for index in range(4)]
    assert extrapolated(growing, 4) == [5.0 * units for units in range(5)]
    assert extrapolated(growing, 1.5) == pytest.approx([2.5 * units for units in range(5)])
    # A falling line is cut at 0, and a dip at a larger quota is lifted: more room never hits less.
    falling = [[0.0, 4.0, 3.0], [0.0, 2.0, 3.0]]
    assert extrapolated(falling, 3) == [0.0, 0.0, 3.0]
    assert extrapolated([[0.0, 5.0, 1.0], [0.0, 5.0, 1.0]], 2) == [0.0, 5.0, 5.0]
    with pytest.raises(ValueError, match="two curves"):
        extrapolated([[0.0, 1.0]], 1)


def test_the_exact_curves_reference_reads_the_window_it_names(three_phased):
    scenario, workloads, _ = three_phased
    with pytest.raises(ValueError, match="first < last"):
        ExactCurvesPolicy(scenario, 0, 0)
    with pytest.raises(ValueError, match="two for a trend"):
        ExactCurvesPolicy(scenario, -1, 0, trend=True)
    past, next_ = ExactCurvesPolicy(scenario, -1, 0), ExactCurvesPolicy(scenario, 0, 1)
    for policy in (past, next_):
        run_policy(policy, scenario, workloads)
    interval = next_.settings.interval_seconds
    unit = next_.unit_blocks
    exact = Hindsight(workloads, interval)
    for tenant in exact.tenants:
        # The last interval seen at the end of interval 9 is the next one seen at its start.
        seen = past.estimate(tenant, 10 * interval, 8, unit_chunks=unit, front_chunks=0)
        foreseen = next_.estimate(tenant, 9 * interval, 8, unit_chunks=unit, front_chunks=0)
        assert seen == foreseen
        per_second = scenario.block_tokens / interval
        assert seen.curve == tuple(exact.epoch(tenant, 9).hits(units * unit) * per_second for units in range(9))


def test_reference_windows_are_whole_intervals_nearest_their_seconds(three_phased):
    scenario = three_phased[0]

    def every(seconds: str):
        return scenario.model_copy(update={"rebalance": RebalanceSpec(interval=seconds)})

    assert [intervals(every("30s"), seconds) for seconds in (60, 600, 10)] == [2, 20, 1]
    assert [intervals(every("1m"), seconds) for seconds in (60, 600, 10)] == [1, 10, 1]
    assert intervals(every("45s"), 60) == 1 and intervals(every("45s"), 120) == 3
    assert foresight_reference(every("30s")).last == 2
