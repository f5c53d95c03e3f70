"""The pool ledger never hands out more than the pool holds, admits in order, and binds namespaces once."""

from datetime import datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.api import KVPool
from kvtier.api.kvpool import KVPoolStatus
from kvtier.storage.ledger import Claim, admit, allocated, reclaimed, release

TI = 2**40
T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)


def csi_pool(capacity=10 * TI):
    return KVPool.model_validate({"metadata": {"name": "pool"}, "spec": {
        "capacity": capacity, "storage": {"csi": {"storageClassName": "fast"}}}})


def nvmeof_pool(sizes, capacity=None):
    namespaces = [{"nqn": f"nqn.2024-06.com.example:kv-{i}", "uuid": f"00000000-0000-0000-0000-{i:012d}", "size": size}
                  for i, size in enumerate(sizes)]
    return KVPool.model_validate({"metadata": {"name": "array"}, "spec": {
        "capacity": capacity or sum(sizes),
        "storage": {"nvmeof": {"targets": [{"address": "192.0.2.1"}], "namespaces": namespaces}}}})


def claim(name, replicas=1, request=TI, minimum=0, maximum=None, age=0):
    return Claim(namespace="ml", name=name, uid=f"uid-{name}", created=T0 + timedelta(seconds=age), replicas=replicas,
                 request=request, min=minimum, max=maximum or request)


def test_grants_the_request_and_accounts_for_it():
    pool = csi_pool()
    decision = admit(pool, KVPoolStatus(), claim("a", replicas=2, request=3 * TI))
    assert decision.allocation.quota == 3 * TI and decision.reason == "Bound"
    assert (decision.status.allocated, decision.status.available, decision.status.deployments) == (6 * TI, 4 * TI, 1)


