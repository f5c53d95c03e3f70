"""The rebalancer under its shipped defaults, on the public scenario and every scenario in bench/scenarios.

What the README's table claims, judged policy against policy within each replay (no figures pinned):
kvtier within 5% of the best of one shared LRU and the hindsight per-epoch split, never below what
perfect knowledge of the previous epoch would give, more GPU prefill seconds saved than the equal
split, and a TTFT p50 no worse than it. The two known misses are strict xfails, so they fail the
day they start passing (then the README's table and this file change together).
"""

import functools
import pathlib

import pytest
import yaml

from kvtier.sim.hindsight import Hindsight
from kvtier.sim.policies import (
    OracleDynamicPolicy,
    PreviousEpochOracle,
    build_policies,
    run_policy,
)
from kvtier.sim.replay import TenantResult
from kvtier.sim.scenario import load_scenario
from tests.conftest import SHARED

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCENARIOS = {
    path.stem: path
    for path in [SHARED / "scenarios" / "three-phased.yaml", *sorted((ROOT / "bench" / "scenarios").glob("*.yaml"))]
}
#: kvtier's share of max(shared, oracle-dynamic) the issue asks for.
SHARE_OF_BEST = 0.95


@functools.cache
def replayed(name: str) -> dict[str, TenantResult]:
    path = SCENARIOS[name]
    if not path.exists():
        pytest.skip(f"scenario {path} is absent")
    assert "rebalance" not in yaml.safe_load(path.read_text()), "the table is of the shipped defaults"
    scenario = load_scenario(path)
    workloads = scenario.workloads()
    hindsight = Hindsight(workloads, scenario.epoch_seconds)
    policies = {
        **build_policies(["equal", "shared", "kvtier"], scenario, workloads),
        "oracle-dynamic": OracleDynamicPolicy(scenario, hindsight),
        "previous-epoch-oracle": PreviousEpochOracle(scenario, hindsight),
    }
    return {key: run_policy(policy, scenario, workloads).overall for key, policy in policies.items()}


def _cases(misses: dict[str, str]) -> list:
    return [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=misses[name])) if name in misses else name
        for name in SCENARIOS
    ]


@pytest.mark.parametrize(
    "name",
    _cases(
        {
            "steady-two": "the hindsight split foresees the synthetic tenant's last 15 minutes; no causal "
            "split reaches 95% of it (see the next test and the README)"
        }
    ),
)
def test_kvtier_is_within_five_percent_of_the_best_of_shared_and_hindsight(name):
    results = replayed(name)
    best = max(results["shared"].block_hit_ratio, results["oracle-dynamic"].block_hit_ratio)
    assert results["kvtier"].block_hit_ratio >= SHARE_OF_BEST * best


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_kvtier_does_at_least_what_perfect_knowledge_of_the_past_does(name):
    """The causal bound: the split that was best for the previous epoch's exact curves."""
    results = replayed(name)
    assert results["kvtier"].block_hit_ratio >= results["previous-epoch-oracle"].block_hit_ratio
    assert results["kvtier"].block_hit_ratio > results["equal"].block_hit_ratio


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_kvtier_saves_more_gpu_prefill_than_the_equal_split(name):
    results = replayed(name)
    assert results["kvtier"].gpu_prefill_seconds_saved > results["equal"].gpu_prefill_seconds_saved > 0


@pytest.mark.parametrize(
    "name",
    _cases(
        {
            "three-phased": "the scenario's flat figures load a hit slower than they recompute it "
            "(65.5 us a token at 5 GB/s against 50 us at 20,000 tokens/s): more hits, slower first tokens"
        }
    ),
)
def test_kvtier_ttft_p50_is_no_worse_than_the_equal_split(name):
    results = replayed(name)
    assert results["kvtier"].ttft_p50_seconds <= results["equal"].ttft_p50_seconds
