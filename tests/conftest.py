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


#: The grounds tests that take the `cluster` fixture run on (`--ground`), truest last.
GROUNDS = ("embedded", "real")


def pytest_addoption(parser):
    parser.addoption(
        "--ground",
        choices=("embedded", "real", "all"),
        default=os.environ.get("KVTIER_GROUND"),
        help="Where tests taking the `cluster` fixture (tests/e2e, the pod simulator's) run: the embedded API "
        "emulator, the real control plane (hack/control-plane.sh builds it), or both. Default ($KVTIER_GROUND): "
        "all when the control plane binaries are there, else embedded (with CI=true: all, failing without "
        "them). KVTIER_E2E_KUBECONFIG overrides it: an external cluster with the operator installed.",
    )


def _real_ground_unavailable() -> str | None:
    """Why the real control plane cannot run here (None: it can)."""
    from kvtier.testing.controlplane import ControlPlaneUnavailable, find_binaries

    try:
        find_binaries()
    except ControlPlaneUnavailable as error:
        return str(error)
    return None


def grounds(config) -> list[str]:
    if os.environ.get("KVTIER_E2E_KUBECONFIG"):
        return ["external"]
    chosen = config.getoption("--ground")
    if chosen is None:
        chosen = "all" if os.environ.get("CI") == "true" or _real_ground_unavailable() is None else "embedded"
    return list(GROUNDS) if chosen == "all" else [chosen]


def pytest_configure(config):
    if "real" in grounds(config):
        reason = _real_ground_unavailable()
        if reason is not None:
            raise pytest.UsageError(f"the real control plane ground cannot run: {reason}")


def pytest_report_header(config):
    chosen = grounds(config)
    if "real" not in chosen and chosen != ["external"]:
        return f"grounds: {', '.join(chosen)} (real control plane skipped: {_real_ground_unavailable() or '--ground'})"
    return f"grounds: {', '.join(chosen)}"


def pytest_generate_tests(metafunc):
    if "cluster" in metafunc.fixturenames:
        metafunc.parametrize("cluster", grounds(metafunc.config), indirect=True, scope="session")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    """One ground after the other (each session-scoped cluster starts once), the RBAC audit last within each."""

    def ground(item) -> int:
        spec = getattr(item, "callspec", None)
        value = spec.params.get("cluster") if spec else None
        return GROUNDS.index(value) + 1 if value in GROUNDS else 0

    items.sort(key=lambda item: (ground(item), item.path.name == "test_rbac_audit.py"))


@pytest.fixture(scope="session")
def cluster(request):
    """The cluster tests run against, by ground: the embedded one (the in-process API emulator), the real
    control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler; the operator with the chart's
    ServiceAccount and RBAC), or an external one named by KVTIER_E2E_KUBECONFIG (the operator installed there).

    All have `.kubeconfig`, `.kube` (a kvtier.kube.KubeClient), `.run(coroutine)` and `.embedded`; the
    embedded and real grounds also have `.cluster` (to stop and restart the in-process operator; its
    `.simulator` and `.engine_factory`); only the embedded one has `.server` (fault injection, request log).
    """
    from kvtier.controllers import OperatorConfig
    from kvtier.testing.cluster import BackgroundCluster, ExternalCluster

    ground = getattr(request, "param", "embedded")
    operator = OperatorConfig(
        resync_seconds=1.0, scrape_interval_seconds=1.0, scrape_timeout_seconds=0.5, status_interval_seconds=1.0
    )
    if ground == "external":
        running = ExternalCluster(os.environ["KVTIER_E2E_KUBECONFIG"])
    elif ground == "real":
        from kvtier.testing.realcluster import ControlPlaneCluster, rbac_objects
        from tests.chart import template

        running = BackgroundCluster(ControlPlaneCluster(operator=operator, operator_rbac=rbac_objects(template())))
    else:
        running = BackgroundCluster(operator=operator)
    started = time.monotonic()
    with running:
        if ground == "real":
            print(f"\nreal control plane, CRDs, nodes and operator up in {time.monotonic() - started:.1f}s")
        yield running


