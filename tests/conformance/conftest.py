"""The conformance tier: the real vLLM 0.33 and LMCache 0.5.6 (CPU) judge what kvtier renders and reads.

The engines live in their own venv (`hack/engines.sh`), found at `KVTIER_ENGINES_PYTHON`, else
`${KVTIER_CACHE:-~/.cache/kvtier}/engines-venv/bin/python`. `hack/test.sh` builds it first; when that is
impossible it says why in `KVTIER_ENGINES_UNAVAILABLE`. Without the venv the tier is skipped with that
one reason, except with `CI=true`, where it fails instead: CI never skips it.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
from typing import Any

import pytest

PROBE = pathlib.Path(__file__).with_name("engine_probe.py")
ANSWER_MARK = "@@ANSWER@@"
#: The engines' imports take a while (torch, vLLM's config tree): one call answers many questions.
PROBE_TIMEOUT_SECONDS = 600


def engines_python() -> pathlib.Path:
    if explicit := os.environ.get("KVTIER_ENGINES_PYTHON"):
        return pathlib.Path(explicit)
    cache = pathlib.Path(os.environ.get("KVTIER_CACHE") or pathlib.Path.home() / ".cache" / "kvtier")
    return cache / "engines-venv" / "bin" / "python"


class Engines:
    """The engines venv: run `engine_probe.py` commands, or its programs (`lmcache`), in it."""

    def __init__(self, python: pathlib.Path) -> None:
        self.python = python
        self.bin = python.parent
        self.site_packages = pathlib.Path(
            subprocess.run(
                [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
        )

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "VLLM_TARGET_DEVICE": "cpu",
            "LMCACHE_DISABLE_BANNER": "1",
            "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def ask(self, command: str, request: dict[str, Any]) -> Any:
        """One `engine_probe.py` command; its JSON answer (a crash of the probe fails the test with its log)."""
        done = subprocess.run(
            [str(self.python), str(PROBE), command],
            input=json.dumps(request),
            text=True,
            capture_output=True,
            env=self.env(),
            timeout=PROBE_TIMEOUT_SECONDS,
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith(ANSWER_MARK)]
        if done.returncode != 0 or not lines:
            tail = "\n".join((done.stderr + done.stdout).splitlines()[-30:])
            pytest.fail(f"engine_probe.py {command} failed (exit {done.returncode}):\n{tail}")
        return json.loads(lines[-1][len(ANSWER_MARK) :])

    def source(self, package: str) -> dict[pathlib.Path, str]:
        """Every Python file of an installed package, by path."""
        root = self.site_packages / package
        return {path: path.read_text(errors="replace") for path in sorted(root.rglob("*.py"))}


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"conformance tier: the engines venv is required on CI: {reason}", pytrace=False)
    pytest.skip(f"conformance tier skipped: {reason}")


@pytest.fixture(scope="session")
def engines() -> Engines:
    if reason := os.environ.get("KVTIER_ENGINES_UNAVAILABLE"):
        _unavailable(reason)
    python = engines_python()
    if not python.exists():
        _unavailable(f"no engines venv at {python.parent.parent} (run ./hack/engines.sh)")
    return Engines(python)
