"""The real `lmcache server` (0.5.6, CPU, 127.0.0.1), started from the arguments kvtier renders, and kvtier's own
actuator, scraper and probe pointed at it.

Only sizes and paths are scaled down: the L1 is the rendered 256 MiB, the raw-block device a sparse file with a
smaller capacity, the HTTP API on 127.0.0.1 instead of 0.0.0.0, ports the free ones the render was given.
Lookups come from LMCache's own client (`lmcache bench server --mode cpu`: KV on CPU tensors, stored, looked
up and retrieved through the server's ZMQ API as vLLM's connector does, one worker per TP rank), with a KV shape
whose bytes per token are one rank's share of the deployment's, so the rendered `slot_bytes` must hold one real
stored object (the raw-block adapter refuses, with a warning only, an object that does not fit its slot).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import generate_latest

from kvtier.api.units import GIB
from kvtier.cli.services import probe as probe_command
from kvtier.probe.options import ProbeOptions
from kvtier.probe.tail import FIELDS as LOOKUP_LOG_FIELDS
from kvtier.probe.tail import parse_lookup
from kvtier.rebalance.actuator import exit_reason, set_quota
from kvtier.render.lmcache import LOOKUP_LOG_DIR
from kvtier.render.options import RenderOptions
from kvtier.sim.lookuplog import chunk_hash
from kvtier.telemetry.engines import quota_usage, replica_snapshot
from kvtier.telemetry.exposition import parse_exposition
from kvtier.telemetry.scraper import Scraper
from kvtier.telemetry.targets import target_of
from tests.conformance import rendered

pytestmark = pytest.mark.conformance

#: LMCache's client KV shape per TP rank `(kv, blocks, block tokens, heads, head size):dtype:layers`:
#: 2 x 2 x 64 x 2 bytes x 2 layers = 1024 bytes per token and rank (the deployment's kvBytesPerToken / TP).
KV_SHAPE = "(2,64,16,2,64):float16:2"
RANK_KV_BYTES_PER_TOKEN = 1024
#: The raw-block adapter keeps its index (meta_total_bytes, 256 MiB by default) inside capacity_bytes.
CAPACITY_BYTES = 384 << 20
DEVICE_FILE_BYTES = 1 << 30
QUOTA_BYTES = GIB // 2
STARTUP_SECONDS = 180
#: How long the metrics may lag the lookups (LMCache counts them from its event bus).
SETTLE_SECONDS = 20


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scaled(argv: list[str], tmp_path: Path) -> list[str]:
    """The rendered `lmcache server` words with the device, capacity, log directory and bind address local."""
    words = list(argv)
    adapter = json.loads(rendered.flag(words, "--l2-adapter"))
    device = tmp_path / "kv-store.img"
    with device.open("wb") as file:
        file.truncate(DEVICE_FILE_BYTES)
    adapter |= {"device_path": str(device), "capacity_bytes": CAPACITY_BYTES}
    words[words.index("--l2-adapter") + 1] = json.dumps(adapter, separators=(",", ":"))
    words[words.index("--lookup-hash-log-dir") + 1] = str(tmp_path / "lookup-hashes")
    words[words.index("--http-host") + 1] = "127.0.0.1"
    return words


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def server(engines, tmp_path_factory, request):
    """The rendered replica's `lmcache server`, up and healthy; yields (case, its argv, its options, its directory)."""
    tmp_path = tmp_path_factory.mktemp("lmcache")
    options = RenderOptions(lmcache_port=free_port(), lmcache_http_port=free_port())
    tp = request.param
    spec = rendered.deployment("LMCacheMP", tp=tp, kv_bytes_per_token=RANK_KV_BYTES_PER_TOKEN * tp, cpu="256Mi")
    case = rendered.render("mp-live", spec, rendered.CSI_BLOCK, options=options)
    argv = scaled(case.lmcache_argv, tmp_path)
    log = (tmp_path / "server.log").open("w")
    process = subprocess.Popen(
        [str(engines.bin / "lmcache"), "server", *argv], stdout=log, stderr=subprocess.STDOUT, env=engines.env()
    )
    health = f"http://127.0.0.1:{options.lmcache_http_port}/healthcheck"
    deadline = time.monotonic() + STARTUP_SECONDS
    try:
        while True:
            try:
                with urllib.request.urlopen(health, timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join((tmp_path / "server.log").read_text(errors="replace").splitlines()[-30:])
                pytest.fail(f"lmcache server did not become healthy (exit {process.poll()}):\n{tail}")
            time.sleep(0.5)
        yield case, argv, options, tmp_path
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def drive_lookups(engines, case: rendered.Rendered, options: RenderOptions, requests: int = 3) -> str:
    """Store, look up and retrieve `requests` prompts through LMCache's own client on CPU tensors."""
    done = subprocess.run(
        [
            str(engines.bin / "lmcache"),
            "bench",
            "server",
            "--mode",
            "cpu",
            "--transfer-mode",
            "lmcache_driven",
            "--tp-size",
            str(case.deployment.spec.engine.tensor_parallel_size),
            "--rpc-url",
            f"tcp://localhost:{options.lmcache_port}",
            "--url",
            f"http://127.0.0.1:{options.lmcache_http_port}",
            "--start",
            "0",
            "--end",
            str(requests),
            "--interval",
            "0",
            "--num-tokens",
            "512",
            "--kvcache-shape-spec",
            KV_SHAPE,
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        env=engines.env(),
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def the_pod(case: rendered.Rendered) -> dict:
    """The rendered pod template as a Ready pod on 127.0.0.1 (what the operator's target index sees)."""
    template = case.template
    return {
        "metadata": {**template["metadata"], "name": "chat-0", "namespace": "ml"},
        "spec": template["spec"],
        "status": {"podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_the_rendered_server_starts_and_serves_its_api_on_the_declared_port(server):
    case, argv, options, _ = server
    ports = {p["name"]: p["containerPort"] for p in case.containers["lmcache"]["ports"]}
    assert (
        ports == {"lmcache-api": options.lmcache_http_port} == {"lmcache-api": int(rendered.flag(argv, "--http-port"))}
    )
    probe = case.containers["lmcache"]["readinessProbe"]["httpGet"]
    assert probe["port"] == "lmcache-api" and probe["path"] == "/healthcheck"


def test_the_actuator_sets_the_quota_and_the_quota_api_reads_it_back(server):
    _, _, options, _ = server

    async def apply():
        async with aiohttp.ClientSession() as http:
            problem = await set_quota(http, "127.0.0.1", options.lmcache_http_port, QUOTA_BYTES)
            async with http.get(f"http://127.0.0.1:{options.lmcache_http_port}/quota/_default") as reply:
                one = await reply.json()
            async with http.get(f"http://127.0.0.1:{options.lmcache_http_port}/quota") as reply:
                listed = await reply.json()
            return problem, one, listed

    problem, one, listed = asyncio.run(apply())
    assert problem is None
    assert one["exists"] is True and one["limit_gb"] == QUOTA_BYTES / GIB
    assert quota_usage(one)[0] == QUOTA_BYTES
    assert quota_usage(listed)[0] == QUOTA_BYTES, listed  # GET /quota: {"users": {"_default": {...}}}


def apply_quota(options: RenderOptions) -> str | None:
    async def apply():
        async with aiohttp.ClientSession() as http:
            return await set_quota(http, "127.0.0.1", options.lmcache_http_port, QUOTA_BYTES)

    return asyncio.run(apply())


def test_the_scraper_reads_lookup_counters_and_tier_usage_from_the_real_page(engines, server):
    case, _, options, _ = server
    assert apply_quota(options) is None  # under IsolatedLRU a salt without a quota keeps nothing in L2
    # Twice: the second pass looks up prompts the first one stored (within a pass, the warm lookup may run
    # before every rank's store has landed).
    bench = drive_lookups(engines, case, options) + drive_lookups(engines, case, options)
    target = target_of(the_pod(case))
    assert target is not None
    ports = dict(target.ports)
    assert ports["lmcache"] == ports["quota"] == options.lmcache_http_port

    async def scrape():
        """Scrape until the hits show: the server counts lookups from its event bus, a moment after answering."""
        async with Scraper(timeout=10) as scraper:
            deadline = time.monotonic() + SETTLE_SECONDS
            while True:
                scrapes = {
                    s.endpoint: s for s in await scraper.scrape_all([target]) if s.endpoint in ("lmcache", "quota")
                }
                assert scrapes["lmcache"].ok and scrapes["quota"].ok, scrapes
                snapshot = replica_snapshot(lmcache=scrapes["lmcache"].page, quota=scrapes["quota"].data)
                if snapshot.lmcache_hit or time.monotonic() > deadline:
                    return scrapes, snapshot
                await asyncio.sleep(0.5)

    scrapes, snapshot = asyncio.run(scrape())
    assert snapshot.lmcache_lookups and snapshot.lmcache_lookups > 0, snapshot.problems
    assert snapshot.lmcache_requested and snapshot.lmcache_requested > 0
    assert snapshot.lmcache_hit and snapshot.lmcache_hit > 0, (snapshot, bench[-3000:])
    assert snapshot.lmcache_hit_l1 is not None and snapshot.lmcache_hit_l2 is not None
    assert snapshot.lmcache_hit_l1 + snapshot.lmcache_hit_l2 == snapshot.lmcache_hit
    assert snapshot.cpu_used_bytes and snapshot.cpu_used_bytes > 0
    assert snapshot.storage_quota_bytes == QUOTA_BYTES and snapshot.storage_used_bytes is not None
    page = scrapes["lmcache"].page
    assert page.sum("lmcache_mp_l2_usage_bytes") > 0  # the raw-block L2 took the stored chunks
    assert not snapshot.problems, snapshot.problems


def test_the_prometheus_port_is_never_opened(server):
    """Defect 2 of issue 17: 0.5.6 accepts --prometheus-port (default 9090) but serves /metrics on --http-port."""
    _, argv, options, _ = server
    assert "--prometheus-port" not in argv
    with urllib.request.urlopen(f"http://127.0.0.1:{options.lmcache_http_port}/metrics", timeout=5) as reply:
        assert b"lmcache_mp_" in reply.read()


def test_the_probe_parses_the_real_lookup_hash_log(engines, server):
    case, _, options, tmp_path = server
    drive_lookups(engines, case, options, requests=2)
    files = sorted((tmp_path / "lookup-hashes").glob("lookup_hashes_*.jsonl"))
    assert files, "lmcache server wrote no lookup-hash log"
    lines = [line for file in files for line in file.read_bytes().splitlines() if line.strip()]
    lookups = [parse_lookup(line) for line in lines]
    assert lines and all(lookup is not None and lookup.chunk_hashes for lookup in lookups), lines[:3]
    # kvsim writes the same fields in the same order, and spells its hashes as the server does.
    record = json.loads(lines[0])
    assert tuple(record) == LOOKUP_LOG_FIELDS, record
    assert all(re.fullmatch(r"0x[0-9a-f]{64}", h) for h in record["chunk_hashes"] + [chunk_hash(2**64 - 1)])
    # The rendered sidecar's own options, pointed at the real log.
    words = case.containers["kvtier-probe"]["args"]
    assert rendered.flag(words, "--log-dir") == LOOKUP_LOG_DIR
    probe = ProbeOptions(
        **{**probe_command.make_context("probe", list(words)).params, "log_dir": str(tmp_path / "lookup-hashes")}
    ).build()
    assert probe.poll() == len(lines)
    assert probe.demand.garbage_lines == 0 and probe.demand.lookups == len(lines) - probe.demand.duplicate_lookups
    snapshot = replica_snapshot(probe=parse_exposition(generate_latest(probe.registry)))
    assert snapshot.demand_chunks is not None and snapshot.demand_chunks.count > 0


def test_an_image_without_the_raw_block_extension_is_named_by_the_operator(engines, tmp_path):
    """Defect 5 of issue 17: without `lmcache-rust-raw-block-io` the rendered server exits; the operator says why."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "lmcache_rust_raw_block_io.py").write_text("raise ImportError('not in this image')\n")
    options = RenderOptions(lmcache_port=free_port(), lmcache_http_port=free_port())
    spec = rendered.deployment("LMCacheMP", kv_bytes_per_token=RANK_KV_BYTES_PER_TOKEN, cpu="256Mi")
    case = rendered.render("mp-no-extension", spec, rendered.CSI_BLOCK, options=options)
    done = subprocess.run(
        [str(engines.bin / "lmcache"), "server", *scaled(case.lmcache_argv, tmp_path)],
        capture_output=True,
        text=True,
        timeout=STARTUP_SECONDS,
        env={**engines.env(), "PYTHONPATH": str(hidden)},
    )
    assert done.returncode != 0
    # What the kubelet keeps of the log with FallbackToLogsOnError: the last 80 lines, at most 2048 bytes.
    message = "\n".join((done.stdout + done.stderr).splitlines()[-80:])[-2048:]
    pod = {
        "metadata": {"name": "chat-0"},
        "status": {
            "containerStatuses": [
                {
                    "name": "lmcache",
                    "ready": False,
                    "lastState": {"terminated": {"exitCode": done.returncode, "message": message}},
                }
            ]
        },
    }
    reason = exit_reason(pod, "lmcache")
    assert reason is not None and "lmcache-rust-raw-block-io" in reason, message
