"""`kvtier probe`: its demand curve against an independent brute-force LRU on the real traces, and
its log tailing (rotation, restarts, partial and garbage lines) and bounded memory."""

import json
import math
import pathlib
import re

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from kvtier.probe.demand import DemandProbe, HitCurve, bucket_bounds, hit_curve, scraped_hit_curve
from kvtier.probe.service import Probe
from kvtier.probe.stackdist import stream_histogram
from kvtier.probe.tail import LogTailer
from kvtier.sim.lookuplog import LookupHashLog, Rotation
from tests.conftest import SHARED

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRACES = SHARED / "traces" / "mooncake"


def trace_requests(name, count):
    """The first `count` requests of a trace as lists of hex chunk hashes."""
    with open(TRACES / name) as lines:
        return [[f"{i:016x}" for i in json.loads(next(lines))["hash_ids"]] for _ in range(count)]


def brute_force_hits(requests, capacity):
    """A list LRU (most recent first): hits are each request's resident prefix; then its blocks
    are touched last to first and the list is cut to `capacity`."""
    stack = []
    hits = 0
    for blocks in requests:
        for block in blocks:
            if block not in stack:
                break
            hits += 1
        for block in reversed(blocks):
            if block in stack:
                stack.remove(block)
            stack.insert(0, block)
        del stack[capacity:]
    return hits


def write_log(directory, requests, rotation=Rotation(), start=1_800_000_000.0, step=1.0, ids="req"):
    """Write requests as lookup-hash log lines, one `step` second apart."""
    now = [start]
    log = LookupHashLog(directory, rotation, clock=lambda: now[0])
    for index, blocks in enumerate(requests):
        log.write(f"{ids}-{index}", "m", 512, 512 * len(blocks), blocks)
        now[0] += step
    log.close()
    return log


def make_probe(directory, max_chunks=1 << 14, **demand):
    return Probe(directory, DemandProbe(max_chunks, **demand), clock=lambda: 0.0)


def bucket_hits(probe):
    counts, total, _ = probe.demand.buckets()
    return dict(zip(probe.demand.bounds, counts)), total


@pytest.mark.parametrize(
    "trace, count", [("mooncake_conversation_trace.jsonl", 400), ("mooncake_synthetic_trace.jsonl", 250)]
)
def test_histogram_equals_brute_force_lru_on_real_traces(tmp_path, trace, count):
    requests = trace_requests(trace, count)
    write_log(tmp_path, requests)
    probe = make_probe(tmp_path)
    assert probe.poll() == count
    hits, total = bucket_hits(probe)
    assert total == sum(map(len, requests)) == probe.demand.chunks
    for capacity in (1, 4, 16, 64, 256, 1024, 4096):
        assert hits[capacity] == brute_force_hits(requests, capacity), capacity
    assert 0 < hits[16] < hits[4096] < total


def test_a_bounded_stack_is_exact_up_to_its_depth_and_never_grows_beyond(tmp_path):
    requests = trace_requests("mooncake_conversation_trace.jsonl", 300)
    write_log(tmp_path, requests)
    tailer = LogTailer(tmp_path)
    demand = DemandProbe(200)
    for line in tailer.poll():
        demand.feed(line)
        assert demand.tracked_chunks <= 200
    assert demand.tracked_chunks == 200
    assert demand.bounds == [1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64, 91, 128, 181, 200]
    counts, total, _ = demand.buckets()
    for capacity, hits in zip(demand.bounds, counts):
        assert hits == brute_force_hits(requests, capacity)
    assert total == sum(map(len, requests))
    assert len(demand.window.histogram.counts) <= 200


def test_rotation_and_deleted_files_lose_nothing_the_probe_saw(tmp_path):
    requests = trace_requests("mooncake_synthetic_trace.jsonl", 200)
    log = LookupHashLog(tmp_path, Rotation(max_bytes=4000, max_files=2), clock=lambda: 1_800_000_000.0)
    probe = make_probe(tmp_path)
    seen_files = set()
    for index, blocks in enumerate(requests):
        log.write(f"r{index}", "m", 512, 512, blocks)  # rotates at most once: the probe polls in time
        probe.poll()
        seen_files.update(probe.tailer.files)
        assert len(probe.tailer.files) <= 2  # deleted files are forgotten
    log.close()
    assert len(seen_files) > 5
    hits, total = bucket_hits(probe)
    assert probe.demand.lookups == 200 and total == sum(map(len, requests))
    for capacity in (8, 128, 2048):
        assert hits[capacity] == brute_force_hits(requests, capacity)


def test_a_restarted_probe_rebuilds_the_same_curve_from_the_retained_files(tmp_path):
    requests = trace_requests("mooncake_conversation_trace.jsonl", 200)
    write_log(tmp_path, requests[:120], Rotation(max_bytes=20000))
    first = make_probe(tmp_path)
    first.poll()
    write_log(tmp_path, requests[120:], Rotation(max_bytes=20000, max_files=0), start=1_900_000_000.0, ids="new")
    first.poll()
    restarted = make_probe(tmp_path)
    restarted.poll()
    assert bucket_hits(restarted) == bucket_hits(first)
    assert restarted.demand.lookups == first.demand.lookups == 200
    assert first.poll() == 0 and restarted.poll() == 0  # nothing is read twice


