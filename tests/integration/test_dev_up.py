"""`kvtier dev up`: a usable cluster for a real kubectl, stopped cleanly by Ctrl-C."""

import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import EXAMPLES, wait_for

KUBECTL = Path(sys.executable).parent / "kubectl"


def test_dev_up_serves_kubectl_and_stops_on_ctrl_c(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    process = subprocess.Popen(
        [sys.executable, "-m", "kvtier", "dev", "up", "--kubeconfig", str(kubeconfig), "--nodes", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        wait_for(kubeconfig.exists, timeout=30, message="the kubeconfig")
        kubectl = [str(KUBECTL), "--kubeconfig", str(kubeconfig)]
        env = {"HOME": str(tmp_path), "KUBECACHEDIR": str(tmp_path / "cache")}
        applied = subprocess.run([*kubectl, "apply", "-f", str(EXAMPLES)], capture_output=True, text=True, env=env)
        assert applied.returncode == 0, applied.stderr
        listed = subprocess.run([*kubectl, "get", "kvp,infd", "-A"], capture_output=True, text=True, env=env)
        assert listed.returncode == 0, listed.stderr
        header_pool, *_ = [line for line in listed.stdout.splitlines() if line.startswith("NAME")]
        assert "CAPACITY" in header_pool and "fx100-a" in listed.stdout and "90Ti" in listed.stdout
        assert "coder-480b" in listed.stdout and "WATERMARK" in listed.stdout
        nodes = subprocess.run([*kubectl, "get", "nodes", "-o", "name"], capture_output=True, text=True, env=env)
        assert nodes.stdout.split() == ["node/sim-node-0", "node/sim-node-1"]
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    assert "kubeconfig:" in output and output.rstrip().endswith("stopping")
    assert "Traceback" not in output
