"""Fetch every target's metrics pages: bounded concurrency, per-request timeouts, a body size limit.

:class:`Scraper` owns one aiohttp session for its life (connections are kept alive between
cycles). :meth:`Scraper.scrape_all` fetches every endpoint of every :class:`~.targets.Target`
with at most ``concurrency`` requests in flight, each bounded by ``timeout`` seconds and
``max_bytes`` of body, parses each page (:func:`~.exposition.parse_exposition`, which never
raises; only the series a snapshot reads, :data:`~.engines.SERIES_READ`; the ``quota`` endpoint is
JSON) and returns one :class:`Scrape` per endpoint. A failure
is classified, never raised:

- ``timeout``: no full answer within ``timeout`` seconds;
- ``refused``: the connection was refused or could not be made (pod gone, port closed);
- ``connection``: the connection broke mid-answer (reset, truncated payload);
- ``http_status``: an answer other than 200;
- ``too_large``: a body (or its Content-Length) over ``max_bytes``;
- ``parse``: a body with no readable sample but problems (garbage, not a metrics page), or a
  quota answer that is not JSON.

Every scrape feeds ``kvtier_scrape_duration_seconds`` and, on failure,
``kvtier_scrape_errors_total{endpoint, reason}``; each cycle sets ``kvtier_scrape_targets`` and
``kvtier_scrape_cycle_duration_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import aiohttp

from kvtier.telemetry.engines import SERIES_READ
from kvtier.telemetry.exposition import MAX_BYTES, Page, parse_exposition
from kvtier.telemetry.metrics import OperatorMetrics
from kvtier.telemetry.targets import ENDPOINTS, Target

REASONS = ("timeout", "refused", "connection", "http_status", "too_large", "parse")
_ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
#: Bytes of an error answer's body kept (Prometheus explains a failed query there).
ERROR_BODY_BYTES = 4096


class ScrapeError(Exception):
    """A failed fetch: ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: str, detail: str, body: bytes = b"") -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        #: The start of the body of an ``http_status`` answer, when asked for (``fetch(error_body=True)``).
        self.body = body


@dataclass(frozen=True)
class Scrape:
    """One endpoint of one target, fetched at ``at`` (wall-clock seconds)."""

    target: Target
    endpoint: str
    at: float
    duration: float
    page: Page | None = None
    data: Any = None
    """The decoded JSON of the ``quota`` endpoint."""
    error: str | None = None
    """None, or one of :data:`REASONS`."""
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