def test_partial_lines_wait_for_their_end_unless_a_newer_file_exists(tmp_path):
    line = json.dumps(
        {
            "timestamp": 1.0,
            "request_id": "a",
            "model_name": "m",
            "chunk_size": 512,
            "seq_len": 9,
            "dtypes": [],
            "shapes": [],
            "chunk_hashes": ["01", "02"],
        }
    )
    first = tmp_path / "lookup_hashes_20260101_000000_000000.jsonl"
    first.write_text(line[:20])
    probe = make_probe(tmp_path)
    assert probe.poll() == 0
    with open(first, "a") as stream:
        stream.write(line[20:] + "\n" + line.replace('"a"', '"b"')[:-1])  # the second line lacks its last byte
    assert probe.poll() == 1 and probe.demand.lookups == 1
    assert probe.poll() == 0
    (tmp_path / "lookup_hashes_20260101_000001_000001.jsonl").write_text("")
    assert probe.poll() == 1  # the tail of a rotated file is final: it is read, and fails to parse
    assert probe.demand.lookups == 1 and probe.demand.garbage_lines == 1


def test_garbage_lines_are_counted_and_skipped(tmp_path):
    good = {
        "timestamp": 5.0,
        "request_id": "ok",
        "model_name": "m",
        "chunk_size": 4,
        "seq_len": 4,
        "dtypes": [],
        "shapes": [],
        "chunk_hashes": ["aa"],
    }
    garbage = [
        b"not json",
        b"[1, 2, 3]",
        b"null",
        b"\xff\xfe\xfd",
        b'{"timestamp": 1}',
        json.dumps({**good, "timestamp": "soon"}).encode(),
        json.dumps({**good, "timestamp": True}).encode(),
        json.dumps({**good, "chunk_hashes": "aa"}).encode(),
        json.dumps({**good, "chunk_hashes": [1]}).encode(),
        json.dumps({**good, "request_id": 3}).encode(),
        b'{"timestamp": NaN, "request_id": "x", "chunk_hashes": []}',
        b"x" * 5000,  # longer than max_line_bytes: its start is yielded once, the rest skipped
    ]
    body = b"\n".join([*garbage, b"", json.dumps(good).encode()]) + b"\n"
    (tmp_path / "lookup_hashes_20260101_000000_000000.jsonl").write_bytes(body)
    (tmp_path / "other.txt").write_text("not a log file\n")
    probe = Probe(tmp_path, DemandProbe(16), clock=lambda: 0.0)
    probe.tailer.max_line_bytes = 1024
    probe.poll()
    assert probe.demand.garbage_lines == len(garbage)
    assert probe.demand.lookups == 1 and probe.demand.chunks == 1


def test_a_truncated_or_replaced_file_is_read_again_and_repeats_are_dropped(tmp_path):
    path = tmp_path / "lookup_hashes_20260101_000000_000000.jsonl"
    write_log(tmp_path, [["aa", "bb"], ["aa", "bb"]])
    [written] = LookupHashLog(tmp_path).files()[:1]
    written.rename(path)
    probe = make_probe(tmp_path)
    probe.poll()
    assert probe.demand.lookups == 2
    lines = path.read_text().splitlines()
    path.write_text(lines[0] + "\n")  # shrank: read from the start again; req-0 is a repeat
    probe.poll()
    assert probe.demand.lookups == 2 and probe.demand.duplicate_lookups == 1


def test_the_window_decays_by_the_logs_clock():
    demand = DemandProbe(64, window_seconds=10.0, tick_seconds=10.0)
    for index, timestamp in enumerate((0.0, 1.0, 10.0, 25.0)):
        demand.feed(json.dumps({"timestamp": timestamp, "request_id": f"r{index}", "chunk_hashes": ["aa"]}).encode())
    counts, total, _ = demand.buckets()
    # Weights: 1 and 1 (ticks at 10 and 20 halve them twice), then 1 (one tick), then 1.
    assert total == pytest.approx(0.25 + 0.25 + 0.5 + 1)
    assert counts[0] == pytest.approx(0.25 + 0.5 + 1)  # the last three are re-uses at distance 1
    demand.advance(45.0)
    assert demand.buckets()[1] == pytest.approx(total / 4)
    assert DemandProbe(4).window.decay == 1.0


def test_bucket_bounds():
    assert bucket_bounds(1) == [1]
    assert bucket_bounds(8) == [1, 2, 4, 8]
    assert bucket_bounds(1000)[-2:] == [512, 1000]
    assert bucket_bounds(16, 2) == [1, 2, 3, 4, 6, 8, 11, 16]
    assert bucket_bounds(64, 64) == list(range(1, 65))
    with pytest.raises(ValueError):
        bucket_bounds(0)


