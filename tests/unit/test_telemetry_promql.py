"""The Prometheus path: the queries, the /api/v1/query answers, and summaries that match scraping's."""

import json
import math

import pytest

from kvtier.sim.server import GB
from kvtier.telemetry.promql import deployment_queries, parse_vector, summary_from_results
from kvtier.telemetry.stats import REQUIRED_LMCACHE_MP, HitRatio

SELECTOR = 'namespace="ns",pod=~"m-[0-9]+"'


def vector(*samples):
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": labels, "value": [1700000000.0, value]} for labels, value in samples],
        },
    }


def per_pod(**values):
    return vector(*(({"pod": pod}, str(value)) for pod, value in values.items()))


def test_queries_use_total_suffixes_old_names_and_the_window():
    queries = deployment_queries(SELECTOR, 300)
    assert queries["prefix_cache_hits"] == (
        f"sum by (pod) (increase(vllm:prefix_cache_hits_total{{{SELECTOR}}}[300s])) or "
        f"sum by (pod) (increase(vllm:gpu_prefix_cache_hits_total{{{SELECTOR}}}[300s]))"
    )
    assert queries["ttft_p99_seconds"] == (
        f"histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{{{SELECTOR}}}[300s])))"
    )
    assert (
        "vllm:gpu_cache_usage_perc" in queries["hbm_watermark_max"] and "max_over_time" in queries["hbm_watermark_max"]
    )
    assert "lmcache_mp_lookup_hit_l2_tokens_total" in queries["lmcache_hit_l2"]
    assert queries["demand_bytes"] == f"sum by (pod, le) (kvtier_probe_stack_distance_bytes_bucket{{{SELECTOR}}})"


@pytest.mark.parametrize(
    ("body", "samples", "error"),
    [
        (vector(({"pod": "a"}, "1.5"), ({"pod": "b"}, "NaN")), [({"pod": "a"}, 1.5), ({"pod": "b"}, math.nan)], None),
        (json.dumps(vector(({}, "+Inf"))).encode(), [({}, math.inf)], None),
        ({"status": "success", "data": {"resultType": "scalar", "result": [1.0, "2"]}}, [({}, 2.0)], None),
        (
            {"status": "error", "errorType": "bad_data", "error": "parse error"},
            [],
            "query failed: bad_data: parse error",
        ),
        ({"status": "success", "data": {"resultType": "matrix", "result": []}}, [], "not an instant vector: 'matrix'"),
        (b"<html>502</html>", [], "unreadable answer"),
        (b"[1, 2]", [], "answer is not a JSON object"),
        (vector(({"pod": "a"}, 3)), [], "malformed vector element"),  # a number where a string belongs
        (
            {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1]}]}},
            [],
            "malformed vector element",
        ),
        (None, [], "answer is not a JSON object"),
    ],
)
def test_parse_vector(body, samples, error):
    got, reason = parse_vector(body)
    assert [(labels, repr(value)) for labels, value in got] == [(labels, repr(value)) for labels, value in samples]
    assert (reason or "").startswith(error or "") and (reason is None) == (error is None)


def answers():
    return {
        "prompt_tokens": per_pod(**{"m-0": 1000, "m-1": 500}),
        "prefix_cache_hits": per_pod(**{"m-0": 200, "m-1": 50}),
        "external_hits": per_pod(**{"m-0": 300, "m-1": 100}),
        "lmcache_hit_l1": per_pod(**{"m-0": 100, "m-1": 0}),
        "lmcache_hit_l2": per_pod(**{"m-0": 300, "m-1": 100}),
        "preemptions": per_pod(**{"m-0": 30, "m-1": 0}),
        "hbm_watermark": per_pod(**{"m-0": 0.5, "m-1": 0.7}),
        "hbm_watermark_mean": per_pod(**{"m-0": 0.4, "m-1": 0.6}),
        "hbm_watermark_max": per_pod(**{"m-0": 0.9, "m-1": 0.8}),
        "ttft_p50_seconds": vector(({}, "0.25")),
        "ttft_p99_seconds": vector(({}, "2")),
        "demand_chunks": vector(
            *(
                ({"pod": pod, "le": le}, str(value))
                for pod in ("m-0", "m-1")
                for le, value in (("1", 1), ("2", 3), ("+Inf", 5))
            )
        ),
        "demand_bytes": vector(),
        "storage_used_bytes": vector(),
    }


def test_summary_from_results():
    quotas = {pod: {"limit_gb": 1.0, "current_usage_gb": 0.5, "exists": True} for pod in ("m-0", "m-1")}
    summary = summary_from_results(answers(), 300, required=REQUIRED_LMCACHE_MP, quotas=quotas)
    assert summary.stale is None and summary.replicas == 2
    # m-0: 300 external split 1:3 -> 75 CPU, 225 storage; m-1: 100 external all L2.
    assert summary.hit_ratio == HitRatio(hbm=250 / 1500, cpu=75 / 1500, storage=325 / 1500, total=650 / 1500)
    assert summary.hbm_watermark_mean == pytest.approx(0.5) and summary.hbm_watermark_max == 0.9
    assert summary.preemptions_per_second == pytest.approx(0.1)
    assert (summary.ttft_p50_seconds, summary.ttft_p99_seconds) == (0.25, 2.0)
    assert summary.storage_quota_bytes == GB and summary.storage_used_bytes == GB
    assert summary.demand_unit == "chunks" and summary.demand.hits == (2, 6) and summary.demand.total == 10


def test_missing_pods_series_and_failed_queries_make_it_stale():
    results = answers()
    results["hbm_watermark"] = per_pod(**{"m-0": 0.5})  # m-1 has no fresh sample
    results["lmcache_hit_l1"] = per_pod(**{"m-1": 0})
    summary = summary_from_results(results, 300, required=REQUIRED_LMCACHE_MP, expected=["m-0", "m-1", "m-2"])
    assert summary.stale == (
        "replica m-0: not served: lmcache_mp_lookup_hit_l1_tokens; replica m-1: no fresh sample; "
        "replica m-2: no sample in the window"
    )
    results = answers()
    results["ttft_p50_seconds"] = {"status": "error", "errorType": "timeout", "error": "query timed out"}
    summary = summary_from_results(results, 300)
    assert summary.ttft_p50_seconds is None
    assert summary.stale == "ttft_p50_seconds: query failed: timeout: query timed out"


def test_no_answers_at_all():
    summary = summary_from_results({}, 300)
    assert summary.replicas == 0 and summary.stale == "no replica has reported metrics"
    assert summary.hit_ratio == HitRatio() and summary.ttft_p50_seconds is None
