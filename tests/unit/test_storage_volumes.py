"""One definition of a volume's usable size: the volume is sized up by the filesystem's reserve, so
the quota the ledger grants (at most `max`) is what the engine gets (issue #23, problem 3)."""

from datetime import UTC

import pytest
import yaml

from kvtier.api import InferenceDeployment, KVPool
from kvtier.render.volumes import StorageBinding, kv_volume
from kvtier.storage import backend_for
from kvtier.storage.base import FILESYSTEM_RESERVE, usable_bytes, volume_bytes
from tests.conftest import EXAMPLES

GI = 2**30
POOLS = {
    "hostPath": {"hostPath": {"path": "/var/lib/kvtier"}},
    "csi-filesystem": {"csi": {"storageClassName": "fast", "volumeMode": "Filesystem"}},
    "csi-block": {"csi": {"storageClassName": "fast", "volumeMode": "Block"}},
}


def pool(storage):
    return KVPool.model_validate({"metadata": {"name": "p"}, "spec": {"capacity": "100Gi", "storage": storage}})


def deployment(request, minimum, maximum):
    body = yaml.safe_load((EXAMPLES / "inferencedeployment.yaml").read_text())
    body["spec"]["kvCache"]["storage"] = {"poolRef": "p", "request": request, "min": minimum, "max": maximum}
    return InferenceDeployment.model_validate(body)


@pytest.mark.parametrize("mode", ["Block", "Filesystem"])
@pytest.mark.parametrize("usable", [1, 4095, 4096, 10 * GI, 10 * GI + 12345, 7 * 2**40 + 1])
def test_the_volume_holds_what_it_is_sized_for(mode, usable):
    size = volume_bytes(usable, mode)
    assert usable_bytes(size, mode) >= usable - (usable % 4096)
    if mode == "Filesystem":
        assert size >= usable / (1 - FILESYSTEM_RESERVE)


@pytest.mark.parametrize("backend", sorted(POOLS))
def test_request_min_max_equal_gives_the_engine_exactly_that(backend):
    """`request = min = max = 10Gi` on a hostPath pool gave the engine 9728Mi (95% of a 10Gi volume)."""
    kv_pool = pool(POOLS[backend])
    infd = deployment("10Gi", "10Gi", "10Gi")
    volume = kv_volume(infd, kv_pool, StorageBinding(quota=10 * GI))
    assert volume.quota == 10 * GI
    claim = backend_for(kv_pool).claim_template(infd, {})
    requested = claim["spec"]["resources"]["requests"]["storage"]
    assert backend_for(kv_pool).usable_bytes(volume_bytes(10 * GI, volume.attachment.volume_mode)) >= 10 * GI, requested


@pytest.mark.parametrize("backend", sorted(POOLS))
@pytest.mark.parametrize("quota_gi", [1, 3, 7, 10])
def test_min_le_quota_le_max_for_any_ledger_quota(backend, quota_gi):
    infd = deployment("8Gi", "1Gi", "10Gi")
    quota = kv_volume(infd, pool(POOLS[backend]), StorageBinding(quota=quota_gi * GI)).quota
    assert quota == quota_gi * GI and 1 * GI <= quota <= 10 * GI


def test_a_static_round_sees_no_move_when_every_quota_is_its_request():
    """The Static round compared the ledger's 10Gi with a 9728Mi cap and 'moved' every deployment each round."""
    from kvtier.api.kvpool import Allocation, KVPoolStatus
    from kvtier.rebalance.round import members as round_members

    kv_pool = pool(POOLS["hostPath"])
    bodies = []
    allocations = []
    for i in range(10):
        infd = deployment("10Gi", "10Gi", "10Gi")
        body = infd.to_wire()
        body["metadata"].update(name=f"d{i}", namespace="ml", uid=f"u{i}")
        bodies.append(body)
        allocations.append(Allocation(namespace="ml", name=f"d{i}", uid=f"u{i}", replicas=1, quota=10 * GI))
    members = round_members(kv_pool, KVPoolStatus(allocations=allocations), bodies)
    assert len(members) == 10
    assert all(m.cap == m.request == m.quota == 10 * GI for m in members)
    # And the round itself: for every policy, no move, so no record (the controller posts Events and writes
    # status.lastRebalance only from a record) and every quota stays what the ledger holds.
    from datetime import datetime

    from kvtier.rebalance.demand import DemandBook
    from kvtier.rebalance.round import plan_round

    status = KVPoolStatus(allocations=allocations)
    for policy in ("Static", "MarginalGain", "Proportional"):
        spec = kv_pool.spec.model_copy(
            update={"rebalance": kv_pool.spec.rebalance.model_copy(update={"policy": policy})}
        )
        planned = plan_round(
            kv_pool.model_copy(update={"spec": spec}), status, bodies, DemandBook(60), 1000.0, None, datetime.now(UTC)
        )
        assert planned is not None and planned.record is None, policy
        assert set(planned.quotas.values()) == {10 * GI}, policy
