"""Speed of kvtier's exposition parser on a vLLM-sized page, against prometheus_client's parser.

The page: a simulated replica's vLLM and LMCache MP pages and a probe page, plus the other
histograms vLLM serves (each with TTFT's buckets) until it holds at least ``--series`` series.
Prints pages/s and microseconds per page for ``parse_exposition``, for ``parse_exposition``
followed by ``replica_snapshot``, and for ``prometheus_client.parser``.

    .venv/bin/python bench/telemetry_parse_bench.py [--series 300] [--seconds 2]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvtier.probe.demand import DemandProbe
from kvtier.sim.engine import EngineParams
from kvtier.sim.exposition import TTFT_BUCKETS
from kvtier.sim.server import SimServer
from kvtier.telemetry.engines import replica_snapshot
from kvtier.telemetry.exposition import parse_exposition

#: vLLM histograms besides TTFT (engine-metrics.md), to fill the page up to a real one's size.
OTHER_HISTOGRAMS = (
    "vllm:e2e_request_latency_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:request_time_per_output_token_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:iteration_tokens_total",
    "vllm:request_params_max_tokens",
    "vllm:request_params_n",
    "vllm:request_num_preemptions",
)


def build_page(series: int) -> bytes:
    """A full replica page: vLLM, LMCache MP, probe, and vLLM histograms as filler."""
    server = SimServer(
        EngineParams(block_tokens=4, kv_bytes_per_token=1 << 18, hbm_blocks=4, cpu_blocks=8), model="bench"
    )
    server.set_quota("", 1.0)
    for index in range(200):
        server.serve(list(range(index % 9, index % 9 + 6)), 24, 8, "t" if index % 2 else "")
    probe = DemandProbe(max_chunks=1 << 10, chunk_bytes=1 << 20)
    probe_registry = CollectorRegistry()
    probe_registry.register(probe)
    filler = CollectorRegistry()
    vllm = generate_latest(server.vllm_registry)
    page = vllm + generate_latest(server.mp_registry) + generate_latest(probe_registry)
    for name in OTHER_HISTOGRAMS:
        if parse_exposition(page).series >= series:
            break
        histogram = Histogram(name, "Filler.", ["model_name", "engine"], buckets=TTFT_BUCKETS, registry=filler)
        histogram.labels(model_name="bench", engine="0").observe(0.5)
        page = vllm + generate_latest(filler) + generate_latest(server.mp_registry) + generate_latest(probe_registry)
    return page


def rate(work: Callable[[], object], seconds: float) -> float:
    """Calls per second of ``work`` over about ``seconds``."""
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(20):
            work()
        calls += 20
    return calls / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=300, help="series on the page (at least)")
    parser.add_argument("--seconds", type=float, default=2.0, help="time per measurement")
    args = parser.parse_args()
    page = build_page(args.series)
    parsed = parse_exposition(page)
    text = page.decode()
    print(
        f"page: {parsed.series} series, {len(page)} bytes, {len(page.splitlines())} lines, "
        f"{len(parsed.problems)} problems"
    )
    results = {
        "parse_exposition": rate(lambda: parse_exposition(page), args.seconds),
        "parse_exposition + replica_snapshot": rate(lambda: replica_snapshot(parse_exposition(page)), args.seconds),
        "prometheus_client.parser": rate(lambda: list(text_string_to_metric_families(text)), args.seconds),
    }
    for name, pages_per_second in results.items():
        print(f"{name:40s} {pages_per_second:10.0f} pages/s {1e6 / pages_per_second:8.0f} us/page")


if __name__ == "__main__":
    main()
