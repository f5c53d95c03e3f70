"""The pool ledger never hands out more than the pool holds, admits in order, and binds namespaces once."""

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.api import KVPool
from kvtier.api.kvpool import STATUS_LIST_LIMIT, Allocation, KVPoolStatus
from kvtier.storage.ledger import MAX_PASS_OVER, Claim, admit, allocated, reclaimed, release, repair

TI = 2**40
GI = 2**30
T0 = datetime(2026, 12, 1, tzinfo=UTC)


def csi_pool(capacity=10 * TI):
    return KVPool.model_validate(
        {"metadata": {"name": "pool"}, "spec": {"capacity": capacity, "storage": {"csi": {"storageClassName": "fast"}}}}
    )


def nvmeof_pool(sizes, capacity=None):
    namespaces = [
        {"nqn": f"nqn.2024-06.com.example:kv-{i}", "uuid": f"00000000-0000-0000-0000-{i:012d}", "size": size}
        for i, size in enumerate(sizes)
    ]
    return KVPool.model_validate(
        {
            "metadata": {"name": "array"},
            "spec": {
                "capacity": capacity or sum(sizes),
                "storage": {"nvmeof": {"targets": [{"address": "192.0.2.1"}], "namespaces": namespaces}},
            },
        }
    )


def claim(name, replicas=1, request=TI, minimum=0, maximum=None, age=0):
    return Claim(
        namespace="ml",
        name=name,
        uid=f"uid-{name}",
        created=T0 + timedelta(seconds=age),
        replicas=replicas,
        request=request,
        min=minimum,
        max=maximum or request,
    )


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
    assert decision.allocation.volumes == [
        "00000000-0000-0000-0000-000000000001",
        "00000000-0000-0000-0000-000000000003",
    ]
    bigger = admit(pool, decision.status, claim("b", replicas=2, request=6 * TI, minimum=TI, age=1))
    assert bigger.allocation.quota == 4 * TI  # capped by the 4Ti namespace it had to take
    assert set(bigger.allocation.volumes) == {
        "00000000-0000-0000-0000-000000000000",
        "00000000-0000-0000-0000-000000000002",
    }
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
    again = admit(
        pool, status, Claim(namespace="ml", name="a", uid="uid-a2", created=T0, replicas=1, request=TI, min=0, max=TI)
    )
    assert again.status.reclaiming == old and again.allocation.volumes != old


def test_a_refused_scale_up_keeps_what_was_admitted():
    pool = csi_pool(3 * TI)
    status = admit(pool, KVPoolStatus(), claim("a", replicas=2, request=TI, minimum=TI)).status
    status = admit(pool, status, claim("b", request=TI, minimum=TI, age=1)).status
    decision = admit(pool, status, claim("a", replicas=3, request=TI, minimum=TI))
    assert decision.reason == "InsufficientCapacity" and decision.allocation.replicas == 2
    assert "keeps 1Ti per replica x 2" in decision.message and decision.status.allocated == 3 * TI
    beyond = admit(pool, status, claim("a", replicas=4, request=TI, minimum=TI))
    assert beyond.reason == "NeverFits" and beyond.allocation.replicas == 2 and beyond.status.allocated == 3 * TI


def test_a_deployment_that_can_never_fit_is_refused_and_blocks_nobody():
    """Issue #23 problem 1: `hol-a` (11 x 10Gi on a 100Gi pool) held the queue while the pool sat empty."""
    pool = csi_pool(100 * GI)
    refused = admit(pool, KVPoolStatus(), claim("hol-a", replicas=11, request=10 * GI, minimum=10 * GI))
    assert refused.allocation is None and refused.reason == "NeverFits"
    assert "110Gi" in refused.message and "100Gi" in refused.message
    assert refused.status.waiting == [], "no place in the queue"
    later = admit(pool, refused.status, claim("hol-b", request=10 * GI, minimum=10 * GI, age=1))
    assert later.reason == "Bound" and later.allocation.quota == 10 * GI


def test_static_pool_without_enough_large_namespaces_never_fits():
    pool = nvmeof_pool([TI, TI, 4 * TI])
    refused = admit(pool, KVPoolStatus(), claim("a", replicas=2, request=2 * TI, minimum=2 * TI))
    assert refused.reason == "NeverFits" and "has 1 in all" in refused.message and refused.status.waiting == []


