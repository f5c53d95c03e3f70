"""The scraper: every endpoint fetched and parsed, failures classified (never raised) and counted."""

import asyncio
import random

import pytest
from aiohttp import web

from kvtier.telemetry.metrics import OperatorMetrics
from kvtier.telemetry.scraper import Scraper
from kvtier.telemetry.targets import Target

PAGE = b"""# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
"""


def address():
    return f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"


@pytest.fixture
async def server():
    """An aiohttp app on a fresh 127.x address, port 8000; yields (address, state)."""
    state = {"in_flight": 0, "most": 0}
    host = address()

    async def page(request):
        return web.Response(body=PAGE, content_type="text/plain")

    async def slow(request):
        state["in_flight"] += 1
        state["most"] = max(state["most"], state["in_flight"])
        try:
            await asyncio.sleep(float(request.query.get("s", "5")))
        finally:
            state["in_flight"] -= 1
        return web.Response(body=PAGE)

    async def error(request):
        return web.Response(status=503, text="overloaded")

    async def huge(request):
        response = web.StreamResponse()  # chunked: no Content-Length to refuse it by
        await response.prepare(request)
        for _ in range(64):
            await response.write(b"x 1\n" * 4096)
        return response

    async def declared_huge(request):
        return web.Response(body=b"x 1\n" * 100_000)

    async def garbage(request):
        return web.Response(body=bytes(range(256)) * 10)

    async def cut(request):
        response = web.StreamResponse(headers={"Content-Length": "100000"})
        await response.prepare(request)
        await response.write(PAGE)
        request.transport.close()
        return response

    async def quota(request):
        return web.json_response({"users": {"_default": {"limit_gb": 4.0, "current_usage_gb": 1.0}}})

    async def not_json(request):
        return web.Response(text="<html>")

    app = web.Application()
    for path, handler in (
        ("/metrics", page),
        ("/slow", slow),
        ("/error", error),
        ("/huge", huge),
        ("/declared-huge", declared_huge),
        ("/garbage", garbage),
        ("/cut", cut),
        ("/quota", quota),
        ("/not-json", not_json),
    ):
        app.router.add_get(path, handler)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, host, 8000).start()
    yield host, state
    await runner.cleanup()


def target(host):
    return Target("ns", "chat", "chat-0", host, (("vllm", 8000),))


@pytest.mark.parametrize(
    "path, reason",
    [
        ("/slow?s=5", "timeout"),
        ("/error", "http_status"),
        ("/huge", "too_large"),
        ("/declared-huge", "too_large"),
        ("/garbage", "parse"),
        ("/cut", "connection"),
    ],
)
async def test_failures_are_classified_and_counted(server, path, reason):
    host, _ = server
    metrics = OperatorMetrics()
    async with Scraper(metrics=metrics, timeout=0.3, max_bytes=200_000) as scraper:
        scrape = await scraper.scrape(target(host), "vllm", f"http://{host}:8000{path}")
    assert (scrape.error, scrape.ok) == (reason, False), scrape.detail
    assert scrape.detail
    assert metrics.registry.get_sample_value("kvtier_scrape_errors_total", {"endpoint": "vllm", "reason": reason}) == 1


async def test_a_closed_port_is_refused():
    host = address()
    async with Scraper(timeout=1) as scraper:
        scrape = await scraper.scrape(target(host), "vllm", f"http://{host}:8000/metrics")
    assert scrape.error == "refused"


async def test_scrape_all_covers_every_endpoint_and_records_the_cycle(server):
    host, _ = server
    metrics = OperatorMetrics()
    targets = [
        Target("ns", "chat", "chat-0", host, (("vllm", 8000), ("quota", 8000))),
        Target("ns", "chat", "chat-1", address(), (("vllm", 8000),)),
    ]
    async with Scraper(metrics=metrics, timeout=1) as scraper:
        scrapes = await scraper.scrape_all(targets)
    by = {(s.target.pod, s.endpoint): s for s in scrapes}
    assert set(by) == {("chat-0", "vllm"), ("chat-0", "quota"), ("chat-1", "vllm")}
    page = by["chat-0", "vllm"].page
    assert by["chat-0", "vllm"].ok and page.sum("vllm:kv_cache_usage_perc") == 0.25
    assert page.sum("vllm:prefix_cache_queries_total") == 1000
    assert by["chat-0", "quota"].data["users"]["_default"]["limit_gb"] == 4.0
    assert by["chat-1", "vllm"].error == "refused"
    sample = metrics.registry.get_sample_value
    assert sample("kvtier_scrape_targets", {"endpoint": "vllm"}) == 2
    assert sample("kvtier_scrape_targets", {"endpoint": "quota"}) == 1
    assert sample("kvtier_scrape_duration_seconds_count", {"endpoint": "vllm"}) == 2
    assert sample("kvtier_scrape_cycle_duration_seconds") > 0


async def test_a_quota_answer_that_is_not_json_is_a_parse_error(server):
    host, _ = server
    async with Scraper(timeout=1) as scraper:
        scrape = await scraper.scrape(target(host), "quota", f"http://{host}:8000/not-json")
    assert scrape.error == "parse" and scrape.data is None


async def test_concurrency_is_bounded(server):
    host, state = server
    many = [Target("ns", "chat", f"chat-{i}", host, (("vllm", 8000),)) for i in range(12)]
    async with Scraper(concurrency=3, timeout=5) as scraper:
        scrapes = await asyncio.gather(*(scraper.scrape(t, "vllm", f"http://{host}:8000/slow?s=0.05") for t in many))
    assert all(s.ok for s in scrapes)
    assert state["most"] == 3


def test_nonsense_settings_are_refused():
    with pytest.raises(ValueError):
        Scraper(concurrency=0)
