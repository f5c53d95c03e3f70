"""The pool view under the ledger's compare-and-swap, against the embedded API server (no operator running).

A write that starts from the view sends no GET; a view that is behind the API (someone else wrote) costs one
409 and one GET, and the other writer's change survives; the view never goes back to an older copy; a pool
deleted behind the view's back ends in PoolGone. The request counts come from the server's request log.
"""

from __future__ import annotations

import copy

import pytest
import yaml

from kvtier.api.kvpool import KVPool, KVPoolStatus
from kvtier.controllers.kvpools import PoolGone, PoolView, update_pool_status
from kvtier.kube import KVPOOLS
from kvtier.testing.cluster import EmbeddedCluster
from tests.conftest import EXAMPLES

POOL = yaml.safe_load((EXAMPLES / "kvpool-csi.yaml").read_text())
NAME = POOL["metadata"]["name"]


def count(status: KVPoolStatus, deployments: int) -> KVPoolStatus:
    return status.model_copy(update={"deployments": deployments})


def pool_requests(cluster: EmbeddedCluster, since: int) -> list[tuple[str, int | None]]:
    return [(r.verb, r.status) for r in cluster.server.requests.records[since:] if r.resource == "kvpools"]


async def test_writes_start_from_the_view_and_a_stale_view_costs_one_conflict_not_a_lost_write():
    view = PoolView()
    async with EmbeddedCluster() as cluster:
        kube = cluster.kube
        await kube.create(KVPOOLS, copy.deepcopy(POOL))

        since = len(cluster.server.requests)
        await update_pool_status(kube, NAME, lambda pool, status: count(status, 1), view)
        assert pool_requests(cluster, since) == [("get", 200), ("update", 200)], "empty view: one read, one write"
        held = view.get(NAME)
        assert held is not None and held["status"]["deployments"] == 1
        assert (
            held["metadata"]["resourceVersion"] == (await kube.get(KVPOOLS, None, NAME))["metadata"]["resourceVersion"]
        )

        since = len(cluster.server.requests)
        pool, status = await update_pool_status(kube, NAME, lambda pool, status: count(status, 2), view)
        assert isinstance(pool, KVPool) and status.deployments == 2
        assert pool_requests(cluster, since) == [("update", 200)], "the view holds our own write: no GET"

        since = len(cluster.server.requests)
        _, status = await update_pool_status(kube, NAME, lambda pool, status: status, view)
        assert pool_requests(cluster, since) == [], "nothing to change: no request at all"

        # Someone else writes; the view has not seen it (no watch feeds it in this test).
        await kube.patch(KVPOOLS, None, NAME, {"status": {"available": "1Ti"}}, subresource="status")
        since = len(cluster.server.requests)
        _, status = await update_pool_status(kube, NAME, lambda pool, status: count(status, 3), view)
        assert pool_requests(cluster, since) == [("update", 409), ("get", 200), ("update", 200)]
        stored = (await kube.get(KVPOOLS, None, NAME))["status"]
        assert stored["deployments"] == 3 and stored["available"] == "1Ti", "the other writer's change was lost"
        assert view.get(NAME)["status"] == stored


async def test_the_view_never_goes_back_to_an_older_copy_and_forgets_a_deleted_pool():
    view = PoolView()
    async with EmbeddedCluster() as cluster:
        kube = cluster.kube
        older = await kube.create(KVPOOLS, copy.deepcopy(POOL))
        await update_pool_status(kube, NAME, lambda pool, status: count(status, 1), view)
        newer = view.get(NAME)
        view.observe(older)  # a watch event that arrives after our own later write
        assert view.get(NAME) is newer

        await kube.delete(KVPOOLS, None, NAME)
        with pytest.raises(PoolGone):
            await update_pool_status(kube, NAME, lambda pool, status: count(status, 2), view)
        assert view.get(NAME) is None
        with pytest.raises(PoolGone):
            await update_pool_status(kube, NAME, lambda pool, status: count(status, 2), view)


async def test_each_version_of_a_pool_is_parsed_once():
    view = PoolView()
    async with EmbeddedCluster() as cluster:
        kube = cluster.kube
        await kube.create(KVPOOLS, copy.deepcopy(POOL))
        await update_pool_status(kube, NAME, lambda pool, status: count(status, 1), view)
        again, _ = await update_pool_status(kube, NAME, lambda pool, status: status, view)
        assert again is view.model(view.get(NAME)), "the same version parsed again"
        await update_pool_status(kube, NAME, lambda pool, status: count(status, 2), view)
        newer = view.model(view.get(NAME))
        assert newer is not again and newer.status.deployments == 2
