"""The rebalance round's plan (kvtier.rebalance.round): pool units to per-replica quotas never overflow the pool."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.api.inferencedeployment import InferenceDeployment
from kvtier.rebalance.estimator import Estimate
from kvtier.rebalance.loop import Decision, DeploymentState, LoopSettings
from kvtier.rebalance.round import Member, explain, hit_values, per_replica_quota, pool_unit, units_held
from kvtier.storage.ledger import QUOTA_ALIGN

GI = 2**30


def member(quota: int, replicas: int, min_: int = 0, max_: int = 64 * GI, model: dict | None = None) -> Member:
    body = {
        "apiVersion": "kvtier.io/v1alpha1",
        "kind": "InferenceDeployment",
        "metadata": {"name": "d", "namespace": "ns", "uid": "u"},
        "spec": {
            "replicas": replicas,
            "model": model or {"name": "m", "kvBytesPerToken": 131072},
            "engine": {"image": "vllm/vllm-openai:v0.33.0"},
            "kvCache": {
                "chunkSize": 256,
                "cpu": {"size": "16Gi"},
                "storage": {"poolRef": "p", "request": min_, "min": min_, "max": max_},
            },
        },
    }
    return Member("u", body, InferenceDeployment.model_validate(body), replicas, quota, max_, min_)


def test_a_pool_has_at_most_about_4096_alignedunits_held():
    for capacity in (GI, 96 * GI, 10 * 2**40, 184 * 10**12):
        unit = pool_unit(capacity)
        assert unit % QUOTA_ALIGN == 0 and capacity // unit <= 4096
    assert pool_unit(1) == QUOTA_ALIGN


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(GI, 2**44),
    shares=st.lists(st.tuples(st.floats(0, 1), st.integers(1, 8)), min_size=1, max_size=6),
)
def test_quotas_from_a_split_of_the_units_never_add_up_to_more_than_the_pool(capacity, shares):
    unit = pool_unit(capacity)
    units = capacity // unit
    weights = [share for share, _ in shares]
    split = [int(units * w / (sum(weights) or 1)) for w in weights]
    total = 0
    for (_, replicas), given_units in zip(shares, split):
        m = member(quota=0, replicas=replicas, max_=capacity)
        quota = per_replica_quota(given_units, unit, m)
        assert quota % QUOTA_ALIGN == 0 and quota * replicas <= given_units * unit
        total += quota * replicas
    assert total <= capacity


def test_a_deployment_kept_as_it_is_keeps_its_exact_quota_and_counts_rounded_up():
    unit = pool_unit(96 * GI)
    kept = member(quota=32 * GI + 3 * QUOTA_ALIGN, replicas=3)
    assert units_held(kept, unit) * unit >= kept.quota * kept.replicas
    assert per_replica_quota(units_held(kept, unit), unit, kept) == kept.quota


def test_a_quota_is_never_set_below_min_nor_above_the_volume():
    unit = pool_unit(96 * GI)
    m = member(quota=16 * GI, replicas=1, min_=8 * GI, max_=32 * GI)
    assert per_replica_quota(0, unit, m) == 8 * GI
    assert per_replica_quota(4000, unit, m) == 32 * GI


def test_the_reason_speaks_the_specs_terms():
    decision = Decision("moved", {}, {}, (), 0.125, 1000.0, 1125.0, frozen=("ns/idle",))
    reason = explain(decision, LoopSettings(min_gain=0.05))
    assert reason == (
        "predicted storage-tier hits 1,000 -> 1,125 tokens/s (+12.5%, minGain 5%); "
        "kept as they are (no fresh metrics): ns/idle"
    )
    held_back = Decision("moved", {}, {}, (), 1.0, 20.0, 30.5)  # maxStep: half way to the target this round
    assert explain(held_back, LoopSettings(min_gain=0.01)) == (
        "predicted storage-tier hits 20 -> 30.5 tokens/s this step, 40 tokens/s at the target (+100.0%, minGain 1%)"
    )
    assert explain(Decision("static", {}, {}, (), 0.0, 0.0, 0.0), LoopSettings(policy="Static")).startswith(
        "policy Static"
    )


def _valued(models: dict[str, dict], prompts: dict[str, float]) -> dict[str, float] | None:
    members = {label: member(0, 1, model=model) for label, model in models.items()}
    states = {
        label: DeploymentState(0, Estimate((0.0, 1.0), 1.0, False, "probe", 1.0, prompts[label])) for label in models
    }
    return hit_values(members, states)


LLAMA_70B = {"name": "meta-llama/Llama-3.1-70B-Instruct", "kvBytesPerToken": 327680}


def test_hits_of_known_models_are_valued_by_the_prefill_they_save():
    """A hit token of a deployment with long prompts saves more attention than one with short prompts."""
    values = _valued({"long": LLAMA_70B, "short": LLAMA_70B}, {"long": 32_000, "short": 1_000})
    assert values is not None and values["long"] > 1 > values["short"]
    assert sum(values.values()) / len(values) == pytest.approx(1.0)  # relative to the pool's mean
    local = {"name": "/models/Meta-Llama-3-70B-Instruct/", "kvBytesPerToken": 327680}
    assert _valued({"a": local, "b": LLAMA_70B}, {"a": 4_000, "b": 4_000}) == {"a": 1.0, "b": 1.0}


def test_hit_tokens_count_alike_unless_every_model_is_known_and_matches_its_spec():
    unknown = {"name": "acme/secret-model", "kvBytesPerToken": 327680}
    assert _valued({"a": LLAMA_70B, "b": unknown}, {"a": 32_000, "b": 1_000}) is None
    # The spec's architecture contradicts the name: not the model kvtier knows.
    renamed = {
        "name": "meta-llama/Llama-3.1-70B-Instruct",
        "architecture": {"layers": 32, "kvHeads": 8, "headDim": 128},
    }
    assert _valued({"a": LLAMA_70B, "b": renamed}, {"a": 32_000, "b": 1_000}) is None
    assert _valued({"a": LLAMA_70B, "b": LLAMA_70B}, {"a": 32_000, "b": 0.0}) is None  # no prompt length yet
    reason = explain(Decision("moved", {}, {}, (), 0.1, 100.0, 110.0), LoopSettings(), valued=True)
    assert "weighed by the prefill it saves" in reason
