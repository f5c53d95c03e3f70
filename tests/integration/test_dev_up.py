"""`kvtier dev up`: a usable cluster (with the operator) for a real kubectl, stopped cleanly by Ctrl-C; on the
embedded API emulator (the default) and on the real control plane (`--control-plane real`)."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, grounds, wait_for

KUBECTL = Path(sys.executable).parent / "kubectl"
#: What `dev up` tells the user to type: kubectl from PATH, else the one beside the interpreter.
KUBECTL_SHOWN = (
    "kubectl"
    if shutil.which("kubectl")
    else os.path.relpath(KUBECTL)
    if KUBECTL.is_relative_to(Path.cwd())
    else str(KUBECTL)
)


@pytest.mark.parametrize("control_plane", ["embedded", "real"])
def test_dev_up_serves_kubectl_runs_the_operator_and_stops_on_ctrl_c(tmp_path, control_plane, request):
    if control_plane not in grounds(request.config):
        pytest.skip(f"the {control_plane} ground is not selected (--ground)")
    kubeconfig = tmp_path / "kubeconfig"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvtier",
            "dev",
            "up",
            "--kubeconfig",
            str(kubeconfig),
            "--nodes",
            "2",
            "--resync-seconds",
            "1",
            "--control-plane",
            control_plane,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(kubeconfig.exists, timeout=120, message="the kubeconfig")
        kubectl = [str(KUBECTL), "--kubeconfig", str(kubeconfig)]
        env = {"HOME": str(tmp_path), "KUBECACHEDIR": str(tmp_path / "cache")}

        def run(*args):
            result = subprocess.run([*kubectl, *args], capture_output=True, text=True, env=env)
            assert result.returncode == 0, result.stderr
            return result.stdout

        wait_for(
            lambda: subprocess.run([*kubectl, "get", "kvp,infd"], capture_output=True, env=env).returncode == 0,
            timeout=60,
            message="kvtier's APIs served",
        )
        run("apply", "-f", str(EXAMPLES))
        listed = run("get", "kvp,infd", "-A")
        assert "CAPACITY" in listed and "fx100-a" in listed and "90Ti" in listed
        assert "coder-480b" in listed and "WATERMARK" in listed
        assert run("get", "nodes", "-o", "name").split() == ["node/sim-node-0", "node/sim-node-1"]

        def ready():
            status = json.loads(run("get", "infd", "coder-480b", "-o", "json")).get("status", {})
            return status.get("readyReplicas") == 2 and status

        status = wait_for(ready, timeout=90, interval=0.5, message="coder-480b's 2 replicas to be ready")
        assert status["kv"]["storage"]["quota"] == "4Ti"
        assert "AllReplicasReady" in run("get", "infd", "coder-480b")
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 130, output  # 128 + SIGINT, as a shell reports Ctrl-C
    assert "operator: running" in output and output.rstrip().endswith("stopping"), output
    assert "Traceback" not in output, output
    assert "OS signals are ignored" not in output, output  # kopf's note for its thread: the CLI handles signals
    assert f"{KUBECTL_SHOWN} --kubeconfig {kubeconfig} apply -f manifests/examples/" in output, output
    assert not kubeconfig.exists(), "the kubeconfig of a stopped cluster is left behind"


def test_dev_up_exits_143_on_sigterm_and_removes_its_kubeconfig(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    process = subprocess.Popen(
        [sys.executable, "-m", "kvtier", "dev", "up", "--kubeconfig", str(kubeconfig), "--nodes", "1", "--no-operator"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    try:
        while not lines or "Ctrl-C stops the cluster" not in lines[-1]:  # up, with its signal handlers
            lines.append(process.stdout.readline())
            assert lines[-1], "".join(lines)
    finally:
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=60)
    output = "".join(lines) + rest
    assert process.returncode == 143, output  # 128 + SIGTERM
    assert "1 simulated node (8 GPUs)" in output and output.rstrip().endswith("stopping"), output
    assert not kubeconfig.exists()
