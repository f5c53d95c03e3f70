"""``--metrics-source prometheus``: the same per-deployment statistics, from a Prometheus server.

``deployment_queries(selector, window_seconds) -> dict[str, str]`` gives one instant query per
name (run each against ``/api/v1/query``); ``summary_from_results(results, window_seconds, ...)``
turns the answers (query name -> JSON body, bytes or decoded) into a
:class:`~kvtier.telemetry.stats.Summary` through the same
:func:`~kvtier.telemetry.stats.summarise` as scraping, replicas keyed by the ``pod`` label.

``selector`` is the label matcher list that picks the deployment's pods, e.g.
``namespace="ns",pod=~"name-[0-9]+"``. On a Prometheus server counters end in ``_total``;
each query tries vLLM's new name then its old one with ``or`` (per pod, so a mixed fleet
works). Counters are ``increase()`` over the window (so a replica's increases span the whole
window: Prometheus extrapolates), the watermark is ``avg_over_time`` / ``max_over_time``, TTFT
is ``histogram_quantile`` over the summed bucket rates, and the probe's histograms and LMCache's
usage gauge are instant values. A pod missing from the instant watermark query has no fresh
sample (Prometheus marks a failed target's series stale). Nothing here does I/O.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from kvtier.probe.demand import STACK_DISTANCE_BYTES, STACK_DISTANCE_CHUNKS
from kvtier.telemetry import engines
from kvtier.telemetry.engines import Buckets, quota_usage
from kvtier.telemetry.stats import REQUIRED_VLLM, ReplicaWindow, Summary, summarise

#: The label that names a replica in Prometheus' series.
POD = "pod"

_COUNTER_QUERIES = {
    "prompt_tokens": (engines.PROMPT_TOKENS, engines.PROMPT_TOKENS_BY_SOURCE),
    "prefix_cache_queries": (engines.PREFIX_QUERIES,),
    "prefix_cache_hits": (engines.PREFIX_HITS,),
    "external_queries": (engines.EXTERNAL_QUERIES,),
    "external_hits": (engines.EXTERNAL_HITS,),
    "preemptions": (engines.PREEMPTIONS,),
    "lmcache_requested": (engines.LMCACHE_REQUESTED,),
    "lmcache_hit": (engines.LMCACHE_HIT,),
    "lmcache_hit_l1": (engines.LMCACHE_HIT_L1,),
    "lmcache_hit_l2": (engines.LMCACHE_HIT_L2,),
}
_QUANTILES = {"ttft_p50_seconds": 0.5, "ttft_p99_seconds": 0.99}
#: Required snapshot fields -> the query that serves them here.
_REQUIRED_QUERY = {"hbm_watermark": "hbm_watermark", **{name: name for name in _COUNTER_QUERIES}}


def _either(expressions: Iterable[str]) -> str:
    return " or ".join(expressions)


def deployment_queries(selector: str, window_seconds: float) -> dict[str, str]:
    """Query name -> PromQL for the pods ``selector`` matches, over ``window_seconds``."""
    window = f"[{max(1, round(window_seconds))}s]"
    by_pod = f"sum by ({POD})"
    queries = {
        name: _either(
            f"{by_pod} (increase({metric}_total{{{selector}}}{window}))" for names in families for metric in names
        )
        for name, families in _COUNTER_QUERIES.items()
    }
    queries["hbm_watermark"] = _either(f"avg by ({POD}) ({metric}{{{selector}}})" for metric in engines.WATERMARK)
    queries["hbm_watermark_mean"] = _either(
        f"avg by ({POD}) (avg_over_time({metric}{{{selector}}}{window}))" for metric in engines.WATERMARK
    )
    queries["hbm_watermark_max"] = _either(
        f"max by ({POD}) (max_over_time({metric}{{{selector}}}{window}))" for metric in engines.WATERMARK
    )
    queries["storage_used_bytes"] = f"{by_pod} ({engines.STORAGE_USED[0]}{{{selector}}})"
    for name, metric in (("demand_bytes", STACK_DISTANCE_BYTES), ("demand_chunks", STACK_DISTANCE_CHUNKS)):
        queries[name] = f"sum by ({POD}, le) ({metric}_bucket{{{selector}}})"
    for name, quantile in _QUANTILES.items():
        queries[name] = _either(
            f"histogram_quantile({quantile}, sum by (le) (rate({metric}_bucket{{{selector}}}{window})))"
            for metric in engines.TTFT
        )
    return queries


def parse_vector(body: Any) -> tuple[list[tuple[dict[str, str], float]], str | None]:
    """``([(labels, value), ...], error)`` of one ``/api/v1/query`` answer; never raises.

    ``body`` is the response body (bytes or str) or its decoded JSON. A scalar answer is one
    sample without labels; an error, a matrix or a malformed answer gives no samples and a reason.
    """
    try:
        if isinstance(body, (bytes, bytearray, str)):
            body = json.loads(body)
        if not isinstance(body, Mapping):
            return [], "answer is not a JSON object"
        if body.get("status") != "success":
            return [], f"query failed: {body.get('errorType', 'error')}: {body.get('error', 'no reason given')}"
        data = body.get("data")
        kind = data.get("resultType") if isinstance(data, Mapping) else None
        result = data.get("result") if isinstance(data, Mapping) else None
        if kind == "scalar":
            value = _value(result)
            return ([({}, value)], None) if value is not None else ([], "malformed scalar")
        if kind != "vector" or not isinstance(result, list):
            return [], f"not an instant vector: {kind!r}"
        samples = []
        for item in result:
            if not isinstance(item, Mapping):
                return [], "malformed vector element"
            labels, value = item.get("metric", {}), _value(item.get("value"))
            if not isinstance(labels, Mapping) or value is None:
                return [], "malformed vector element"
            samples.append(({str(key): str(label) for key, label in labels.items()}, value))
        return samples, None
    except (ValueError, TypeError, AttributeError, RecursionError) as error:
        return [], f"unreadable answer: {error}"


def _value(pair: Any) -> float | None:
    """The value of a ``[time, "value"]`` pair (Prometheus writes values as strings)."""
    if not isinstance(pair, Sequence) or isinstance(pair, str) or len(pair) != 2 or not isinstance(pair[1], str):
        return None
    try:
        return float(pair[1])
    except ValueError:
        return None


def _by_pod(samples: list[tuple[dict[str, str], float]]) -> dict[str, float]:
    values: dict[str, float] = {}
    for labels, value in samples:
        pod = labels.get(POD)
        if pod is not None and math.isfinite(value):
            values[pod] = values.get(pod, 0.0) + value
    return values


def _buckets_by_pod(samples: list[tuple[dict[str, str], float]]) -> dict[str, Buckets]:
    pairs: dict[str, dict[float, float]] = {}
    for labels, value in samples:
        pod, bound = labels.get(POD), labels.get("le")
        try:
            le = float(bound) if bound is not None else math.nan
        except ValueError:
            le = math.nan
        if pod is not None and not math.isnan(le) and math.isfinite(value):
            pairs.setdefault(pod, {})[le] = value
    return {pod: Buckets(tuple(sorted(buckets.items()))) for pod, buckets in pairs.items() if math.inf in buckets}


def summary_from_results(
    results: Mapping[str, Any],
    window_seconds: float,
    *,
    required: Iterable[str] = REQUIRED_VLLM,
    expected: Iterable[str] | None = None,
    quotas: Mapping[str, Any] | None = None,
) -> Summary:
    """The :class:`Summary` of the answers to :func:`deployment_queries` (by query name).

    ``expected``: pod names that must report; ``quotas``: pod name -> decoded LMCache
    ``GET /quota`` answer (storage quota and usage, which Prometheus does not hold).
    A missing or failed query reads as series not served.
    """
    answers = {name: parse_vector(body) for name, body in results.items()}
    errors = sorted(f"{name}: {error}" for name, (_, error) in answers.items() if error)
    values = {
        name: _by_pod(samples)
        for name, (samples, _) in answers.items()
        if not name.startswith("demand_") and name not in _QUANTILES
    }
    demand = {name: _buckets_by_pod(answers[name][0]) for name in ("demand_bytes", "demand_chunks") if name in answers}
    quotas = quotas or {}
    fresh = values.get("hbm_watermark", {})
    pods = set().union(*values.values(), *demand.values(), quotas)
    required_queries = [(_REQUIRED_QUERY.get(name, name), engines.describe(name)) for name in required]
    windows = {}
    for pod in pods:
        quota_bytes, quota_used = quota_usage(quotas[pod]) if pod in quotas else (None, None)
        missing = [description for query, description in required_queries if pod not in values.get(query, {})]
        if pod not in fresh:
            stale = "no fresh sample"
        elif missing:
            stale = "not served: " + ", ".join(missing)
        else:
            stale = None
        used = values.get("storage_used_bytes", {}).get(pod)
        windows[pod] = ReplicaWindow(
            seconds=float(window_seconds),
            increases={name: values[name][pod] for name in _COUNTER_QUERIES if pod in values.get(name, {})},
            watermark_mean=values.get("hbm_watermark_mean", {}).get(pod),
            watermark_max=values.get("hbm_watermark_max", {}).get(pod),
            storage_quota_bytes=quota_bytes,
            storage_used_bytes=quota_used if quota_used is not None else used,
            demand_chunks=demand.get("demand_chunks", {}).get(pod),
            demand_bytes=demand.get("demand_bytes", {}).get(pod),
            stale=stale,
        )
    summary = summarise(windows, expected=expected)
    quantiles: dict[str, float | None] = {}
    for name in _QUANTILES:
        samples = answers.get(name, ([], None))[0]
        finite = [value for _, value in samples if math.isfinite(value)]
        quantiles[name] = finite[0] if len(finite) == 1 else None
    stale = "; ".join(filter(None, [summary.stale, *errors])) or None
    return replace(
        summary,
        stale=stale,
        ttft_p50_seconds=quantiles["ttft_p50_seconds"],
        ttft_p99_seconds=quantiles["ttft_p99_seconds"],
    )
