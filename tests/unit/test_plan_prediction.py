"""The planner's prediction is what the replay measures (issue 21, item 3).

For a capacity, the planner divides the pool with the production allocator and predicts each
split's hits, TTFT and GPU seconds saved from the tenants' exact LRU curves. Here the replay (the
engines' own LRU partitions, the code `kvtier sim replay` runs) serves the same split, and the
oracle-static policy's division at that capacity, and the predictions must match the measurements.
Scenarios: the public one, bench/'s conv-syn-tiny and our own plan-mixed-models (both Mooncake
traces on two models, with a weight and min/max bounds).
"""

import pytest

from kvtier.rebalance import planner
from kvtier.sim import planning
from kvtier.sim.hindsight import Hindsight
from kvtier.sim.policies import OracleStaticPolicy, Policy, run_policy
from kvtier.sim.scenario import load_scenario
from tests.conftest import REPO_ROOT, SHARED

SCENARIOS = [
    SHARED / "scenarios" / "three-phased.yaml",
    REPO_ROOT / "bench" / "scenarios" / "conv-syn-tiny.yaml",
    REPO_ROOT / "tests" / "data" / "scenarios" / "plan-mixed-models.yaml",
]
TOLERANCE = 0.02


class FixedSplit(Policy):
    """A static policy holding given quotas (blocks per tenant) for the whole run."""

    name = "fixed"

    def __init__(self, quotas):
        self.quotas = dict(quotas)

    def initial_quotas(self, scenario):
        return dict(self.quotas)


def at_capacity(scenario, blocks):
    resized = scenario.model_copy(
        update={"pool": scenario.pool.model_copy(update={"capacity_blocks": blocks, "capacity": None})}
    )
    resized._base_dir = scenario._base_dir
    return resized


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda path: path.stem)
def test_predicted_hit_ratio_is_what_the_replay_measures(path):
    scenario = load_scenario(path)
    workloads = scenario.workloads()
    profiles = planning.profiles(scenario, workloads)
    capacities = [round(scenario.capacity_blocks * factor) for factor in (0.5, 1.0, 2.0)]
    outcomes = planner.plan(
        profiles, capacities, evaluate=planning.evaluate, block_bytes=planning.block_bytes(scenario)
    )
    for predicted in outcomes:
        resized = at_capacity(scenario, predicted.capacity_blocks)
        quotas = {name: tenant.quota_blocks for name, tenant in predicted.per_tenant.items()}
        measured = run_policy(FixedSplit(quotas), resized, workloads)
        assert abs(predicted.block_hit_ratio - measured.overall.block_hit_ratio) <= TOLERANCE
        assert abs(predicted.token_hit_ratio - measured.overall.token_hit_ratio) <= TOLERANCE
        for name, tenant in predicted.per_tenant.items():
            assert abs(tenant.block_hit_ratio - measured.per_tenant[name].block_hit_ratio) <= TOLERANCE, name
        saved = sum(tenant.gpu_prefill_seconds_saved for tenant in predicted.per_tenant.values())
        assert saved == pytest.approx(measured.overall.gpu_prefill_seconds_saved, rel=0.02)
        assert predicted.ttft_p50_seconds == pytest.approx(measured.overall.ttft_p50_seconds, rel=0.05)
        # The static marginal-gain division the replay's oracle-static makes from the same curves.
        oracle = run_policy(OracleStaticPolicy(Hindsight(workloads, resized.epoch_seconds)), resized, workloads)
        assert abs(predicted.block_hit_ratio - oracle.overall.block_hit_ratio) <= TOLERANCE
