"""Replica snapshots under every name spelling, windows (resets, replicas coming and going, staleness),
quantiles, the material-change rule, and the simulator's own pages end to end."""

import math

import pytest
from prometheus_client.exposition import generate_latest

from kvtier.probe.demand import DemandProbe
from kvtier.sim.engine import EngineParams, Tier
from kvtier.sim.server import GB, SimServer
from kvtier.telemetry.engines import Buckets, Snapshot, quota_usage, replica_snapshot
from kvtier.telemetry.exposition import parse_exposition
from kvtier.telemetry.stats import (
    REQUIRED_LMCACHE_MP,
    DeploymentWindow,
    HitRatio,
    ReplicaWindow,
    Summary,
    Tolerances,
    buckets_increase,
    counter_increase,
    histogram_quantile,
    materially_changed,
    summarise,
)


def page(text):
    return parse_exposition(text)


NEW_NAMES = """\
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0"} 0.25
vllm:kv_cache_usage_perc{engine="1"} 0.75
vllm:prefix_cache_queries_total{engine="0"} 100
vllm:prefix_cache_queries_total{engine="1"} 50
vllm:prefix_cache_hits_total{engine="0"} 30
vllm:prefix_cache_hits_total{engine="1"} 10
vllm:num_preemptions_total{engine="0"} 2
vllm:prompt_tokens_total{engine="0"} 150
"""
OLD_NAMES = """\
vllm:gpu_cache_usage_perc{engine="0"} 0.25
vllm:gpu_cache_usage_perc{engine="1"} 0.75
vllm:gpu_prefix_cache_queries{engine="0"} 100
vllm:gpu_prefix_cache_queries{engine="1"} 50
vllm:gpu_prefix_cache_hits{engine="0"} 30
vllm:gpu_prefix_cache_hits{engine="1"} 10
vllm:num_preemptions{engine="0"} 2
vllm:prompt_tokens{engine="0"} 150
"""


@pytest.mark.parametrize("text", [NEW_NAMES, OLD_NAMES], ids=["new names", "old names without _total"])
def test_old_and_new_vllm_names_give_the_same_snapshot(text):
    snapshot = replica_snapshot(page(text))
    assert snapshot.hbm_watermark == 0.5  # mean over the engines
    assert (snapshot.prefix_cache_queries, snapshot.prefix_cache_hits) == (150, 40)  # summed over engines
    assert snapshot.preemptions == 2 and snapshot.prompt_tokens == 150
    assert snapshot.external_hits is None and snapshot.ttft is None and snapshot.lmcache_hit_l1 is None


def test_missing_series_are_none_and_declared_empty_counters_are_zero():
    snapshot = replica_snapshot(
        page("# TYPE lmcache_mp_lookup_hit_l1_tokens_total counter\nvllm:kv_cache_usage_perc 0\n"), lmcache=page("")
    )
    assert snapshot.lmcache_hit_l1 == 0.0
    assert snapshot.lmcache_hit_l2 is None and snapshot.prefix_cache_hits is None and snapshot.prompt_tokens is None
    assert snapshot.hbm_watermark == 0.0


def test_invalid_values_are_none_with_a_reason():
    snapshot = replica_snapshot(
        page(
            'vllm:prefix_cache_hits_total -3\nvllm:kv_cache_usage_perc NaN\nvllm:prompt_tokens_total{engine="0"} NaN\n'
        )
    )
    assert (snapshot.prefix_cache_hits, snapshot.hbm_watermark, snapshot.prompt_tokens) == (None, None, None)
    assert len(snapshot.problems) == 3