def test_hit_curve_from_scraped_buckets():
    curve = hit_curve([("+Inf", 10), ("4", 6), ("1", 2), ("2", 2.0)])
    assert curve.capacities == (1.0, 2.0, 4.0) and curve.hits == (2.0, 2.0, 6.0) and curve.total == 10
    assert curve.hits_at(0) == 0 and curve.hits_at(0.5) == 1 and curve.hits_at(3) == 4
    assert curve.hits_at(4) == 6 and curve.hits_at(1e9) == 6
    assert curve.hit_ratio(4) == 0.6 and hit_curve([("+Inf", 0)]).hit_ratio(5) == 0
    for bad in (
        [("1", 1)],
        [("1", 2), ("2", 1), ("+Inf", 2)],
        [("1", -1), ("+Inf", 1)],
        [("1", math.nan), ("+Inf", 1)],
        [("0", 1), ("+Inf", 1)],
        [],
    ):
        with pytest.raises(ValueError):
            hit_curve(bad)


async def test_metrics_endpoint_serves_the_curve_and_counters(tmp_path):
    requests = trace_requests("mooncake_synthetic_trace.jsonl", 150)
    write_log(tmp_path, requests)
    (tmp_path / "lookup_hashes_20990101_000000_000009.jsonl").write_text("garbage\n")
    probe = make_probe(tmp_path, max_chunks=4096, chunk_bytes=1000)
    async with TestClient(TestServer(probe.app())) as client:
        page = await (await client.get("/metrics")).text()  # a scrape reads what is new first
        assert (await client.get("/health")).status == 200
    families = {family.name: family for family in text_string_to_metric_families(page)}
    assert set(families) == {
        "kvtier_probe_stack_distance_chunks",
        "kvtier_probe_stack_distance_bytes",
        "kvtier_probe_lookups",
        "kvtier_probe_chunks",
        "kvtier_probe_garbage_lines",
        "kvtier_probe_duplicate_lookups",
        "kvtier_probe_decay_ticks",
        "kvtier_probe_tracked_chunks",
        "kvtier_probe_max_chunks",
        "kvtier_probe_chunk_bytes",
        "kvtier_probe_window_seconds",
        "kvtier_probe_tick_seconds",
        "kvtier_probe_last_lookup_timestamp_seconds",
    }
    names = {sample.name for family in families.values() for sample in family.samples}
    assert all(re.fullmatch(r"kvtier_probe_[a-z0-9_]+", name) for name in names)
    assert {"kvtier_probe_lookups_total", "kvtier_probe_garbage_lines_total"} <= names
    single = {f.name: f.samples[0].value for f in families.values() if len(f.samples) == 1}
    assert single["kvtier_probe_lookups"] == 150 and single["kvtier_probe_garbage_lines"] == 1
    assert single["kvtier_probe_chunks"] == sum(map(len, requests))
    assert single["kvtier_probe_tracked_chunks"] <= 4096

    curve = scraped_hit_curve(page)
    in_bytes = scraped_hit_curve(page, "kvtier_probe_stack_distance_bytes")
    assert curve.total == sum(map(len, requests))
    for capacity in (2, 32, 512):
        assert curve.hits_at(capacity) == brute_force_hits(requests, capacity)
        assert in_bytes.hits_at(capacity * 1000) == curve.hits_at(capacity)
    with pytest.raises(ValueError):
        scraped_hit_curve(page, "kvtier_probe_missing")


def test_the_probe_reproduces_the_trace_facts_from_a_whole_log(tmp_path):
    """shared/traces/README.md: synthetic trace, 43,924 unique blocks, LRU hit ratios."""
    with open(TRACES / "mooncake_synthetic_trace.jsonl") as lines:
        requests = [[f"{i:016x}" for i in json.loads(line)["hash_ids"]] for line in lines]
    write_log(tmp_path, requests, Rotation(max_bytes=1 << 20, max_files=0))
    probe = make_probe(tmp_path, max_chunks=1 << 16)
    probe.poll()
    counts, total, _ = probe.demand.buckets()
    assert probe.demand.tracked_chunks == 43_924 and total == 121_877
    assert counts[-1] / total == pytest.approx(0.640, abs=0.002)
    # Exact at every bound the probe exports (the README's capacities: test_sim_stackdist).
    exact = stream_histogram(requests)
    assert [exact.hits(bound) for bound in probe.demand.bounds] == counts


def test_hits_at_each_is_hits_at_of_every_capacity():
    import random

    rng = random.Random(5)
    for _ in range(200):
        bounds = sorted(rng.sample(range(1, 60), rng.randrange(0, 8)))
        hits, running = [], 0.0
        for _bound in bounds:
            running += rng.random() * 3
            hits.append(running)
        curve = HitCurve(tuple(float(b) for b in bounds), tuple(hits), running + 1)
        capacities = sorted(rng.uniform(-2, 70) for _ in range(rng.randrange(0, 30)))
        capacities += [float(b) for b in bounds]
        capacities.sort()
        assert curve.hits_at_each(capacities) == [curve.hits_at(c) for c in capacities]
