"""The operator as a process: a graceful exit lets the reconcile passes still running end before its
clients close, and its log carries no line per periodic success.

kopf leaves a timer's pass running at exit; the 300-deployment scale run's shutdown logged 65 tracebacks
("Session is closed") from passes that outlived the clients, and its log 28,000 lines "Timer 'resync'
succeeded." in 25 minutes."""

from __future__ import annotations

import logging
import time

import pytest

from kvtier.kube import INFERENCEDEPLOYMENTS
from tests.conftest import wait_for
from tests.e2e.helpers import (
    condition,
    create_deployment,
    create_pool,
    csi_pool,
    delete_pool,
    deployment,
    ensure_sim_storage_class,
    get,
    kubectl,
)

#: kopf's lines for passes that run all the time: every resync, every pod event, every pool status write.
ROUTINE = ("Timer 'resync' succeeded.", "Handler 'telemetry' succeeded.", "Handler 'pool-view' succeeded.")


def test_no_line_per_routine_success_and_a_graceful_stop_waits_for_the_passes_in_flight(cluster, namespace, caplog):
    if not cluster.embedded:
        pytest.skip("holds a pass in flight with the embedded API server's fault injector")
    ensure_sim_storage_class(cluster)
    pool = f"{namespace}-pool"
    create_pool(cluster, csi_pool(pool, "2Ti"))
    create_deployment(cluster, deployment(namespace, "busy", pool))
    with caplog.at_level(logging.INFO):
        wait_for(
            lambda: condition(get(cluster, INFERENCEDEPLOYMENTS, namespace, "busy"), "Ready").get("status") == "True",
            timeout=60,
            message="the deployment Ready",
        )
        time.sleep(3 * cluster.cluster.operator.resync_seconds)  # a few resyncs of a deployment that is Ready
    routine = [r for r in caplog.records if r.getMessage() in ROUTINE]
    assert not routine, f"{len(routine)} routine success lines logged"
    assert any(r.getMessage() == "Handler 'reconcile' succeeded." for r in caplog.records), "kopf's log not captured"
    caplog.clear()
    # A scale writes the pool's ledger: that write slowed, the pass is in flight when the stop comes.
    slow = cluster.server.faults.add(
        verb="update", resource="kvpools", subresource="status", name=pool, delay=2.0, times=None
    )
    try:
        kubectl(cluster, "scale", "infd", "busy", "-n", namespace, "--replicas", "2")
        wait_for(lambda: slow.hits > 0, timeout=30, interval=0.05, message="a pass writing the pool's ledger")
        with caplog.at_level(logging.WARNING):
            cluster.run(cluster.cluster.stop_operator())
    finally:
        cluster.server.faults.remove(slow)
        cluster.run(cluster.cluster.start_operator())
    failures = [
        record.getMessage()
        for record in caplog.records
        if record.levelno >= logging.ERROR or "Session is closed" in record.getMessage()
    ]
    assert not failures, failures
    kubectl(cluster, "delete", "infd", "busy", "-n", namespace, "--wait=true")
    delete_pool(cluster, pool)