def test_lmcache_mp_counters_summed_over_salts_and_classic_names():
    mp = page(
        'lmcache_mp_lookup_requested_tokens_total{cache_salt="",model_name="m"} 10\n'
        'lmcache_mp_lookup_requested_tokens_total{cache_salt="t1",model_name="m"} 20\n'
        'lmcache_mp_lookup_hit_l1_tokens{cache_salt="t1"} 4\nlmcache_mp_lookup_hit_l2_tokens{cache_salt="t1"} 6\n'
    )
    snapshot = replica_snapshot(lmcache=mp)
    assert (snapshot.lmcache_requested, snapshot.lmcache_hit_l1, snapshot.lmcache_hit_l2) == (30, 4, 6)
    classic = page(
        'lmcache:num_requested_tokens_total{worker_id="0"} 8\nlmcache:num_hit_tokens_total'
        '{worker_id="0"} 5\nlmcache:local_cache_usage{worker_id="0"} 1024\n'
        'lmcache:local_cache_usage{worker_id="1"} 2048\nlmcache:local_storage_usage 4096\n'
    )
    snapshot = replica_snapshot(vllm=classic)  # in-process LMCache serves from vLLM's page
    assert (snapshot.lmcache_requested, snapshot.lmcache_hit, snapshot.cpu_used_bytes) == (8, 5, 3072)
    assert snapshot.storage_used_bytes == 4096


def test_prompt_tokens_fall_back_to_the_sum_by_source():
    snapshot = replica_snapshot(
        page(
            'vllm:prompt_tokens_by_source_total{source="local_compute"} 5\n'
            'vllm:prompt_tokens_by_source_total{source="local_cache_hit"} 7\n'
        )
    )
    assert snapshot.prompt_tokens == 12
    assert snapshot.prompt_tokens_by_source == {"local_compute": 5, "local_cache_hit": 7}


TTFT = """\
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1"} 1
vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0"} 3
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf"} 4
vllm:time_to_first_token_seconds_sum{engine="0"} 5
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1"} 2
vllm:time_to_first_token_seconds_bucket{engine="1",le="1.0"} 2
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf"} 2
vllm:time_to_first_token_seconds_sum{engine="1"} 0.1
"""


def test_histograms_are_summed_over_engines_and_checked():
    ttft = replica_snapshot(page(TTFT)).ttft
    assert ttft.pairs == ((0.1, 3), (1.0, 5), (math.inf, 6)) and ttft.sum == 5.1
    no_inf = replica_snapshot(page(TTFT.replace('le="+Inf"', 'le="10"')))
    assert no_inf.ttft is None and "+Inf" in no_inf.problems[0]
    falling = replica_snapshot(
        page(
            'vllm:time_to_first_token_seconds_bucket{le="1"} 5\nvllm:time_to_first_token_seconds_bucket{le="+Inf"} 4\n'
        )
    )
    assert falling.ttft is None
    mixed = replica_snapshot(page(TTFT.replace('engine="1",le="1.0"', 'engine="1",le="2.0"')))
    assert mixed.ttft is None


def test_quota_api_answers():
    one = {"cache_salt": "_default", "limit_gb": 2.0, "current_usage_gb": 0.5, "exists": True}
    assert quota_usage(one) == (2 * GB, 0.5 * GB)
    assert quota_usage({**one, "exists": False}) == (None, 0.5 * GB)  # a salt without a quota
    # GET /quota as LMCache 0.5.6 answers it: an object keyed by salt (only salts with a quota)
    listed = {
        "users": {
            "_default": {"limit_gb": 2.0, "current_usage_gb": 0.5},
            "t": {"limit_gb": 1.0, "current_usage_gb": 0.25},
        }
    }
    assert quota_usage(listed) == (3 * GB, 0.75 * GB)
    for broken in (
        {"users": "x"},
        {"limit_gb": "2"},
        {"users": {"a": 1}},
        {"limit_gb": -1, "current_usage_gb": 0},
        [],
        {"users": {}},
        {"users": [{"limit_gb": 1, "current_usage_gb": 0}]},
    ):
        assert quota_usage(broken) == (None, None)


def test_counter_increase_counts_restarts_from_zero_and_bridges_gaps():
    assert counter_increase([10, 15, None, 20]) == 10
    assert counter_increase([10, 15, 3, 8]) == 5 + 3 + 5
    assert counter_increase([5]) is None
    assert counter_increase([None, 4, None]) is None


def test_buckets_increase_and_restart():
    def histogram(*counts):
        return Buckets(tuple(zip((1.0, math.inf), counts)))

    assert buckets_increase([histogram(1, 2), histogram(3, 5)]).pairs == ((1.0, 2), (math.inf, 3))
    assert buckets_increase([histogram(3, 5), histogram(1, 1)]).pairs == ((1.0, 1), (math.inf, 1))
    assert buckets_increase([Buckets(()), histogram(2, 2)]).pairs == ((1.0, 2), (math.inf, 2))
    assert buckets_increase([histogram(1, 1)]) is None


