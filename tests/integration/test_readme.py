"""The README's commands work as written: the programs and paths they name exist after setup, and the
"Try your own manifests" session (`kvtier dev up`, then the kubectl that setup installed) runs as shown."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()
VENV = Path(sys.executable).parent.parent


def _section(title: str) -> str:
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _commands(text: str) -> list[str]:
    """Each line of the text's ```sh blocks, comments dropped."""
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    return [line.split("  #")[0].strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_every_program_and_path_the_readmes_commands_name_exists():
    commands = _commands(README)
    assert commands, "no ```sh blocks in the README"
    for command in commands:
        for part in command.replace("&&", " ").split():
            if part.startswith(".venv/bin/"):
                assert (VENV / "bin" / part.removeprefix(".venv/bin/")).exists(), f"{command}: {part} is missing"
            elif part.startswith(("./hack/", "hack/", "charts/", "manifests/")):
                assert (REPO_ROOT / part).exists(), f"{command}: {part} does not exist"
    # Inline mentions of commands use the same programs.
    for program in set(re.findall(r"`\.venv/bin/([a-z]+)", README)):
        assert (VENV / "bin" / program).exists(), f".venv/bin/{program} is named in the README and missing"


def test_the_try_your_own_manifests_session_runs_as_written(tmp_path):
    """In a directory laid out like the repository after setup (so the real one's .kvtier/ is left alone)."""
    (tmp_path / "manifests").symlink_to(REPO_ROOT / "manifests")
    (tmp_path / ".venv").symlink_to(VENV)
    up, *session = _commands(_section("Try your own manifests"))
    assert up.startswith(".venv/bin/kvtier dev up")
    # PYTHONFAULTHANDLER: a stop that hangs is failed with every thread's stack (SIGABRT below), not a bare timeout.
    env = {**os.environ, "HOME": str(tmp_path), "KUBECACHEDIR": str(tmp_path / "kubecache"), "PYTHONFAULTHANDLER": "1"}
    process = subprocess.Popen(
        shlex.split(up) + ["--nodes", "2"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        while not lines or "Ctrl-C stops the cluster" not in lines[-1]:
            lines.append(process.stdout.readline())
            assert lines[-1], "".join(lines)
        assert (tmp_path / ".kvtier" / "kubeconfig").exists()
        outputs = {}
        for command in session:
            result = subprocess.run(
                shlex.split(command), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
            )
            assert result.returncode == 0, f"{command}:\n{result.stdout}{result.stderr}"
            outputs[command] = result.stdout
        text = "\n".join(outputs.values())
        assert "coder-480b" in text and "fx100-a" in text
        assert "Tokens per LMCache chunk" in text  # kubectl explain shows the CRD's descriptions
    finally:
        process.send_signal(signal.SIGINT)
        try:
            rest, _ = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            rest, _ = process.communicate(timeout=30)
            pytest.fail(f"dev up did not stop within 60 s of Ctrl-C; its output and stacks:\n{''.join(lines)}{rest}")
    output = "".join(lines) + rest
    assert process.returncode == 130, output
    assert "Traceback" not in output and "OS signals are ignored" not in output, output
    assert not (tmp_path / ".kvtier" / "kubeconfig").exists()
