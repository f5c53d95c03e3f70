"""`kvtier demo`: the README's main job runs to the end on the embedded cluster and writes its summary and
plot; a cluster that never becomes ready is an error that says so."""

import json
import re
import signal
import subprocess
import sys

from click.testing import CliRunner

from kvtier.cli import main


def test_demo_runs_to_the_end_shows_quotas_moving_and_writes_summary_and_plot(tmp_path):
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "kvtier", "demo", "--duration", "15", "--no-live", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Traceback" not in output, output
    assert "all 3 deployments Ready after" in output
    progress = [line for line in output.splitlines() if line.startswith("[")]
    assert progress and all(name in progress[-1] for name in ("chat 1/1", "code 1/1", "rag 1/1")), output
    assert "pool 96Gi/96Gi" in progress[-1]
    # Every deployment started at an equal share, and the pool's rebalancer moved some of it.
    assert "quota 32Gi" in progress[0] or "quota —" in progress[0]
    assert any("Rebalanced: KVPool demo-pool: moved" in line for line in output.splitlines()), output
    for name in ("summary.md", "demo.png", "samples.json", "operator.log"):
        assert f"wrote {out / name}" in output
    summary = (out / "summary.md").read_text()
    assert "## Storage quota per deployment" in summary
    for name in ("chat", "code", "rag"):  # quota at the start and at the end
        assert re.search(rf"^\| {name} \| [0-9.]+[MG]i \| [0-9.]+[MG]i \|", summary, re.M), summary
    assert re.search(r"^([1-9][0-9]*) quota changes observed", summary, re.M), summary
    assert (out / "demo.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    samples = json.loads((out / "samples.json").read_text())
    assert samples["deployments"] == ["chat", "code", "rag"] and len(samples["samples"]) >= 5
    assert not (out / "kubeconfig").exists()  # the cluster it named is gone


def test_demo_fails_clearly_when_the_replicas_are_never_ready(tmp_path):
    result = CliRunner().invoke(
        main, ["demo", "--duration", "5", "--ready-timeout", "1", "--no-live", "--out", str(tmp_path)]
    )
    assert result.exit_code == 1, result.output
    assert "error: the demo's replicas were not all Ready within 1s:" in result.output
    assert "chat" in result.output and f"logs: {tmp_path / 'operator.log'}" in result.output
    assert not (tmp_path / "summary.md").exists()


def test_demo_exits_143_on_sigterm_and_130_on_ctrl_c(tmp_path):
    for signum, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        out = tmp_path / str(code)
        process = subprocess.Popen(
            [sys.executable, "-m", "kvtier", "demo", "--no-live", "--out", str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        lines = []
        try:
            while not lines or "starting the embedded cluster" not in lines[-1]:  # its signal handlers are in place
                lines.append(process.stdout.readline())
                assert lines[-1], "".join(lines)
        finally:
            process.send_signal(signum)
            rest, _ = process.communicate(timeout=60)
        output = "".join(lines) + rest
        assert process.returncode == code, output
        assert "Traceback" not in output and "interrupted" in output, output
        assert not (out / "kubeconfig").exists()
