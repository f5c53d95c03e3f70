"""kvsim engines for simulated pods: one engine per pod behind its vllm, lmcache and probe containers."""

import json
import pathlib
import random
import uuid

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvtier.sim.pods import (
    DEFAULT_TRACE,
    TRACES_ENV,
    KvsimEngines,
    command_line,
    container_kind,
    find_trace_dir,
    flag,
)
from kvtier.sim.settings import TraceLoad
from kvtier.testing.engines import embedded_engines

ROOT = pathlib.Path(__file__).resolve().parents[2]
LOG_DIR = "/var/run/kvtier/lookup-hashes"


def pod(trace_path=None):
    """A pod shaped like the renderer's LMCacheMP replica (vllm, lmcache and the probe sharing an emptyDir)."""
    env = [
        {"name": "KVSIM_BLOCK_TOKENS", "value": "4"},
        {"name": "KVSIM_HBM_BLOCKS", "value": "16"},
        {"name": "KVSIM_CPU_BLOCKS", "value": "8"},
        {"name": "KVSIM_SPEED", "value": "1e9"},
    ]
    if trace_path:
        env.append({"name": "KVSIM_TRACE", "value": str(trace_path)})
    mount = {"name": "lookup-hashes", "mountPath": LOG_DIR}
    return {
        "metadata": {"name": "chat-0", "namespace": "default", "uid": str(uuid.uuid4())},
        "spec": {
            "containers": [
                {
                    "name": "vllm",
                    "command": ["vllm", "serve"],
                    "env": env,
                    "args": ["meta-llama/Llama-3.1-70B", "--served-model-name", "chat", "--port", "8000"],
                },
                {
                    "name": "lmcache",
                    "command": ["lmcache", "server"],
                    "volumeMounts": [mount],
                    "args": [
                        "--port",
                        "5555",
                        "--http-port",
                        "8080",
                        "--lookup-hash-log-dir",
                        LOG_DIR,
                        "--lookup-hash-log-rotation-interval",
                        "600",
                        "--lookup-hash-log-max-files",
                        "6",
                    ],
                },
                {
                    "name": "kvtier-probe",
                    "command": ["kvtier", "probe"],
                    "volumeMounts": [{**mount, "mountPath": "/logs", "readOnly": True}],
                    "args": ["--log-dir", "/logs", "--chunk-bytes", "1310720", "--port", "9400"],
                },
                {"name": "sidecar", "command": ["sh", "-c", "sleep infinity"]},
            ]
        },
    }


def address():
    return f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"


def families(text):
    return {family.name: family for family in text_string_to_metric_families(text)}


def total(family):
    return sum(sample.value for sample in family.samples if not sample.name.endswith("_created"))


async def test_a_pods_three_containers_share_one_engine_and_are_scraped(tmp_path):
    engines = KvsimEngines(tmp_path)
    spec = pod()
    host = address()
    handles = [await engines(spec, container, host) for container in spec["spec"]["containers"]]
    server = engines.server(spec["metadata"]["uid"])
    assert server is not None and server.model == "chat" and server.params.block_tokens == 4
    try:
        async with aiohttp.ClientSession() as http:
            async with http.put(f"http://{host}:8080/quota/_default", json={"limit_gb": 1}) as reply:
                assert reply.status == 200
            for _ in range(2):
                prompt = " ".join(f"w{i}" for i in range(80))  # 20 blocks, more than HBM holds
                async with http.post(f"http://{host}:8000/v1/completions", json={"prompt": prompt}) as reply:
                    assert reply.status == 200
            async with http.get(f"http://{host}:8000/metrics") as reply:
                vllm = families(await reply.text())
            async with http.get(f"http://{host}:8080/metrics") as reply:  # LMCache's HTTP port, as 0.5.6
                lmcache = families(await reply.text())
            async with http.get(f"http://{host}:9400/metrics") as reply:
                probe = families(await reply.text())
            async with http.get(f"http://{host}:8080/quota/_default") as reply:
                quota = await reply.json()
    finally:
        for handle in handles:
            await handle.stop()

    assert total(vllm["vllm:prompt_tokens"]) == 160
    assert total(lmcache["lmcache_mp_lookups_requests"]) == 2
    # HBM (16 blocks) and L1 (8, holding the prompt's first blocks) miss the last 4 blocks; L2 has them.
    assert total(lmcache["lmcache_mp_lookup_hit_l2_keys"]) == 4
    assert quota["exists"] and quota["current_usage_gb"] > 0
    # The probe read the log the lmcache container wrote, through the shared volume.
    assert total(probe["kvtier_probe_lookups"]) == 2
    assert total(probe["kvtier_probe_chunks"]) == 40
    buckets = {
        s.labels["le"]: s.value
        for s in probe["kvtier_probe_stack_distance_chunks"].samples
        if s.name.endswith("_bucket")
    }
    # The repeat's block k sits at stack distance k + 1: an LRU of C chunks hits min(C, 20) of them.
    assert (buckets["8.0"], buckets["16.0"], buckets["32.0"], buckets["+Inf"]) == (8, 16, 20, 40)
    assert engines.server(spec["metadata"]["uid"]) is None  # the last container stopped: the engine is gone
    assert not (tmp_path / spec["metadata"]["uid"]).exists()


