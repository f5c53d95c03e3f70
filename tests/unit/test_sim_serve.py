"""`kvtier sim serve`: the vLLM and LMCache MP HTTP faces, their metrics, the quota API, the
lookup-hash log and the self-driving trace replay."""

import json
import math
import re

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from kvtier.probe.tail import FIELDS, FILE_PATTERN
from kvtier.sim.engine import EngineParams
from kvtier.sim.lookuplog import LookupHashLog, Rotation
from kvtier.sim.server import (
    GB,
    SimServer,
    lmcache_app,
    prompt_blocks,
    replay_trace,
    salted,
    vllm_app,
)
from kvtier.sim.settings import SERVE_DEFAULTS, TraceLoad, settings_from_env
from tests.conftest import SHARED

TRACES = SHARED / "traces" / "mooncake"

# Small blocks so a short prompt spans several; 1 MiB per block makes GiB quotas 1024 blocks.
PARAMS = EngineParams(block_tokens=4, kv_bytes_per_token=1 << 18, hbm_blocks=4, cpu_blocks=8)
BLOCK_BYTES = PARAMS.block_bytes


def reference_names(section: str) -> set[str]:
    """Metric names of one section of engine-metrics.md (the first column of its table)."""
    text = (SHARED / "reference" / "engine-metrics.md").read_text()
    body = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([^`]+)` \|", body, re.MULTILINE))


def families(text):
    """Metric families of a page, by the names on the wire (counters with `_total`), `_created` left out."""
    result = {}
    for family in text_string_to_metric_families(text):
        wire = family.name + "_total" if family.type == "counter" else family.name
        if not wire.endswith("_created"):
            result[wire] = family
    return result


def value(family, **labels):
    return sum(
        s.value
        for s in family.samples
        if all(s.labels.get(k) == v for k, v in labels.items()) and not s.name.endswith("_created")
    )


@pytest.fixture
async def faces(tmp_path):
    server = SimServer(PARAMS, model="m", lookup_log=LookupHashLog(tmp_path / "log"))
    clients = []
    for app in (vllm_app(server), lmcache_app(server)):
        client = TestClient(TestServer(app))
        await client.start_server()
        clients.append(client)
    vllm, lmcache = clients
    yield server, vllm, lmcache, lmcache  # LMCache 0.5.6 serves /metrics on its HTTP port, beside /quota
    for client in clients:
        await client.close()


async def complete(client, prompt, **fields):
    reply = await client.post("/v1/completions", json={"prompt": prompt, **fields})
    assert reply.status == 200, await reply.text()
    return await reply.json()


async def test_quota_api_put_get_delete_list(faces):
    server, _, lmcache, _ = faces
    reply = await lmcache.get("/quota/_default")
    assert await reply.json() == {"cache_salt": "_default", "limit_gb": 0.0, "current_usage_gb": 0.0, "exists": False}
    assert (await (await lmcache.get("/quota")).json()) == {"users": {}}

    reply = await lmcache.put("/quota/_default", json={"limit_gb": 0.0078125})  # 8 MiB: 8 blocks
    assert reply.status == 200
    assert await reply.json() == {"cache_salt": "_default", "limit_gb": 0.0078125, "status": "ok"}
    assert server.pool.quota("") == 8  # the empty salt is `_default` in the URL
    await lmcache.put("/quota/tenant-b", json={"limit_gb": 1})
    listed = await (await lmcache.get("/quota")).json()
    assert listed == {
        "users": {
            "_default": {"limit_gb": 0.0078125, "current_usage_gb": 0.0},
            "tenant-b": {"limit_gb": 1.0, "current_usage_gb": 0.0},
        }
    }
    assert server.pool.quota("tenant-b") == GB // BLOCK_BYTES

    reply = await lmcache.delete("/quota/tenant-b")
    assert reply.status == 200 and await reply.json() == {"cache_salt": "tenant-b", "status": "removed"}
    assert server.pool.quota("tenant-b") is None
    reply = await lmcache.delete("/quota/tenant-b")
    assert reply.status == 200 and await reply.json() == {"cache_salt": "tenant-b", "status": "not_found"}
    assert (await lmcache.get("/healthcheck")).status == 200


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1, 2]",
        b"{}",
        b'{"limit_gb": -1}',
        b'{"limit_gb": "3"}',
        b'{"limit_gb": true}',
        b'{"limit_gb": null}',
        b'{"limit_gb": NaN}',
        b'{"limit_gb": Infinity}',
        b"\xff\xfe",
    ],
)
async def test_quota_api_rejects_bad_bodies_with_json_400(faces, body):
    server, _, lmcache, _ = faces
    reply = await lmcache.put("/quota/x", data=body)
    assert reply.status == 400
    assert "limit_gb" in (await reply.json())["error"] or "JSON" in (await reply.json())["error"]
    assert server.pool.quota("x") is None


