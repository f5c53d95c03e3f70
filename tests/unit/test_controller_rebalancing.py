"""The rebalance round's plan (kvtier.rebalance.round): pool units to per-replica quotas never overflow the pool."""

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.api.inferencedeployment import InferenceDeployment
from kvtier.rebalance.loop import Decision, LoopSettings
from kvtier.rebalance.round import Member, explain, per_replica_quota, pool_unit, units_held
from kvtier.storage.ledger import QUOTA_ALIGN

GI = 2**30


def member(quota: int, replicas: int, min_: int = 0, max_: int = 64 * GI) -> Member:
    body = {
        "apiVersion": "kvtier.io/v1alpha1",
        "kind": "InferenceDeployment",
        "metadata": {"name": "d", "namespace": "ns", "uid": "u"},
        "spec": {
            "replicas": replicas,
            "model": {"name": "m", "kvBytesPerToken": 131072},
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