def write_trace(path, count):
    """A small Mooncake-format trace: `count` requests at once, each sharing its first block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(
            json.dumps({"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [1, 100 + index]}) + "\n"
            for index in range(count)
        )
    )
    return path


async def replayed(engines, spec):
    """Requests the pod's vllm container replayed (its replay ends with the trace)."""
    handle = await engines(spec, spec["spec"]["containers"][0], address())
    try:
        [running] = handle.parts
        if running.replay is None:
            return None
        served = await running.replay
        assert engines.server(spec["metadata"]["uid"]).engine.stats.requests == served
        return served
    finally:
        await handle.stop()


async def test_a_pod_replays_the_trace_its_engine_env_names(tmp_path):
    trace = write_trace(tmp_path / "trace.jsonl", 20)
    assert await replayed(KvsimEngines(tmp_path / "pods"), pod(trace)) == 20


async def test_a_relative_trace_is_found_in_the_trace_directory(tmp_path):
    write_trace(tmp_path / "traces" / "mine" / "t.jsonl", 7)
    engines = KvsimEngines(tmp_path / "pods", trace_dir=tmp_path / "traces")
    assert await replayed(engines, pod("mine/t.jsonl")) == 7


async def test_pods_naming_no_trace_replay_the_default_load_and_others_keep_theirs(tmp_path):
    write_trace(tmp_path / "traces" / "default.jsonl", 5)
    own = write_trace(tmp_path / "own.jsonl", 3)
    engines = KvsimEngines(tmp_path / "pods", trace_dir=tmp_path / "traces", default_load=TraceLoad("default.jsonl"))
    assert await replayed(engines, pod()) == 5
    assert await replayed(engines, pod(own)) == 3
    assert await replayed(KvsimEngines(tmp_path / "idle"), pod()) is None
    silent = pod()
    silent["spec"]["containers"][0]["env"].append({"name": "KVSIM_TRACE", "value": ""})
    assert await replayed(engines, silent) is None  # an empty KVSIM_TRACE: no load at all


def test_embedded_engines_default_to_the_shared_trace_only_when_it_exists(tmp_path, monkeypatch):
    write_trace(tmp_path / DEFAULT_TRACE, 1)
    monkeypatch.setenv(TRACES_ENV, str(tmp_path))
    assert find_trace_dir() == tmp_path
    engines = embedded_engines(tmp_path / "pods")
    assert engines.trace_dir == tmp_path and engines.default_load == TraceLoad(DEFAULT_TRACE, loop=True)
    assert embedded_engines(tmp_path / "pods", trace_dir=tmp_path / "empty").default_load is None