def test_a_waiter_that_does_not_fit_is_passed_over_a_bounded_number_of_times():
    pool = csi_pool(10 * TI)
    status = admit(pool, KVPoolStatus(), claim("holder", request=6 * TI, minimum=6 * TI)).status
    status = admit(pool, status, claim("large", request=8 * TI, minimum=8 * TI, age=1)).status
    assert [w.name for w in status.waiting] == ["large"]
    admitted = []
    for n in range(MAX_PASS_OVER + 2):
        decision = admit(pool, status, claim(f"small-{n}", request=GI, minimum=GI, age=2 + n))
        status = decision.status
        admitted.append(decision.allocation is not None)
    # The first MAX_PASS_OVER small ones go ahead (they fit, `large` does not); then `large` holds its place.
    assert admitted == [True] * MAX_PASS_OVER + [False, False]
    assert status.waiting[0].name == "large" and status.waiting[0].passed_over == MAX_PASS_OVER
    queued = admit(pool, status, claim("small-late", request=GI, minimum=GI, age=100))
    assert queued.reason == "Queued" and "ml/large" in queued.message
    status = release(pool, status, "uid-holder")
    large = admit(pool, status, claim("large", request=8 * TI, minimum=8 * TI, age=1))
    assert large.reason == "Bound", large.message


def test_admission_is_linear_in_the_ledger():
    """Thousands of entries: one admission reads each once (the old code compared models pairwise)."""
    pool = csi_pool(10_000 * TI)
    status = KVPoolStatus(
        allocations=[
            Allocation(namespace="ml", name=f"d{i}", uid=f"u{i}", replicas=1, quota=TI)
            for i in range(STATUS_LIST_LIMIT - 1)
        ]
    )
    decision = admit(pool, status, claim("new", request=TI))
    assert decision.reason == "Bound" and len(decision.status.allocations) == STATUS_LIST_LIMIT
    full = admit(pool, decision.status, claim("one-more", request=TI))
    assert full.reason == "PoolFull" and full.allocation is None, full.message
    assert len(full.status.allocations) == STATUS_LIST_LIMIT


def claims_of(*claims):
    return {c.uid: c for c in claims}


def test_repair_raises_an_entry_below_its_min_taking_from_others_within_their_bounds():
    """Issue #23 problem 2: a corrupted entry at 0 stayed at 0 while its capacity went to a waiter."""
    pool = csi_pool(10 * TI)
    a, b = claim("a", request=5 * TI, minimum=2 * TI), claim("b", request=5 * TI, minimum=4 * TI, maximum=6 * TI, age=1)
    status = admit(pool, KVPoolStatus(), a).status
    status = admit(pool, status, b).status
    corrupted = status.model_copy(
        update={
            "allocations": [
                status.allocations[0].model_copy(update={"quota": 0}),
                status.allocations[1].model_copy(update={"quota": 6 * TI}),
            ]
        }
    )
    assert corrupted.allocations[1].quota > b.request
    fixed, repairs = repair(pool, corrupted, claims_of(a, b))
    quotas = {e.name: e.quota for e in fixed.allocations}
    assert quotas["a"] >= 2 * TI and 4 * TI <= quotas["b"] <= 6 * TI and allocated(fixed) <= 10 * TI
    assert any("ml/a: quota 0 -> 2Ti (below min)" in r for r in repairs), repairs


def test_repair_lowers_above_max_releases_the_gone_and_fits_a_reduced_capacity():
    pool = csi_pool(4 * TI)
    a, b = claim("a", request=2 * TI, minimum=TI), claim("b", request=2 * TI, minimum=TI, age=1)
    status = KVPoolStatus(
        allocations=[
            Allocation(namespace="ml", name="a", uid="uid-a", replicas=1, quota=3 * TI),  # above max
            Allocation(namespace="ml", name="b", uid="uid-b", replicas=2, quota=2 * TI),  # 2 replicas, spec says 1
            Allocation(namespace="ml", name="ghost", uid="uid-ghost", replicas=1, quota=TI),
        ]
    )
    fixed, repairs = repair(pool, status, claims_of(a, b))
    assert {e.name: (e.replicas, e.quota) for e in fixed.allocations} == {"a": (1, 2 * TI), "b": (1, 2 * TI)}
    assert len(repairs) == 3 and fixed.allocated == 4 * TI
    smaller = csi_pool(3 * TI)
    shrunk, repairs = repair(smaller, fixed, claims_of(a, b))
    assert allocated(shrunk) <= 3 * TI and all(e.quota >= TI for e in shrunk.allocations)
    assert "exceeded capacity" in repairs[0]
    assert repair(smaller, shrunk, claims_of(a, b)) == (shrunk, []), "a healthy ledger is left alone"


def test_repair_leaves_entries_of_unparseable_deployments_alone():
    pool = csi_pool(4 * TI)
    status = KVPoolStatus(allocations=[Allocation(namespace="ml", name="x", uid="uid-x", replicas=1, quota=TI)])
    assert repair(pool, status, {"uid-x": None}) == (status, [])


operations = st.lists(
    st.tuples(
        st.sampled_from(["admit", "release", "reclaim"]),
        st.integers(0, 7),
        st.integers(0, 4),
        st.integers(1, 6),
        st.integers(0, 6),
    ),
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
        decision = admit(
            pool,
            status,
            claim(
                f"d{who}",
                replicas=replicas,
                request=request * TI // 2,
                minimum=min(minimum, request) * TI // 2,
                age=who,
            ),
        )
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