@pytest.mark.parametrize(
    ("quantile", "expected"),
    [
        (0.5, 0.55),  # rank 5 of 10: bucket (0.1, 1.0] holds counts 1..9 -> 0.1 + 0.9 * 4/8
        (0.05, 0.05),  # inside the first bucket, from 0
        (0.95, 1.0),  # rank 9.5 falls in +Inf: the highest finite bound
        (0.9, 1.0),
        (0.0, 0.0),
    ],
)
def test_histogram_quantile_like_promql(quantile, expected):
    buckets = Buckets(((0.1, 1.0), (1.0, 9.0), (math.inf, 10.0)))
    assert histogram_quantile(quantile, buckets) == pytest.approx(expected)


def test_histogram_quantile_of_nothing_is_none():
    assert histogram_quantile(0.5, Buckets(((0.1, 0.0), (math.inf, 0.0)))) is None
    assert histogram_quantile(0.5, None) is None


def snapshot(prompt, hbm, l1, l2, watermark=0.5, external=None, **more):
    return Snapshot(
        hbm_watermark=watermark,
        prompt_tokens=prompt,
        prefix_cache_queries=prompt,
        prefix_cache_hits=hbm,
        lmcache_hit_l1=l1,
        lmcache_hit_l2=l2,
        external_hits=l1 + l2 if external is None else external,
        **more,
    )


def test_window_with_a_restart_and_two_replicas():
    window = DeploymentWindow(window_seconds=60, stale_seconds=30, required=REQUIRED_LMCACHE_MP)
    # Replica a: +1000 prompt, +200 HBM, +100 external (L1 +100), then a restart: +500, +50, +120 (L1 +50, L2 +50).
    window.add("a", 0, snapshot(1000, 100, 100, 100, watermark=0.2, external=200))
    window.add("a", 10, snapshot(2000, 300, 200, 100, watermark=0.4, external=300))
    window.add("a", 20, snapshot(500, 50, 50, 50, watermark=0.6, external=120))
    # Replica b: +500 prompt, +250 external, all from L2.
    window.add("b", 5, snapshot(0, 0, 0, 0, watermark=0.9))
    window.add("b", 15, snapshot(500, 0, 0, 250, watermark=0.9))
    summary = window.summary(now=20)
    prompt = 1000 + 500 + 500
    assert summary.replicas == 2 and summary.stale is None
    # a's 220 external tokens split 150:50 (L1:L2) -> 165 CPU, 55 storage.
    assert summary.hit_ratio == HitRatio(
        hbm=pytest.approx(250 / prompt),
        cpu=pytest.approx(165 / prompt),
        storage=pytest.approx(305 / prompt),
        total=pytest.approx(720 / prompt),
    )
    assert summary.hbm_watermark_mean == pytest.approx((0.4 + 0.9) / 2) and summary.hbm_watermark_max == 0.9
    assert summary.prompt_tokens_per_second == pytest.approx(1500 / 20 + 500 / 10)


def test_external_hits_split_in_lmcache_proportions():
    """vLLM loaded 60 tokens; LMCache counted 100 hits, 3 in 4 from L2: storage gets 45."""
    window = DeploymentWindow(60, 30)
    window.add("a", 0, snapshot(0, 0, 0, 0, external=0))
    window.add("a", 10, snapshot(200, 20, 25, 75, external=60))
    ratio = window.summary(10).hit_ratio
    assert (ratio.hbm, ratio.cpu, ratio.storage, ratio.total) == (0.1, 15 / 200, 45 / 200, 80 / 200)


def test_no_prompt_tokens_means_no_ratio_not_zero():
    window = DeploymentWindow(60, 30)
    window.add("a", 0, snapshot(100, 10, 0, 0))
    assert window.summary(0).hit_ratio == HitRatio()  # one sample: no increase yet
    window.add("a", 10, snapshot(100, 10, 0, 0))
    assert window.summary(10).hit_ratio == HitRatio()


