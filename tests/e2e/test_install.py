"""The install paths on a real kube-apiserver: `helm install` of the chart and `kubectl apply -f
manifests/install.yaml` are accepted (structural CRD schemas, CEL within the cost budget, RBAC objects),
and the CRDs become Established. A bare control plane of its own (no operator, no kubelets): what a
platform team's cluster does with our manifests, before anything of ours runs.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.chart import CHART, HELM, NAMESPACE
from tests.conftest import REPO_ROOT, grounds

KUBECTL = Path(sys.executable).parent / "kubectl"
INSTALL = REPO_ROOT / "manifests" / "install.yaml"
CRDS = ["inferencedeployments.kvtier.io", "kvpools.kvtier.io"]


@pytest.fixture(scope="module")
def control_plane(request):
    if "real" not in grounds(request.config):
        pytest.skip("the install paths are checked on the real control plane (--ground real or all)")
    from kvtier.testing.controlplane import ControlPlane

    with ControlPlane() as plane:
        yield plane


def run(*args: str, plane, check: bool = True) -> subprocess.CompletedProcess[str]:
    tool = HELM if args[0] == "helm" else KUBECTL
    result = subprocess.run(
        [str(tool), *args[1:], "--kubeconfig", str(plane.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=180,
        env={"HOME": tempfile.gettempdir(), "PATH": "/usr/bin:/bin"},
    )
    if check:
        assert result.returncode == 0, f"{' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result


def established(plane) -> None:
    run(
        "kubectl",
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        *(f"crd/{name}" for name in CRDS),
        plane=plane,
    )
    for name in CRDS:
        crd = yaml.safe_load(run("kubectl", "get", f"crd/{name}", "-o", "yaml", plane=plane).stdout)
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions.get("NamesAccepted") == "True" and conditions.get("NonStructuralSchema") is None, conditions
    # The APIs are served: the resources list (empty) through their short names.
    run("kubectl", "get", "kvp,infd", "--all-namespaces", plane=plane)


def test_helm_install_is_accepted_and_its_crds_established(control_plane):
    result = run(
        "helm",
        "install",
        "kvtier-operator",
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--create-namespace",
        plane=control_plane,
    )
    assert "STATUS: deployed" in result.stdout, result.stdout
    established(control_plane)
    role = yaml.safe_load(
        run("kubectl", "get", "clusterrole/kvtier-operator", "-o", "yaml", plane=control_plane).stdout
    )
    assert role["rules"], role
    run(
        "kubectl",
        "auth",
        "can-i",
        "patch",
        "inferencedeployments.kvtier.io/status",
        f"--as=system:serviceaccount:{NAMESPACE}:kvtier-operator",
        plane=control_plane,
    )
    run("helm", "uninstall", "kvtier-operator", "--namespace", NAMESPACE, "--wait", plane=control_plane)
    # helm leaves CRDs behind by design; remove them so the manifest below installs its own.
    run("kubectl", "delete", *(f"crd/{name}" for name in CRDS), "--wait=true", plane=control_plane)


def test_kubectl_apply_of_the_install_manifest_is_accepted(control_plane):
    result = run("kubectl", "apply", "-f", str(INSTALL), plane=control_plane)
    objects = [doc for doc in yaml.safe_load_all(INSTALL.read_text()) if doc]
    assert len(result.stdout.splitlines()) == len(objects), result.stdout
    established(control_plane)
    denied = run(
        "kubectl",
        "auth",
        "can-i",
        "delete",
        "nodes",
        f"--as=system:serviceaccount:{NAMESPACE}:kvtier-operator",
        plane=control_plane,
        check=False,
    )
    assert denied.stdout.strip() == "no", denied.stdout
