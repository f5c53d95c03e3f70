"""The real control plane: hack/control-plane.sh without Go says so (exit 3) and reuses a build when present;
the harness starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler, serves kubectl with its
admin kubeconfig, and leaves no process or directory behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, grounds

SCRIPT = REPO_ROOT / "hack" / "control-plane.sh"
KUBECTL = Path(sys.executable).parent / "kubectl"
COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd")
NO_GO = "/usr/bin:/bin"  # no Go toolchain there


def script(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": NO_GO, "HOME": str(tmp_path), "KVTIER_CACHE": str(tmp_path / "cache")},
    )


def test_without_go_the_build_says_what_is_missing(tmp_path):
    result = script(tmp_path)
    assert result.returncode == 3, result.stderr
    assert "no 'go' on PATH" in result.stderr and "kubernetes v1." in result.stderr
    assert not any((tmp_path / "cache").rglob("etcd"))  # nothing half-built


def test_a_present_build_is_reused(tmp_path):
    bin_dir = Path(script(tmp_path, "--bin-dir").stdout.strip())
    assert bin_dir.is_relative_to(tmp_path / "cache" / "control-plane") and bin_dir.name == "bin"
    bin_dir.mkdir(parents=True)
    for name in COMPONENTS:
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    result = script(tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(bin_dir) and "reusing" in result.stderr


@pytest.fixture(scope="module")
def real(request):
    if "real" not in grounds(request.config):
        pytest.skip("the real control plane ground is not selected (--ground)")


def test_the_harness_serves_kubectl_and_leaves_nothing_behind(real):
    from kvtier.testing.controlplane import ControlPlane

    plane = ControlPlane().start()
    try:
        directory = plane.directory
        pids = list(plane.components.values())
        assert sorted(plane.components) == sorted(COMPONENTS)
        nodes = subprocess.run(
            [str(KUBECTL), "--kubeconfig", str(plane.kubeconfig), "get", "--raw", "/readyz"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert nodes.stdout.strip() == "ok", nodes.stderr
        whoami = subprocess.run(
            [
                str(KUBECTL),
                "--kubeconfig",
                str(plane.kubeconfig),
                "auth",
                "whoami",
                "-o",
                "jsonpath={.status.userInfo.groups}",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert "system:masters" in whoami.stdout, whoami.stderr
    finally:
        plane.stop()
    assert not directory.exists()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