def test_samples_leave_the_window_and_the_baseline_stays():
    window = DeploymentWindow(window_seconds=30, stale_seconds=100)
    for time, prompt in ((0, 0), (10, 100), (20, 200), (30, 300), (40, 400), (50, 500)):
        window.add("a", time, snapshot(prompt, prompt // 2, 0, 0, watermark=time / 100))
    summary = window.summary(50)
    assert summary.prompt_tokens_per_second == pytest.approx(10)  # baseline t=20 to t=50
    assert summary.hbm_watermark_mean == pytest.approx(0.4)  # samples at 30, 40, 50
    assert summary.hit_ratio.hbm == 0.5


def test_staleness_reasons():
    window = DeploymentWindow(window_seconds=120, stale_seconds=30, required=REQUIRED_LMCACHE_MP)
    window.add("a", 0, snapshot(0, 0, 0, 0))
    window.add("b", 0, Snapshot(hbm_watermark=0.1, prompt_tokens=5, prefix_cache_hits=1))
    summary = window.summary(10, replicas=["a", "b", "c"])
    assert summary.stale == (
        "replica b: not served: lmcache_mp_lookup_hit_l1_tokens, lmcache_mp_lookup_hit_l2_tokens; "
        "replica c: no sample in the window"
    )
    assert window.summary(31, replicas=["a"]).stale.startswith("replica a: no sample in the last 30 s")
    assert DeploymentWindow(60, 30).summary(0).stale == "no replica has reported metrics"


def test_replicas_come_and_go():
    window = DeploymentWindow(window_seconds=60, stale_seconds=20)
    window.add("old", 0, snapshot(0, 0, 0, 0))
    window.add("old", 10, snapshot(100, 100, 0, 0))
    window.add("new", 50, snapshot(0, 0, 0, 0))
    window.add("new", 60, snapshot(100, 0, 0, 0))
    summary = window.summary(60, replicas=["new"])
    assert summary.replicas == 2 and summary.hit_ratio.hbm == 0.5  # old's increases still count
    assert summary.stale == "replica old: no sample in the last 20 s"
    assert window.summary(200).replicas == 0
    assert window.replica_ids == []  # long-gone replicas are forgotten
    window.add("x", 0, snapshot(0, 0, 0, 0))
    window.remove("x")
    assert window.replica_ids == []


def test_ttft_preemptions_storage_and_demand():
    def replica(time, ttft_counts, preemptions, demand_counts):
        return Snapshot(
            hbm_watermark=0.1,
            prompt_tokens=1,
            prefix_cache_hits=0,
            preemptions=preemptions,
            ttft=Buckets(tuple(zip((0.1, 1.0, math.inf), ttft_counts))),
            storage_quota_bytes=GB if time else 2 * GB,
            storage_used_bytes=time * 1000,
            demand_bytes=Buckets(tuple(zip((10.0, 20.0, math.inf), demand_counts))),
        )

    window = DeploymentWindow(60, 30)
    window.add("a", 0, replica(0, (0, 0, 0), 0, (1, 2, 4)))
    window.add("a", 10, replica(10, (4, 8, 10), 5, (2, 3, 4)))
    window.add("b", 0, replica(0, (0, 0, 0), 0, (1, 2, 4)))
    window.add("b", 20, replica(20, (0, 2, 2), 0, (6, 7, 8)))
    summary = window.summary(20)
    # Buckets summed over replicas: (0.1: 4, 1.0: 10, +Inf: 12); p50 rank 6 -> 0.1 + 0.9 * 2/6.
    assert summary.ttft_p50_seconds == pytest.approx(0.4)
    assert summary.ttft_p99_seconds == 1.0
    assert summary.preemptions_per_second == pytest.approx(0.5)
    assert summary.storage_quota_bytes == GB and summary.storage_used_bytes == 30_000
    assert summary.demand_unit == "bytes"
    assert summary.demand.capacities == (10.0, 20.0) and summary.demand.hits == (8, 10) and summary.demand.total == 12


def test_material_change():
    base = Summary(
        replicas=2,
        hbm_watermark_mean=0.5,
        hit_ratio=HitRatio(0.5, 0.1, 0.1, 0.7),
        ttft_p50_seconds=1.0,
        storage_quota_bytes=GB,
    )
    assert materially_changed(None, base)
    assert not materially_changed(base, base)
    assert not materially_changed(base, Summary(**{**base.__dict__, "hbm_watermark_mean": 0.505}))
    assert materially_changed(base, Summary(**{**base.__dict__, "hbm_watermark_mean": 0.52}))
    assert not materially_changed(base, Summary(**{**base.__dict__, "ttft_p50_seconds": 1.04}))
    assert materially_changed(base, Summary(**{**base.__dict__, "ttft_p50_seconds": 1.2}))
    assert materially_changed(base, Summary(**{**base.__dict__, "hit_ratio": HitRatio(0.5, 0.1, 0.1, None)}))
    assert materially_changed(base, Summary(**{**base.__dict__, "hit_ratio": HitRatio(0.5, 0.1, 0.13, 0.7)}))
    assert materially_changed(base, Summary(**{**base.__dict__, "storage_quota_bytes": GB + 1}))
    assert materially_changed(base, Summary(**{**base.__dict__, "stale": "replica a: no sample in the last 30 s"}))
    assert not materially_changed(base, Summary(**{**base.__dict__, "ttft_p50_seconds": 1.2}), Tolerances(relative=0.5))


def test_summarise_ignores_replicas_without_a_denominator():
    windows = {
        "a": ReplicaWindow(seconds=10, increases={"prompt_tokens": 100, "prefix_cache_hits": 50}),
        "b": ReplicaWindow(seconds=10, increases={"prefix_cache_hits": 999}),
    }
    assert summarise(windows).hit_ratio.hbm == 0.5


# The simulator's own pages, end to end.

PARAMS = EngineParams(block_tokens=4, kv_bytes_per_token=1 << 18, hbm_blocks=4, cpu_blocks=8)


def sim_snapshot(server, probe=None):
    probe_page = parse_exposition(generate_latest(probe)) if probe is not None else None
    return replica_snapshot(
        parse_exposition(generate_latest(server.vllm_registry)),
        parse_exposition(generate_latest(server.mp_registry)),
        probe_page,
        quota={
            "users": {server.quota_entry(salt)["cache_salt"]: server.quota_entry(salt) for salt in server.quota_salts()}
        },
    )


def test_simulated_replicas_end_to_end():
    """Two simulated replicas, tenants with salts; hit ratios recomputed from the engines' outcomes."""
    servers = {"a": SimServer(PARAMS, model="m"), "b": SimServer(PARAMS, model="m")}
    for server in servers.values():
        server.set_quota("", 0.01)
        server.set_quota("t", 0.005)
    window = DeploymentWindow(window_seconds=600, stale_seconds=60, required=REQUIRED_LMCACHE_MP)
    for uid, server in servers.items():
        window.add(uid, 0, sim_snapshot(server))
    totals = {tier: 0 for tier in Tier}
    prompt = 0
    for index in range(120):
        uid = "ab"[index % 2]
        salt = "t" if index % 3 == 0 else ""
        blocks = list(range(index % 7, index % 7 + 5 + index % 4))
        outcome = servers[uid].serve(blocks, len(blocks) * PARAMS.block_tokens, 8, salt)
        prompt += outcome.input_tokens
        for tier in Tier:
            totals[tier] += outcome.hit_tokens[tier]
    for uid, server in servers.items():
        window.add(uid, 30, sim_snapshot(server))
    summary = window.summary(30)
    assert summary.stale is None and summary.replicas == 2
    assert totals[Tier.CPU] > 0 and totals[Tier.STORAGE] > 0 and totals[Tier.HBM] > 0
    assert summary.hit_ratio.hbm == pytest.approx(totals[Tier.HBM] / prompt)
    assert summary.hit_ratio.cpu == pytest.approx(totals[Tier.CPU] / prompt)
    assert summary.hit_ratio.storage == pytest.approx(totals[Tier.STORAGE] / prompt)
    assert summary.hit_ratio.total == pytest.approx(sum(totals.values()) / prompt)
    assert summary.storage_quota_bytes == pytest.approx(0.015 * GB)
    used = sum(server.pool.usage(salt) for server in servers.values() for salt in ("", "t")) * PARAMS.block_bytes
    assert summary.storage_used_bytes == pytest.approx(used)
    assert summary.ttft_p50_seconds is not None and 0 < summary.ttft_p50_seconds <= summary.ttft_p99_seconds


def test_probe_page_becomes_the_demand_curve():
    probe = DemandProbe(max_chunks=8, chunk_bytes=100)
    for index, hashes in enumerate((["a", "b"], ["a", "b"], ["a", "c"])):
        probe.feed(
            (
                '{"timestamp": %d, "request_id": "r%d", "model_name": "m", "chunk_size": 4, "seq_len": 8, '
                '"dtypes": [], "shapes": [], "chunk_hashes": %s}' % (index, index, str(hashes).replace("'", '"'))
            ).encode()
        )
    snapshot = replica_snapshot(probe=parse_exposition(generate_latest(_registry(probe))))
    counts, total, _ = probe.buckets()
    assert snapshot.demand_chunks.pairs == (*zip(map(float, probe.bounds), counts), (math.inf, total))
    assert snapshot.demand_bytes.bounds == (*(100.0 * bound for bound in probe.bounds), math.inf)
    assert snapshot.demand_last_lookup == 2


def test_only_the_newest_sample_keeps_the_probes_histograms_and_the_summary_still_has_them():
    window = DeploymentWindow(window_seconds=60, stale_seconds=30)
    curves = [Buckets(((1.0, float(n)), (4.0, 2.0 * n), (math.inf, 4.0 * n))) for n in (1, 2, 3)]
    for time, curve in zip((0.0, 15.0, 30.0), curves):
        window.add("chat-0", time, snapshot(100 * time, 0, 0, 0, demand_chunks=curve, demand_bytes=curve))
    # Held samples (the memory this saves): older ones carry counters only.
    held = [sample for _, sample in window._replicas["chat-0"]]
    assert [sample.demand_chunks for sample in held] == [None, None, curves[2]]
    assert [sample.prompt_tokens for sample in held] == [0.0, 1500.0, 3000.0]
    summary = window.summary(31.0)
    assert summary.demand is not None and summary.prompt_tokens_per_second == pytest.approx(100.0)


def _registry(collector):
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def test_the_scraper_reads_every_series_a_snapshot_asks_for_and_a_filtered_page_gives_the_same_snapshot(
    monkeypatch,
):
    """SERIES_READ (what the scraper parses) must name every series the snapshot reads, or a field goes missing."""
    from kvtier.telemetry import engines

    asked: set[str] = set()
    samples = engines._Reader.samples

    def recording_samples(self, names):
        names = list(names)
        asked.update(names)
        return samples(self, names)

    monkeypatch.setattr(engines._Reader, "samples", recording_samples)
    engines.replica_snapshot(parse_exposition(""), parse_exposition(""), parse_exposition(""))
    assert asked and asked <= engines.SERIES_READ, sorted(asked - engines.SERIES_READ)

    server = SimServer(PARAMS, model="m")
    server.set_quota("", 0.01)
    for index in range(30):
        server.serve(list(range(index % 5, index % 5 + 4)), 16, 4)
    probe = DemandProbe(max_chunks=8, chunk_bytes=100)
    probe.feed(
        b'{"timestamp": 1, "request_id": "r", "model_name": "m", "chunk_size": 4, "seq_len": 8, '
        b'"dtypes": [], "shapes": [], "chunk_hashes": ["a", "b"]}'
    )
    bodies = [
        generate_latest(server.vllm_registry),
        generate_latest(server.mp_registry),
        generate_latest(_registry(probe)),
    ]
    whole = replica_snapshot(*(parse_exposition(body) for body in bodies))
    filtered_pages = [parse_exposition(body, names=engines.SERIES_READ) for body in bodies]
    assert replica_snapshot(*filtered_pages) == whole
    assert whole.ttft is not None and whole.demand_chunks is not None and whole.lmcache_hit is not None
    assert sum(page.series for page in filtered_pages) < sum(parse_exposition(body).series for body in bodies)