async def test_quota_resizes_the_salts_l2_partition(faces):
    server, vllm, lmcache, _ = faces
    await lmcache.put("/quota/_default", json={"limit_gb": 32 * BLOCK_BYTES / GB})
    prompt = " ".join(f"w{i}" for i in range(40))  # 10 blocks, more than HBM (4) and CPU (8) hold
    await complete(vllm, prompt)
    entry = await (await lmcache.get("/quota/_default")).json()
    assert entry["current_usage_gb"] == 10 * BLOCK_BYTES / GB
    await lmcache.put("/quota/_default", json={"limit_gb": 3 * BLOCK_BYTES / GB})
    assert server.pool.usage("") == 3
    await lmcache.put("/quota/other", json={"limit_gb": 1})
    other = await complete(vllm, prompt, cache_salt="other")
    assert other["kvsim"]["hit_tokens"] == {"hbm": 0, "cpu": 0, "storage": 0}  # a salt has its own blocks
    assert server.pool.usage("other") == 10 and server.pool.usage("") == 3


async def test_completions_move_the_vllm_counters_with_the_reference_names(faces):
    _, vllm, _, _ = faces
    before = families(await (await vllm.get("/metrics")).text())
    prompt = " ".join(f"t{i}" for i in range(10))  # 3 blocks: 4 + 4 + 2 tokens
    first = await complete(vllm, prompt, max_tokens=5)
    second = await complete(vllm, prompt, max_tokens=5)
    assert first["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    assert first["kvsim"]["hit_tokens"]["hbm"] == 0 and second["kvsim"]["hit_tokens"]["hbm"] == 10
    page = await (await vllm.get("/metrics")).text()
    after = families(page)

    assert set(after) <= reference_names("vLLM 0.33.0")
    for name in (
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:external_prefix_cache_queries_total",
        "vllm:external_prefix_cache_hits_total",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:prompt_tokens_by_source_total",
        "vllm:time_to_first_token_seconds",
    ):
        assert name in after and name in before, name
    for family in after.values():
        for sample in family.samples:
            assert {"model_name", "engine"} <= set(sample.labels) <= {"model_name", "engine", "source", "le"}
            assert sample.labels["model_name"] == "m"

    assert value(after["vllm:prefix_cache_queries_total"]) == 20
    assert value(after["vllm:prefix_cache_hits_total"]) == 10
    assert value(after["vllm:external_prefix_cache_queries_total"]) == 10
    assert value(after["vllm:prompt_tokens_total"]) == 20
    by_source = after["vllm:prompt_tokens_by_source_total"]
    assert value(by_source, source="local_compute") == 10 and value(by_source, source="local_cache_hit") == 10
    assert value(by_source, source="external_kv_transfer") == 0
    ttft = after["vllm:time_to_first_token_seconds"]
    assert [s.value for s in ttft.samples if s.name.endswith("_count")] == [2]
    assert 0 < value(after["vllm:kv_cache_usage_perc"]) <= 1


async def test_lmcache_metrics_have_the_mp_names_and_per_salt_labels(faces):
    server, vllm, lmcache, metrics = faces
    await lmcache.put("/quota/a", json={"limit_gb": 1})
    prompt = " ".join(f"x{i}" for i in range(40))  # 10 blocks: beyond HBM (4), and L1 (8) keeps the last 8 touched
    await complete(vllm, prompt, cache_salt="a")
    again = await complete(vllm, prompt, cache_salt="a")
    hits = again["kvsim"]["hit_tokens"]
    assert hits["hbm"] == 16 and hits["cpu"] + hits["storage"] == 24
    page = families(await (await metrics.get("/metrics")).text())
    lookups = {
        "lmcache_mp_lookup_requested_tokens_total",
        "lmcache_mp_lookup_hit_tokens_total",
        "lmcache_mp_lookup_hit_l1_tokens_total",
        "lmcache_mp_lookup_hit_l2_tokens_total",
        "lmcache_mp_lookup_hit_l1_keys_total",
        "lmcache_mp_lookup_hit_l2_keys_total",
        "lmcache_mp_lookups_requests_total",
    }
    assert set(page) == lookups | {
        "lmcache_mp_l1_evicted_chunks_total",
        "lmcache_mp_l2_evicted_objects_chunks_total",
        "lmcache_mp_l1_memory_usage_bytes",
        "lmcache_mp_l2_usage_bytes",
    }
    for name in lookups:
        assert all(s.labels["model_name"] == "m" and s.labels["cache_salt"] == "a" for s in page[name].samples)
    assert value(page["lmcache_mp_lookups_requests_total"]) == 2
    assert value(page["lmcache_mp_lookup_requested_tokens_total"]) == 40 + 24
    assert value(page["lmcache_mp_lookup_hit_l1_tokens_total"]) == hits["cpu"]
    assert value(page["lmcache_mp_lookup_hit_l2_tokens_total"]) == hits["storage"]
    assert value(page["lmcache_mp_lookup_hit_tokens_total"]) == 24
    assert value(page["lmcache_mp_l1_evicted_chunks_total"]) == server.engine.cpu.evicted > 0
    assert value(page["lmcache_mp_l1_memory_usage_bytes"], backend="dram", l1_tag="_default") == 8 * BLOCK_BYTES
    assert value(page["lmcache_mp_l2_usage_bytes"], l2_name="raw_block") == server.pool.used * BLOCK_BYTES > 0


@pytest.mark.parametrize(
    "body, status",
    [
        (b"{", 400),
        (b'"text"', 400),
        (b"{}", 400),
        (b'{"prompt": ""}', 400),
        (b'{"prompt": ["a", 1]}', 400),
        (b'{"prompt": "a", "max_tokens": -1}', 400),
        (b'{"prompt": "a", "max_tokens": 1.5}', 400),
        (b'{"prompt": "a", "cache_salt": 7}', 400),
        (b'{"prompt": "a", "model": "other"}', 404),
    ],
)
async def test_bad_completions_get_json_errors_and_change_nothing(faces, body, status):
    server, vllm, _, _ = faces
    reply = await vllm.post("/v1/completions", data=body)
    assert reply.status == status
    assert isinstance((await reply.json())["error"], str)
    assert server.engine.stats.requests == 0


async def test_unknown_routes_and_methods_are_json_errors(faces):
    _, vllm, lmcache, _ = faces
    for client, method, path, status in (
        (vllm, "GET", "/nope", 404),
        (vllm, "GET", "/v1/completions", 405),
        (lmcache, "POST", "/quota", 405),
    ):
        reply = await client.request(method, path)
        assert reply.status == status and "error" in await reply.json()
    assert (await (await vllm.get("/v1/models")).json())["data"][0]["id"] == "m"
    assert (await vllm.get("/health")).status == 200


async def test_lookup_hash_log_lines_have_exactly_the_reference_fields(faces):
    server, vllm, _, _ = faces
    prompt = " ".join(f"y{i}" for i in range(9))
    await complete(vllm, prompt, cache_salt="s")
    [path] = server.lookup_log.files()
    assert FILE_PATTERN.match(path.name)
    [record] = [json.loads(line) for line in path.read_text().splitlines()]
    assert tuple(record) == FIELDS
    assert isinstance(record["timestamp"], float) and record["model_name"] == "m"
    assert record["chunk_size"] == 4 and record["seq_len"] == 9
    assert record["chunk_hashes"] == [f"0x{b:064x}" for b in prompt_blocks(prompt.split(), 4, "s")]
    assert all(re.fullmatch(r"0x[0-9a-f]{64}", h) for h in record["chunk_hashes"])  # as LMCache 0.5.6 spells them


def test_lookup_hash_log_rotates_by_size_and_age_and_keeps_max_files(tmp_path):
    now = [1_800_000_000.0]
    log = LookupHashLog(tmp_path, Rotation(interval_seconds=60, max_bytes=600, max_files=3), clock=lambda: now[0])
    for index in range(6):
        log.write(f"r{index}", "m", 256, 512, ["ab" * 8, "cd" * 8])  # about 200 bytes: three lines a file
    assert [p.name for p in log.files()] == [
        "lookup_hashes_20270115_080000_000000.jsonl",
        "lookup_hashes_20270115_080000_000001.jsonl",
    ]
    assert all(len(p.read_text().splitlines()) == 3 for p in log.files())
    now[0] += 60
    log.write("late", "m", 256, 512, [])
    assert log.files()[-1].name == "lookup_hashes_20270115_080100_000002.jsonl"
    for index in range(4):
        now[0] += 61
        log.write(f"x{index}", "m", 256, 512, [])
    assert len(log.files()) == 3  # the oldest are deleted
    assert log.files()[-1].read_text().count("\n") == 1
    log.close()


def test_prompt_and_trace_blocks_are_prefix_chained_and_salted():
    tokens = "a b c d e f g h i".split()
    blocks = prompt_blocks(tokens, 4)
    assert len(blocks) == 3 and len(set(blocks)) == 3
    assert prompt_blocks(tokens[:8] + ["z"], 4)[:2] == blocks[:2]  # same prefix, same ids
    assert prompt_blocks(["z"] + tokens[1:], 4)[1] != blocks[1]  # a changed block changes every later id
    assert prompt_blocks(tokens, 4, "s")[0] != blocks[0]
    assert salted([1, 2], "") == [1, 2]
    assert salted([1, 2], "s") != salted([1, 2], "t") and len(set(salted([1, 2], "s"))) == 2


def trace_prefix(tmp_path, count, source="mooncake_synthetic_trace.jsonl"):
    path = tmp_path / "trace.jsonl"
    with open(TRACES / source) as lines:
        path.write_text("".join(next(lines) for _ in range(count)))
    return path


async def test_trace_replay_serves_every_request_and_skips_arrivals_before_zero(tmp_path):
    path = trace_prefix(tmp_path, 50)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    server = SimServer(EngineParams(), speed=1e9)
    served = await replay_trace(server, TraceLoad(str(path)))
    assert served == 50 == server.engine.stats.requests
    assert server.engine.stats.prompt_tokens == sum(r["input_length"] for r in records)

    shift = -records[20]["timestamp"] / 1000 + 1e-6  # the requests at or after record 20 remain
    later = SimServer(EngineParams(), speed=1e9)
    expected = sum(1 for r in records if r["timestamp"] / 1000 + shift >= 0)
    assert await replay_trace(later, TraceLoad(str(path), time_shift=shift)) == expected < 50


async def test_trace_replay_loops_until_cancelled(tmp_path):
    import asyncio

    path = trace_prefix(tmp_path, 5)
    server = SimServer(EngineParams(), speed=1e9)
    task = asyncio.get_running_loop().create_task(replay_trace(server, TraceLoad(str(path), loop=True, salt="s")))

    def stop_in_the_third_pass(_):
        if server.engine.stats.requests == 11:
            task.cancel()  # takes effect at the replay's next await

    server.engine.listeners.append(stop_in_the_third_pass)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert server.engine.stats.requests >= 11
    assert server.pool.salts() == ["s"]


async def test_a_missing_trace_ends_the_replay_not_the_server(tmp_path):
    server = SimServer(EngineParams(), speed=1e9)
    assert await replay_trace(server, TraceLoad(str(tmp_path / "missing.jsonl"))) == 0


def test_settings_from_env_match_the_cli_options(monkeypatch, tmp_path):
    from kvtier.cli.sim import sim_serve

    trace = trace_prefix(tmp_path, 1)
    env = {
        "KVSIM_HBM_BLOCKS": "7",
        "KVSIM_BLOCK_TOKENS": "256",
        "KVSIM_PREFILL_TOKENS_PER_SECOND": "1e4",
        "KVSIM_SPEED": "4",
        "KVSIM_TRACE": str(trace),
        "KVSIM_TIME_SHIFT": "-30",
        "KVSIM_LOOP": "true",
        "KVSIM_TRACE_SALT": "conv",
    }
    params, speed, load = settings_from_env(env)
    assert params.hbm_blocks == 7 and params.block_tokens == 256 and params.prefill_tokens_per_second == 1e4
    assert params.cpu_blocks == SERVE_DEFAULTS.cpu_blocks
    assert speed == 4 and load == TraceLoad(str(trace), -30.0, True, "conv")
    assert settings_from_env({})[2] is None

    for key, text in env.items():
        monkeypatch.setenv(key, text)
    options = sim_serve.make_context("serve", []).params
    assert (options["hbm_blocks"], options["block_tokens"], options["prefill_tokens_per_second"]) == (7, 256, 1e4)
    assert (options["speed"], options["trace"], options["time_shift"], options["loop"], options["trace_salt"]) == (
        4.0,
        str(trace),
        -30.0,
        True,
        "conv",
    )
    with pytest.raises(ValueError):
        settings_from_env({"KVSIM_HBM_BLOCKS": "many"})


def test_a_server_clock_runs_speed_times_faster():
    now = [100.0]
    server = SimServer(PARAMS, speed=10, clock=lambda: now[0])
    now[0] += 1.5
    assert math.isclose(server.now(), 15.0)
    outcome = server.serve([1, 2], 8, 0)
    assert outcome.arrival == 15.0


@pytest.mark.parametrize(
    "args",
    [
        ["sim", "serve", "--quota", "a=lots"],
        ["sim", "serve", "--quota", "a=-1"],
        ["sim", "serve", "--quota", "a=inf"],
        ["sim", "serve", "--speed", "0"],
        ["probe"],
        ["probe", "--log-dir", "x", "--max-blocks", "0"],
    ],
)
def test_the_commands_refuse_bad_options_before_serving(args):
    from click.testing import CliRunner

    from kvtier.cli import main

    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
