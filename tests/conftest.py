"""Shared test helpers: where the repository and the shared fixtures live."""

import os
import pathlib
import re
import time
import uuid

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = REPO_ROOT / "manifests" / "examples"
#: The shared fixtures (traces, scenarios, references) beside the repository, where
#: `kvtier.sim.pods.find_trace_dir` finds the traces too.
SHARED = REPO_ROOT.parent / "shared"


@pytest.fixture(scope="session")
def repo_root() -> pathlib.Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def cluster():
    """The cluster end-to-end tests run against: the embedded one, or a real one named by KVTIER_E2E_KUBECONFIG.

    Both have `.kubeconfig`, `.kube` (a kvtier.kube.KubeClient) and `.run(coroutine)`; only the
    embedded one has `.server` (fault injection, request log), `.cluster` (to stop and restart the
    in-process operator) and `embedded = True`. On a real cluster the operator is the installed one.
    """
    from kvtier.controllers import OperatorConfig
    from kvtier.testing.cluster import BackgroundCluster, ExternalCluster

    external = os.environ.get("KVTIER_E2E_KUBECONFIG")
    operator = OperatorConfig(resync_seconds=1.0, scrape_interval_seconds=1.0, scrape_timeout_seconds=0.5,
                              status_interval_seconds=1.0)
    with ExternalCluster(external) if external else BackgroundCluster(operator=operator) as running:
        yield running


@pytest.fixture
def namespace(cluster, request):
    """A fresh namespace per test, deleted afterwards."""
    from kvtier.kube import NAMESPACES

    name = "t-" + re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-") + "-" + uuid.uuid4().hex[:6]
    cluster.run(cluster.kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}))
    yield name
    cluster.run(cluster.kube.delete(NAMESPACES, None, name))


def wait_for(predicate, *, timeout: float = 20.0, interval: float = 0.1, message: str = "condition"):
    """Poll `predicate()` until it returns something truthy; fail with `message` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)