def test_shrinks_to_fit_but_never_below_min_and_then_queues():
    pool = csi_pool()
    status = admit(pool, KVPoolStatus(), claim("a", replicas=2, request=4 * TI)).status
    squeezed = admit(pool, status, claim("b", replicas=2, request=4 * TI, minimum=TI, age=1))
    assert squeezed.allocation.quota == TI and squeezed.status.available == 0
    refused = admit(pool, squeezed.status, claim("c", request=TI, minimum=TI // 2, age=2))
    assert refused.allocation is None and refused.reason == "InsufficientCapacity"
    assert [w.name for w in refused.status.waiting] == ["c"] and refused.status.allocated == 10 * TI


def test_waiting_deployments_are_admitted_oldest_first():
    pool = csi_pool(2 * TI)
    status = admit(pool, KVPoolStatus(), claim("big", request=2 * TI, minimum=2 * TI)).status
    status = admit(pool, status, claim("older", request=TI, minimum=TI, age=1)).status
    status = admit(pool, status, claim("newer", request=TI, minimum=TI, age=2)).status
    status = release(pool, status, "uid-big")
    newer = admit(pool, status, claim("newer", request=TI, minimum=TI, age=2))
    assert newer.allocation is None and newer.reason == "Queued" and "ml/older" in newer.message
    older = admit(pool, newer.status, claim("older", request=TI, minimum=TI, age=1))
    assert older.allocation is not None
    newer = admit(pool, older.status, claim("newer", request=TI, minimum=TI, age=2))
    assert newer.allocation is not None and newer.status.waiting == []


def test_static_namespaces_best_fit_and_cap_the_quota():
    pool = nvmeof_pool([4 * TI, 2 * TI, 8 * TI, 2 * TI])
    decision = admit(pool, KVPoolStatus(), claim("a", replicas=2, request=2 * TI))
    assert decision.allocation.volumes == ["00000000-0000-0000-0000-000000000001", "00000000-0000-0000-0000-000000000003"]
    bigger = admit(pool, decision.status, claim("b", replicas=2, request=6 * TI, minimum=TI, age=1))
    assert bigger.allocation.quota == 4 * TI  # capped by the 4Ti namespace it had to take
    assert set(bigger.allocation.volumes) == {"00000000-0000-0000-0000-000000000000", "00000000-0000-0000-0000-000000000002"}
    none_left = admit(pool, bigger.status, claim("c", request=TI, age=2))
    assert none_left.allocation is None and "free NVMe-oF namespace" in none_left.message


def test_scaling_keeps_the_quota_and_the_remaining_namespaces():
    pool = nvmeof_pool([TI] * 4)
    first = admit(pool, KVPoolStatus(), claim("a", replicas=2, request=TI)).allocation
    status = admit(pool, KVPoolStatus(allocations=[first]), claim("a", replicas=3, request=TI)).status
    grown = status.allocations[0]
    assert grown.volumes[:2] == first.volumes and len(set(grown.volumes)) == 3
    shrunk = admit(pool, status, claim("a", replicas=1, request=TI))
    assert shrunk.allocation.volumes == first.volumes[:1] and shrunk.allocation.quota == TI
    assert shrunk.status.reclaiming == grown.volumes[1:]


def test_released_namespaces_are_not_bound_again_until_reclaimed():
    pool = nvmeof_pool([TI, TI])
    status = admit(pool, KVPoolStatus(), claim("a", replicas=2)).status
    held = status.allocations[0].volumes
    status = release(pool, status, "uid-a")
    assert status.reclaiming == held and status.allocated == 0
    waiting = admit(pool, status, claim("b", age=1))
    assert waiting.allocation is None and "0 free NVMe-oF namespace" in waiting.message
    status = reclaimed(pool, waiting.status, {held[0]})
    assert status.reclaiming == held[1:]
    assert admit(pool, status, claim("b", age=1)).allocation.volumes == held[:1]


def test_a_recreated_deployment_does_not_inherit_its_namesakes_namespaces():
    pool = nvmeof_pool([TI, TI])
    status = admit(pool, KVPoolStatus(), claim("a")).status
    old = status.allocations[0].volumes
    again = admit(pool, status, Claim(namespace="ml", name="a", uid="uid-a2", created=T0, replicas=1, request=TI,
                                      min=0, max=TI))
    assert again.status.reclaiming == old and again.allocation.volumes != old


def test_a_refused_scale_up_keeps_what_was_admitted():
    pool = csi_pool(2 * TI)
    status = admit(pool, KVPoolStatus(), claim("a", replicas=2, request=TI, minimum=TI)).status
    decision = admit(pool, status, claim("a", replicas=3, request=TI, minimum=TI))
    assert decision.reason == "InsufficientCapacity" and decision.allocation.replicas == 2
    assert decision.status.allocated == 2 * TI


operations = st.lists(
    st.tuples(st.sampled_from(["admit", "release", "reclaim"]), st.integers(0, 7), st.integers(0, 4),
              st.integers(1, 6), st.integers(0, 6)),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(operations, st.booleans())
def test_random_claims_never_over_commit_or_share_a_namespace(ops, static):
    pool = nvmeof_pool([TI, 2 * TI, 3 * TI, TI, 2 * TI, 4 * TI], capacity=9 * TI) if static else csi_pool(9 * TI)
    status = KVPoolStatus()
    used: set[str] = set()  # namespaces that have held data and were not wiped since
    for op, who, replicas, request, minimum in ops:
        if op == "release":
            status = release(pool, status, f"uid-d{who}")
        if op == "reclaim":
            used -= set(status.reclaiming)
            status = reclaimed(pool, status, set(status.reclaiming))
        if op != "admit":
            assert used <= {uuid for a in status.allocations for uuid in a.volumes} | set(status.reclaiming)
            continue
        decision = admit(pool, status, claim(f"d{who}", replicas=replicas, request=request * TI // 2,
                                            minimum=min(minimum, request) * TI // 2, age=who))
        status = decision.status
        if decision.allocation is not None and decision.allocation.replicas:
            assert decision.allocation.quota >= min(minimum, request) * TI // 2 or decision.reason != "Bound"
        assert allocated(status) <= pool.spec.capacity
        assert status.available == pool.spec.capacity - allocated(status)
        volumes = [uuid for a in status.allocations for uuid in a.volumes]
        assert len(volumes) == len(set(volumes)) and not set(volumes) & set(status.reclaiming)
        assert used <= set(volumes) | set(status.reclaiming), "a used namespace became free without a reclaim"
        used |= set(volumes)
        assert all(len(a.volumes) == a.replicas for a in status.allocations) or not static
        assert len({a.uid for a in status.allocations}) == len(status.allocations)


def test_readmitting_an_unchanged_deployment_changes_nothing():
    """Each resync re-admits every deployment: the ledger must come back identical (same order), or
    every resync would rewrite the pool's status and race the rebalancer's compare-and-swap."""
    pool = csi_pool()
    status = KVPoolStatus()
    for name in ("a", "b", "c"):
        status = admit(pool, status, claim(name)).status
    for name in ("a", "b", "c", "a"):
        assert admit(pool, status, claim(name)).status == status
