"""Speed and memory of `kvtier sim serve`'s engine path and of `kvtier probe` on a Mooncake trace.

1. The trace through a SimServer (engine, vLLM and LMCache metrics, lookup-hash log), unpaced.
2. The probe reading that whole log: lookups and chunks per second for several stack depths
   (`--max-blocks`), and with `--memory` the peak memory it allocates (a second, traced and
   much slower pass).
3. The cost of one scrape of each page (vLLM, LMCache MP, probe).

    .venv/bin/python bench/probe_bench.py [--trace FILE] [--memory]
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import tempfile
import time
import tracemalloc

from prometheus_client.exposition import generate_latest

from kvtier.probe.demand import DemandProbe
from kvtier.probe.service import Probe
from kvtier.sim.engine import EngineParams
from kvtier.sim.server import SimServer, open_lookup_log, replay_trace
from kvtier.sim.settings import TraceLoad

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "mooncake" / "mooncake_conversation_trace.jsonl"


def per_scrape(registry, repeat: int = 200) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        generate_latest(registry)
    return (time.perf_counter() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=pathlib.Path, default=DEFAULT_TRACE)
    parser.add_argument("--memory", action="store_true", help="also measure the probe's peak memory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        params = EngineParams(hbm_blocks=1024, cpu_blocks=2048)
        log = open_lookup_log(directory, params, max_bytes=64 << 20, max_files=0)
        server = SimServer(params, speed=1e12, lookup_log=log)  # every arrival is already due: unpaced
        server.set_quota("", 1e6)
        start = time.perf_counter()
        served = asyncio.run(replay_trace(server, TraceLoad(str(args.trace))))
        seconds = time.perf_counter() - start
        log.close()
        blocks = server.engine.stats.accessed_blocks
        print(
            f"sim serve path: {served} requests, {blocks} blocks in {seconds:.2f} s: "
            f"{served / seconds:,.0f} requests/s, {blocks / seconds:,.0f} blocks/s"
        )
        print(
            f"scrape: vLLM page {per_scrape(server.vllm_registry) * 1e3:.2f} ms, "
            f"LMCache MP page {per_scrape(server.mp_registry) * 1e3:.2f} ms"
        )
        for max_blocks in (1 << 12, 1 << 16, 1 << 20):
            probe = make_probe(directory, max_blocks, params.block_bytes)
            start = time.perf_counter()
            lines = probe.poll()
            seconds = time.perf_counter() - start
            print(
                f"probe --max-blocks {max_blocks}: {lines} lookups, {probe.demand.chunks} chunks in {seconds:.2f} s: "
                f"{lines / seconds:,.0f} lookups/s, {probe.demand.chunks / seconds:,.0f} chunks/s; "
                f"{probe.demand.tracked_chunks} tracked; scrape {per_scrape(probe.registry, 20) * 1e3:.2f} ms"
            )
            if args.memory:
                tracemalloc.start()
                make_probe(directory, max_blocks, params.block_bytes).poll()
                _, peak = tracemalloc.get_traced_memory()
                tracemalloc.stop()
                print(f"  peak memory allocated: {peak / 2**20:.0f} MiB")


def make_probe(directory: str, max_blocks: int, chunk_bytes: int) -> Probe:
    return Probe(directory, DemandProbe(max_blocks, chunk_bytes=chunk_bytes, window_seconds=1800))


if __name__ == "__main__":
    main()
