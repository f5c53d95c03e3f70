"""`RenderOptions.simulated_engine_image` (kind, demos): the same pods, whose engines run `kvtier sim pod`,
and `kvtier sim pod` serving a rendered pod's faces from its own command lines."""

import json
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.request

import kubernetes_validate
import pytest

from kvtier.render import RenderOptions
from kvtier.render.lmcache import LOOKUP_LOG_DIR
from kvtier.render.simulate import IDLE, SIM_COMMAND
from tests.unit.test_render_modes import CASES, by_kind, render_case

IMAGE = "ghcr.io/kvtier/kvtier-operator:test"


def pod_spec(case, options):
    return by_kind(render_case(case, options)[2], "StatefulSet")[0]["spec"]["template"]["spec"]


def containers(spec):
    return {container["name"]: container for container in spec["containers"]}


@pytest.mark.parametrize("case", sorted(CASES))
def test_simulated_pods_keep_their_shape_and_run_kvsim(case):
    real = pod_spec(case, RenderOptions())
    simulated = pod_spec(case, RenderOptions(simulated_engine_image=IMAGE))
    kubernetes_validate.validate(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": simulated}, "1.33", strict=True
    )
    before, after = containers(real), containers(simulated)
    assert list(before) == list(after)
    for name in before:  # ports, probes and resources are untouched: kind schedules and probes the same pod
        for key in ("ports", "resources", "readinessProbe", "startupProbe", "livenessProbe"):
            assert after[name].get(key) == before[name].get(key), (name, key)
    assert simulated["volumes"] == real["volumes"]
    assert simulated.get("readinessGates") == real.get("readinessGates")
    vllm = after["vllm"]
    assert vllm["image"] == IMAGE and vllm["command"] == SIM_COMMAND
    assert shlex.split(vllm["args"][1]) == ["vllm", "serve", *before["vllm"]["args"]]
    assert vllm["env"] == before["vllm"]["env"]
    if "lmcache" in before:
        assert vllm["args"][2] == "--lmcache"
        assert shlex.split(vllm["args"][3]) == ["lmcache", "server", *before["lmcache"]["args"]]
        assert after["lmcache"]["image"] == IMAGE and after["lmcache"]["command"] == IDLE
        assert "args" not in after["lmcache"]
    else:
        assert len(vllm["args"]) == 2
    if "kvtier-probe" in before:  # the engine writes the log the probe reads
        assert {"name": "lookup-hashes", "mountPath": LOOKUP_LOG_DIR, "readOnly": False} in vllm["volumeMounts"]
        assert after["kvtier-probe"] == before["kvtier-probe"]
    assert "initContainers" not in simulated  # they prepare the real storage tier, which kvsim does not use


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url):
    with urllib.request.urlopen(url, timeout=2) as reply:
        return reply.read().decode()


def test_kvtier_sim_pod_serves_the_rendered_faces(tmp_path):
    ports = {"vllm_port": _free_port(), "lmcache_http_port": _free_port()}
    spec = pod_spec("mp-nvmeof", RenderOptions(simulated_engine_image=IMAGE, **ports))
    args = containers(spec)["vllm"]["args"]
    # The log directory is an emptyDir in the pod; here a temporary directory stands in for it.
    lmcache = [str(tmp_path) if word == LOOKUP_LOG_DIR else word for word in shlex.split(args[3])]
    command = [
        sys.executable,
        "-m",
        "kvtier",
        "sim",
        "pod",
        "--host",
        "127.0.0.1",
        "--vllm",
        args[1],
        "--lmcache",
        shlex.join(lmcache),
    ]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "KVSIM_HBM_BLOCKS": "64"},
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _get(f"http://127.0.0.1:{ports['vllm_port']}/health")
                break
            except OSError:
                assert process.poll() is None, process.communicate()[0]
                assert time.monotonic() < deadline, "kvtier sim pod did not answer within 30s"
                time.sleep(0.2)
        assert "vllm:kv_cache_usage_perc" in _get(f"http://127.0.0.1:{ports['vllm_port']}/metrics")
        request = urllib.request.Request(
            f"http://127.0.0.1:{ports['lmcache_http_port']}/quota/_default", data=b'{"limit_gb": 3}', method="PUT"
        )
        assert json.loads(urllib.request.urlopen(request, timeout=2).read())["limit_gb"] == 3
        # /metrics on LMCache's HTTP port, as 0.5.6 serves it
        assert "lmcache_mp_l2_usage_bytes" in _get(f"http://127.0.0.1:{ports['lmcache_http_port']}/metrics")
        model = json.loads(_get(f"http://127.0.0.1:{ports['vllm_port']}/v1/models"))["data"][0]["id"]
        assert model == "Qwen/Qwen3-8B"  # from the rendered `vllm serve MODEL`
        prompt = json.dumps({"model": model, "prompt": list(range(600)), "max_tokens": 1}).encode()
        completion = urllib.request.Request(
            f"http://127.0.0.1:{ports['vllm_port']}/v1/completions",
            data=prompt,
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(completion, timeout=5).read()
        assert any(tmp_path.iterdir()), "no lookup-hash log in the rendered --lookup-hash-log-dir"
    finally:
        process.terminate()
        output = process.communicate(timeout=10)[0]
    assert process.returncode == 0, output


def test_kvtier_sim_pod_refuses_other_command_lines():
    result = subprocess.run(
        [sys.executable, "-m", "kvtier", "sim", "pod", "--vllm", "python -m http.server"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "not a `vllm serve ...` command line" in result.stderr


def test_the_kind_example_fits_a_small_kind_node_only_when_simulated():
    from kvtier.api.documents import read_documents
    from kvtier.render import NodeResources, check_fit
    from kvtier.render.simulate import simulated_options
    from tests.conftest import REPO_ROOT

    documents = [d for d in read_documents([str(REPO_ROOT / "hack" / "kind")]) if d.ours]
    models = {type(d.model).__name__: d.model for d in documents}
    deployment, pool = models["InferenceDeployment"], models["KVPool"]
    # What hack/kind-e2e.sh gives a kind node on a 4-core, 8 GiB machine: fake GPUs, the host's CPU and memory.
    node = NodeResources("kind-control-plane", memory=7 * 2**30, gpus=8, cpu_millis=4000)
    assert check_fit(deployment, [node], simulated_options(RenderOptions(), IMAGE), pool) == []
    assert check_fit(deployment, [node], RenderOptions(), pool)  # the real engines' overheads would not fit


def test_kvtier_run_wires_simulation_and_peering_into_the_operator(monkeypatch):
    from click.testing import CliRunner

    import kvtier.controllers
    from kvtier.cli import main
    from kvtier.render.simulate import simulated_options

    seen = []

    async def run_operator(config, liveness_endpoint=None, verbose=False):
        seen.append((config, verbose))

    monkeypatch.setattr(kvtier.controllers, "run_operator", run_operator)
    result = CliRunner().invoke(
        main,
        [
            "run",
            "--simulated-engine-image",
            IMAGE,
            "--probe-image",
            "probe:1",
            "--peering",
            "kvtier",
            "--priority",
            "7",
            "--verbose",
        ],
    )
    assert result.exit_code == 0, result.output
    ((config, verbose),) = seen
    assert verbose
    assert config.render == simulated_options(RenderOptions(probe_image="probe:1"), IMAGE)
    assert (config.peering, config.priority) == ("kvtier", 7)
    result = CliRunner().invoke(main, ["run"])
    config, verbose = seen[-1]
    assert config.render == RenderOptions() and config.peering is None and not verbose