@pytest.fixture
def namespace(cluster, request):
    """A fresh namespace per test, deleted afterwards."""
    from kvtier.kube import NAMESPACES

    name = "t-" + re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-") + "-" + uuid.uuid4().hex[:6]
    cluster.run(cluster.kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}))
    yield name
    if any(
        getattr(request.node, f"report_{when}", None) and getattr(request.node, f"report_{when}").failed
        for when in ("setup", "call")
    ):
        print(f"\n--- what namespace {name} held when the test failed ---\n{describe_namespace(cluster, name)}")
    cluster.run(cluster.kube.delete(NAMESPACES, None, name))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Keeps each phase's report on the item (`report_setup`, `report_call`), for fixtures' teardown to read."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def describe_namespace(cluster, namespace: str) -> str:
    """One line per InferenceDeployment condition, pod, claim and Event in `namespace`: why a wait timed out."""
    from kvtier.kube import EVENTS, INFERENCEDEPLOYMENTS, PERSISTENT_VOLUME_CLAIMS, PODS

    def items(resource):
        try:
            return cluster.run(cluster.kube.list(resource, namespace))["items"]
        except Exception as error:  # a diagnostic never hides the test's own failure
            return [{"metadata": {"name": f"<cannot list {resource.plural}: {error}>"}}]

    lines = []
    for infd in items(INFERENCEDEPLOYMENTS):
        for c in infd.get("status", {}).get("conditions", []):
            lines.append(
                f"infd/{infd['metadata']['name']} {c['type']}={c['status']} {c.get('reason')}: {c.get('message')}"
            )
    for pod in items(PODS):
        status = pod.get("status", {})
        conditions = " ".join(
            f"{c['type']}={c['status']}" + (f"({c['reason']}: {c.get('message')})" if c.get("reason") else "")
            for c in status.get("conditions", [])
        )
        containers = " ".join(
            f"{c['name']}:{'ready' if c.get('ready') else 'unready'}" for c in status.get("containerStatuses", [])
        )
        lines.append(
            f"pod/{pod['metadata']['name']} {status.get('phase')} node={pod['spec'].get('nodeName')} "
            f"{conditions} {containers}"
        )
    for claim in items(PERSISTENT_VOLUME_CLAIMS):
        lines.append(
            f"pvc/{claim['metadata']['name']} {claim.get('status', {}).get('phase')} "
            f"volume={claim['spec'].get('volumeName')}"
        )
    for event in items(EVENTS)[-20:]:
        involved = event.get("involvedObject", {})
        lines.append(
            f"event {involved.get('kind')}/{involved.get('name')} {event.get('type')} {event.get('reason')}: "
            f"{event.get('message')}"
        )
    return "\n".join(lines) or "(nothing)"


#: Waits on the real control plane take this many times longer: its controllers back off and resync on their
#: own periods (kube-scheduler retries an unschedulable pod after up to 10 s, the PV binder resyncs every 15 s),
#: where the embedded cluster reacts at once. Set per test by `_ground_wait_factor`.
REAL_GROUND_WAIT_FACTOR = 2.0
_wait_factor = 1.0


@pytest.fixture(autouse=True)
def _ground_wait_factor(request):
    global _wait_factor
    spec = getattr(request.node, "callspec", None)
    _wait_factor = REAL_GROUND_WAIT_FACTOR if spec and spec.params.get("cluster") == "real" else 1.0
    yield
    _wait_factor = 1.0


def wait_for(predicate, *, timeout: float = 20.0, interval: float = 0.1, message: str = "condition"):
    """Poll `predicate()` until it returns something truthy; fail with `message` after `timeout` seconds
    (times the ground's wait factor)."""
    timeout *= _wait_factor
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {message}")
        time.sleep(interval)
