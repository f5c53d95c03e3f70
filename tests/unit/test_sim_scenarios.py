"""The rebalancer under its shipped defaults, on the public scenario and every scenario in bench/scenarios.

What the README's table claims, judged policy against policy within each replay (no figures pinned):
kvtier within 5% of the best of one shared LRU and the hindsight per-epoch split, never below what
perfect knowledge of the previous epoch would give, more GPU prefill seconds saved than the equal
split, and a TTFT p50 no worse than it. Two of these cannot hold everywhere, and the tests say where
and why instead of skipping: a hindsight margin that no causal estimate reaches at the shipped rounds
(``steady-two``; at 30-second rounds one does, README), and figures on which a hit loads slower than
it recomputes (the flat ``three-phased``). There the tests check the reason and the closest bar that
can hold (the README, below its scenario table).
"""

import functools
import importlib.util
import pathlib
import re
import sys

import pytest
import yaml

from kvtier.sim.hindsight import Hindsight
from kvtier.sim.policies import (
    OracleDynamicPolicy,
    build_policies,
    run_policy,
)
from kvtier.sim.references import (
    CAUSAL_REFERENCES,
    FORESIGHT_SECONDS,
    ExactCurvesPolicy,
    PreviousEpochOracle,
    foresight_reference,
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
#: A scenario on the format's flat figures -> its twin: the same traces, phases, pool and storage
#: bandwidth, with each tenant's prefill from a calibrated preset (docs/cost-model.md).
CALIBRATED_TWINS = {"three-phased": "three-phased-llama70b"}


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


@functools.cache
def exact_curve_references(name: str) -> tuple[float, float]:
    """Block hit ratios of the loop on exact curves: the best over the recent past's windows and
    trends (:data:`CAUSAL_REFERENCES`), and with the next minute's (foresight)."""
    scenario = load_scenario(SCENARIOS[name])
    workloads = scenario.workloads()

    def ratio(policy: ExactCurvesPolicy) -> float:
        return run_policy(policy, scenario, workloads).overall.block_hit_ratio

    causal = max(ratio(policy_of(scenario)) for policy_of in CAUSAL_REFERENCES.values())
    return causal, ratio(foresight_reference(scenario))


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_kvtier_is_within_five_percent_of_the_best_of_shared_and_hindsight(name):
    """Where it is not, the hindsight split's margin must be foresight at kvtier's rounds: fed the next
    minute's exact curves the same loop reaches 95%, fed the exact curves of the recent past (every
    window and trend of :data:`CAUSAL_REFERENCES`) it falls short too; kvtier must then reach 95% of
    the best of those."""
    results = replayed(name)
    best = max(results["shared"].block_hit_ratio, results["oracle-dynamic"].block_hit_ratio)
    kvtier = results["kvtier"].block_hit_ratio
    if kvtier >= SHARE_OF_BEST * best:
        return
    causal, foresight = exact_curve_references(name)
    assert foresight >= SHARE_OF_BEST * best, (
        f"the loop reaches {foresight / best:.3f} of the best even with {FORESIGHT_SECONDS} s of foresight"
    )
    assert causal < SHARE_OF_BEST * best, (
        f"kvtier reaches {kvtier / best:.3f} of the best where exact past curves reach {causal / best:.3f}"
    )
    assert kvtier >= SHARE_OF_BEST * causal


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


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_kvtier_ttft_p50_is_no_worse_than_the_equal_split(name):
    """Where it is, the scenario's figures must load a hit slower than they recompute it, so that the
    hindsight split, with the most hits, is slower than the equal split too; then its calibrated
    twin (the same traces and pool, prefill from a preset) carries the bar, and kvtier meets it there."""
    results = replayed(name)
    if results["kvtier"].ttft_p50_seconds <= results["equal"].ttft_p50_seconds:
        return
    scenario = load_scenario(SCENARIOS[name])
    for tenant in scenario.tenants:
        cost = tenant.cost()
        assert cost.load_seconds(1) > cost.saved_per_hit_token(scenario.block_tokens), tenant.name
    assert results["oracle-dynamic"].ttft_p50_seconds > results["equal"].ttft_p50_seconds
    assert name in CALIBRATED_TWINS, (
        "a flat scenario where kvtier is slower than the equal split needs a calibrated twin"
    )
    twin_name = CALIBRATED_TWINS[name]
    twin = load_scenario(SCENARIOS[twin_name])
    assert (twin.block_tokens, twin.epoch_seconds, twin.scrape_seconds, twin.capacity_blocks) == (
        scenario.block_tokens,
        scenario.epoch_seconds,
        scenario.scrape_seconds,
        scenario.capacity_blocks,
    )
    for ours, theirs in zip(scenario.tenants, twin.tenants, strict=True):
        assert scenario.trace_path(ours).resolve() == twin.trace_path(theirs).resolve()
        assert ours.model_dump(exclude={"trace", "cost_model"}) == theirs.model_dump(exclude={"trace", "cost_model"})
        assert theirs.cost_model is not None
    calibrated = replayed(twin_name)
    assert calibrated["kvtier"].ttft_p50_seconds <= calibrated["equal"].ttft_p50_seconds


@pytest.mark.parametrize("results", ["rebalance-sweep.md", "rebalance-sweep-tied.md"])
def test_the_shipped_defaults_are_the_sweeps_pick(results, monkeypatch):
    """The defaults were chosen by measurement: the recorded sweep picks them, and they are still the
    model's (changing them without re-running the sweep fails here)."""
    spec = importlib.util.spec_from_file_location("rebalance_sweep", ROOT / "bench" / "rebalance_sweep.py")
    assert spec is not None and spec.loader is not None
    sweep = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, sweep)  # its dataclasses look their module up
    spec.loader.exec_module(sweep)
    text = (ROOT / "bench" / "results" / results).read_text()
    picked = re.search(r"^pick: (.+?) \(.*; shipped: (.+)$", text, re.MULTILINE)
    assert picked, f"no pick recorded in bench/results/{results}"
    assert picked.group(1) == picked.group(2) == sweep.defaults().label
