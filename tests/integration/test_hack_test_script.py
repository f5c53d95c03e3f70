"""hack/test.sh (what `.ci/run` runs) decides the grounds and the conformance tier as its header says.

The real script and the real hack/control-plane.sh run in a copy of hack/ beside stand-ins for the slow
steps (setup, lint, the engines install and pytest itself, which only reports what it was given):
without Go the real ground is skipped with one line, except with CI=true, where the run fails before any
test with the reason; an engines venv that cannot be installed reaches the conformance tier as the reason,
and there, with CI=true, its tests fail instead of skipping.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

NO_GO = "/usr/bin:/bin"  # no Go toolchain there
COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd")
PYTEST_STAND_IN = """#!/usr/bin/env bash
echo "pytest ran: args=$* ground=${KVTIER_GROUND:-} bin=${KVTIER_CONTROL_PLANE_BIN:-} engines=${KVTIER_ENGINES_UNAVAILABLE:-}"
"""


def executable(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def checkout(tmp_path):
    """hack/ as in the repository, with setup, the linters, the engines install and pytest stood in for."""
    root = tmp_path / "kvtier"
    shutil.copytree(REPO_ROOT / "hack", root / "hack")
    executable(root / "hack" / "setup.sh", "#!/usr/bin/env bash\n")
    executable(root / "hack" / "engines.sh", "#!/usr/bin/env bash\necho 'engines: no network' >&2\nexit 1\n")
    for tool in ("ruff", "mypy"):
        executable(root / ".venv" / "bin" / tool, "#!/usr/bin/env bash\n")
    executable(root / ".venv" / "bin" / "python", PYTEST_STAND_IN)
    return root


def run(root, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(root / "hack" / "test.sh"), "-q"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": NO_GO, "HOME": str(root.parent), "KVTIER_CACHE": str(root.parent / "cache"), **env},
    )


def test_without_go_the_real_ground_is_skipped_with_one_line(checkout):
    result = run(checkout)
    assert result.returncode == 0, result.stderr
    assert "skipping the real control plane ground: no Go toolchain" in result.stderr
    assert "pytest ran: args=-m pytest -q ground=embedded bin= engines=hack/engines.sh" in result.stdout


def test_on_ci_without_go_the_run_fails_with_the_reason_before_any_test(checkout):
    result = run(checkout, CI="true")
    assert result.returncode == 3, result.stderr
    assert "no 'go' on PATH" in result.stderr and "the real control plane could not be built" in result.stderr
    assert "pytest ran" not in result.stdout


def test_a_built_control_plane_is_used_and_missing_engines_reach_the_tier_as_the_reason(checkout):
    bin_dir = subprocess.run(
        [str(checkout / "hack" / "control-plane.sh"), "--bin-dir"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": NO_GO, "HOME": str(checkout.parent), "KVTIER_CACHE": str(checkout.parent / "cache")},
    ).stdout.strip()
    for name in COMPONENTS:
        executable(Path(bin_dir) / name, "#!/bin/sh\n")
    result = run(checkout, CI="true")
    assert result.returncode == 0, result.stderr
    assert "conformance tier unavailable: hack/engines.sh could not install" in result.stderr
    assert "(CI: its tests fail)" in result.stderr
    assert f"ground= bin={bin_dir} engines=hack/engines.sh could not install" in result.stdout


@pytest.mark.parametrize(("ci", "outcome"), [("true", "error"), ("", "skipped")])
def test_the_conformance_tier_fails_on_ci_and_skips_elsewhere_when_the_engines_are_missing(ci, outcome):
    env = {**os.environ, "CI": ci, "KVTIER_ENGINES_UNAVAILABLE": "stand-in reason"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/conformance/test_metric_names.py"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
        env=env,
    )
    summary = result.stdout.strip().splitlines()[-1]
    assert outcome in summary and ("passed" not in summary), result.stdout[-2000:]
    assert "stand-in reason" in result.stdout