async def test_unknown_containers_get_the_fallback_and_bad_arguments_serve_nothing(tmp_path):
    started = []

    async def fallback(pod_, container, host):
        started.append(container["name"])
        return "the fallback's engine"

    engines = KvsimEngines(tmp_path, fallback=fallback)
    spec = pod()
    sidecar = spec["spec"]["containers"][3]
    assert await engines(spec, sidecar, address()) == "the fallback's engine"
    assert started == ["sidecar"]
    broken = {**spec["spec"]["containers"][2], "args": ["--port", "not-a-number"]}
    handle = await engines(spec, broken, address())
    assert handle.parts == []
    await handle.stop()
    assert engines.server(spec["metadata"]["uid"]) is None
    spec["spec"]["containers"][0]["env"].append({"name": "KVSIM_HBM_BLOCKS", "value": "many"})
    handle = await engines(spec, spec["spec"]["containers"][0], address())
    assert handle.parts == [] and engines.server(spec["metadata"]["uid"]) is None


@pytest.mark.parametrize(
    "container, kind",
    [
        ({"command": ["vllm", "serve"], "args": ["m"]}, "vllm"),
        ({"command": ["/usr/local/bin/vllm"], "args": ["serve", "m", "--port=9"]}, "vllm"),
        ({"command": ["sh", "-c", "exec lmcache server --http-port 1"]}, "lmcache"),
        ({"command": ["kvtier", "probe"], "args": ["--log-dir", "/x"]}, "probe"),
        ({"command": ["python", "-m", "http.server"]}, None),
        ({}, None),
    ],
)
def test_containers_are_recognised_by_their_command_line(container, kind):
    recognised = container_kind(container)
    assert (recognised[0] if recognised else None) == kind


def test_flags_and_command_lines():
    words = command_line({"command": ["sh", "-c", "lmcache server --http-port 1 --http-port=2"], "args": ["--x"]})
    assert words == ["sh", "-c", "lmcache", "server", "--http-port", "1", "--http-port=2", "--x"]
    assert flag(words, "--http-port") == "2" and flag(words, "--missing") is None
    assert flag(["--x"], "--x") is None


async def test_the_rendered_example_replica_runs_under_kvsim():
    from kvtier.api.documents import read_documents
    from kvtier.render.offline import render_documents
    from kvtier.sim.server import GB
    from kvtier.testing.engines import stub_engine

    rendered = render_documents(read_documents([str(ROOT / "manifests" / "examples")]))
    template = next(o for o in rendered.objects if o["kind"] == "StatefulSet")["spec"]["template"]
    replica = {
        "metadata": {**template["metadata"], "name": "replica-0", "uid": str(uuid.uuid4())},
        "spec": template["spec"],
    }
    names = [c["name"] for c in replica["spec"]["containers"]]
    assert names == ["vllm", "lmcache", "kvtier-probe"]
    host = address()
    kvsim_engine = KvsimEngines(fallback=stub_engine)  # no default load
    handles = [await kvsim_engine(replica, container, host) for container in replica["spec"]["containers"]]
    server = kvsim_engine.server(replica["metadata"]["uid"])
    try:
        # One block is one LMCache chunk of the rendered server: --chunk-size tokens, one L2 slot per TP rank
        # (8 x (65011712 / 8 + the 4096 slot header)).
        assert server.params.block_tokens == 256 and server.params.block_bytes == 8 * (65011712 // 8 + 4096)
        async with aiohttp.ClientSession() as http:
            for port, path in ((8000, "/health"), (8080, "/healthcheck"), (8080, "/metrics"), (9400, "/health")):
                async with http.get(f"http://{host}:{port}{path}") as reply:
                    assert reply.status == 200, (port, path)
            async with http.put(f"http://{host}:8080/quota/_default", json={"limit_gb": 10}) as reply:
                assert reply.status == 200
            assert server.pool.quota("") == 10 * GB // 65011712
            prompt = " ".join(f"t{i}" for i in range(1000))
            for _ in range(2):
                async with http.post(f"http://{host}:8000/v1/completions", json={"prompt": prompt}) as reply:
                    assert (await reply.json())["model"] == "coder"
            async with http.get(f"http://{host}:9400/metrics") as reply:
                probe = families(await reply.text())
    finally:
        for handle in handles:
            await handle.stop()
    assert total(probe["kvtier_probe_lookups"]) == 2
    in_bytes = {
        float(s.labels["le"]): s.value
        for s in probe["kvtier_probe_stack_distance_bytes"].samples
        if s.name.endswith("_bucket")
    }
    assert in_bytes[4 * 65011712] == 4  # the repeat's 4 chunks hit a cache of 4 chunks' bytes