class Scraper:
    """``async with Scraper(metrics=...) as scraper: scrapes = await scraper.scrape_all(targets)``."""

    def __init__(
        self,
        *,
        metrics: OperatorMetrics | None = None,
        concurrency: int = 64,
        timeout: float = 2.0,
        max_bytes: int = MAX_BYTES,
        keepalive: float = 60.0,
    ) -> None:
        if concurrency < 1 or not timeout > 0 or max_bytes < 1:
            raise ValueError("concurrency, timeout and max_bytes must be positive")
        self.metrics = metrics
        self.concurrency = concurrency
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.keepalive = keepalive
        self._session: aiohttp.ClientSession | None = None
        self._semaphore: asyncio.Semaphore | None = None

    async def __aenter__(self) -> Scraper:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> Scraper:
        # Idle connections are kept between cycles (keepalive), the open ones bounded by the semaphore.
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=self.keepalive, ttl_dns_cache=None)
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers={"Accept": _ACCEPT, "User-Agent": "kvtier-operator"},
            timeout=aiohttp.ClientTimeout(total=self.timeout),
            auto_decompress=True,
        )
        self._semaphore = asyncio.Semaphore(self.concurrency)
        return self

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def fetch(self, url: str, *, error_body: bool = False) -> bytes:
        """The body of ``url``, or :class:`ScrapeError` (carrying the start of a non-200 answer's
        body if ``error_body``)."""
        assert self._session is not None, "open the scraper first"
        try:
            async with self._session.get(url, allow_redirects=False) as reply:
                if reply.status != 200:
                    body = b""
                    if error_body:
                        with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError):
                            body = await reply.content.read(ERROR_BODY_BYTES)
                    raise ScrapeError("http_status", f"HTTP {reply.status}", body)
                if reply.content_length is not None and reply.content_length > self.max_bytes:
                    raise ScrapeError("too_large", f"Content-Length {reply.content_length} > {self.max_bytes}")
                chunks, size = [], 0
                async for chunk in reply.content.iter_chunked(1 << 16):
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise ScrapeError("too_large", f"body over {self.max_bytes} bytes")
                    chunks.append(chunk)
                return b"".join(chunks)
        except TimeoutError:
            raise ScrapeError("timeout", f"no answer within {self.timeout:g}s") from None
        except (aiohttp.ClientConnectorError, ConnectionRefusedError) as error:
            raise ScrapeError("refused", str(error) or type(error).__name__) from None
        except (aiohttp.ClientError, OSError) as error:
            raise ScrapeError("connection", str(error) or type(error).__name__) from None

    async def scrape(self, target: Target, endpoint: str, url: str) -> Scrape:
        """Fetch and parse one endpoint (waits for a free slot first)."""
        assert self._semaphore is not None, "open the scraper first"
        async with self._semaphore:
            at, start = time.time(), time.perf_counter()
            try:
                body = await self.fetch(url)
            except ScrapeError as error:
                return self._record(
                    Scrape(target, endpoint, at, time.perf_counter() - start, error=error.reason, detail=error.detail)
                )
        if endpoint == "quota":
            try:
                data = json.loads(body)
            except ValueError as error:  # also bad UTF-8
                return self._record(
                    Scrape(
                        target, endpoint, at, time.perf_counter() - start, error="parse", detail=f"not JSON: {error}"
                    )
                )
            return self._record(Scrape(target, endpoint, at, time.perf_counter() - start, data=data))
        page = parse_exposition(body, max_bytes=self.max_bytes, names=SERIES_READ)
        duration = time.perf_counter() - start
        if page.problems and not page.series:
            problem = page.problems[0]
            return self._record(
                Scrape(
                    target, endpoint, at, duration, page=page, error="parse", detail=f"no readable sample ({problem})"
                )
            )
        return self._record(Scrape(target, endpoint, at, duration, page=page))

    async def scrape_all(self, targets: Iterable[Target]) -> list[Scrape]:
        """Every endpoint of every target, concurrently (at most ``concurrency`` in flight)."""
        start = time.perf_counter()
        jobs = [(target, endpoint, url) for target in targets for endpoint, url in target.urls().items()]
        scrapes = list(await asyncio.gather(*(self.scrape(*job) for job in jobs)))
        if self.metrics is not None:
            counts = Counter(endpoint for _, endpoint, _ in jobs)
            for endpoint in ENDPOINTS:
                self.metrics.scrape_targets.labels(endpoint=endpoint).set(counts.get(endpoint, 0))
            self.metrics.scrape_cycle_duration.set(time.perf_counter() - start)
        return scrapes

    def _record(self, scrape: Scrape) -> Scrape:
        if self.metrics is not None:
            self.metrics.scrape_duration.labels(endpoint=scrape.endpoint).observe(scrape.duration)
            if scrape.error is not None:
                self.metrics.scrape_errors.labels(endpoint=scrape.endpoint, reason=scrape.error).inc()
        return scrape


class PrometheusClient:
    """``--metrics-source prometheus``: instant queries against ``/api/v1/query`` of a Prometheus server.

    Shares the scraper's session, concurrency bound, timeout and body limit; a failed query is
    an answer with ``status: error`` (what :func:`~kvtier.telemetry.promql.parse_vector` reads as
    a failed query), so one bad query never hides the others. Prometheus answers a failed query
    with a 4xx/5xx status and says why in a JSON body: that reason is kept.
    """

    def __init__(self, url: str, scraper: Scraper) -> None:
        self.url = url.rstrip("/") + "/api/v1/query"
        self.scraper = scraper

    async def query(self, expression: str) -> Any:
        """The decoded answer to one instant query, or an error answer saying why."""
        assert self.scraper._semaphore is not None, "open the scraper first"
        async with self.scraper._semaphore:
            start = time.perf_counter()
            try:
                body = await self.scraper.fetch(f"{self.url}?{urlencode({'query': expression})}", error_body=True)
                answer = json.loads(body)
                reason = None
            except ScrapeError as error:
                answer, reason = {"status": "error", "error": f"{error.reason}: {error.detail}"}, error.reason
                with contextlib.suppress(ValueError, RecursionError):
                    explained = json.loads(error.body) if error.body else None
                    if isinstance(explained, dict) and explained.get("status") == "error":
                        answer = {
                            "status": "error",
                            "errorType": explained.get("errorType", "error"),
                            "error": f"{answer['error']}: {explained.get('error', 'no reason given')}",
                        }
            except ValueError as error:
                answer, reason = {"status": "error", "error": f"not JSON: {error}"}, "parse"
        if self.scraper.metrics is not None:
            self.scraper.metrics.scrape_duration.labels(endpoint="prometheus").observe(time.perf_counter() - start)
            if reason is not None:
                self.scraper.metrics.scrape_errors.labels(endpoint="prometheus", reason=reason).inc()
        return answer

    async def query_all(self, queries: dict[str, str]) -> dict[str, Any]:
        """Query name -> answer, concurrently."""
        answers = await asyncio.gather(*(self.query(expression) for expression in queries.values()))
        return dict(zip(queries, answers))
