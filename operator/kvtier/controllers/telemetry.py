"""Telemetry loop: every deployment's engine metrics into `status.kv`, `MetricsAvailable`, Events and gauges.

One background task per operator (started by a startup handler, stopped at cleanup), never a
sleep inside a handler. Every `scrape_interval_seconds` it

1. reads the Ready replicas from the watch-fed :class:`~kvtier.telemetry.targets.TargetIndex`
   (no API call per cycle);
2. scrapes their vLLM, LMCache, probe and quota endpoints (:class:`~kvtier.telemetry.scraper.Scraper`),
   or asks Prometheus the :mod:`~kvtier.telemetry.promql` queries (the quota API is still read
   from the pods: Prometheus does not hold it);
3. feeds each replica's :func:`~kvtier.telemetry.engines.replica_snapshot` into its deployment's
   :class:`~kvtier.telemetry.stats.DeploymentWindow` and summarises it;
4. sets the operator's per-deployment gauges, posts alert Events, and patches `status.kv` and
   the `MetricsAvailable` condition through the status subresource, at most every
   `status_interval_seconds` and only when the numbers moved materially or the condition differs
   from what the object says (so a condition overwritten by a concurrent reconcile comes back).
   The numbers too are compared with the `status.kv` the object carries, not with a copy kept
   in memory: a restarted operator rewrites only the deployments whose numbers moved. A
   deployment's first `status.kv` waits until every replica has two samples: one write then
   carries the rates and hit ratios, instead of one without them and another a scrape later.

The patch carries the resourceVersion of the newest body seen: a concurrent writer makes it a
409, and the next cycle tries again on the newer body, so other conditions are never rolled back.
A thin `on.event` handler keeps those bodies current.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from kvtier.controllers.conditions import find, set_condition
from kvtier.controllers.events import post_event
from kvtier.controllers.runtime import OperatorConfig
from kvtier.kube import INFERENCEDEPLOYMENTS, APIError, KubeClient
from kvtier.rebalance.demand import DemandBook
from kvtier.telemetry import promql
from kvtier.telemetry.engines import quota_usage, replica_snapshot
from kvtier.telemetry.metrics import OperatorMetrics
from kvtier.telemetry.report import Alerts, kv_status, metrics_condition, written_summary
from kvtier.telemetry.scraper import PrometheusClient, Scrape, Scraper
from kvtier.telemetry.stats import (
    REQUIRED_LMCACHE_IN_PROCESS,
    REQUIRED_LMCACHE_MP,
    REQUIRED_VLLM,
    DeploymentWindow,
    Summary,
    materially_changed,
)
from kvtier.telemetry.targets import DeploymentKey, Target, TargetIndex

log = logging.getLogger(__name__)

DEPLOYMENT = ("kvtier.io", "v1alpha1", "inferencedeployments")
#: Deployments whose Events and status a cycle writes at once: one after another, a cycle of 1,000
#: took 15 minutes on a loaded apiserver (1-2 s a write under its priority and fairness queues).
STATUS_WRITES_IN_FLIGHT = 32
CONDITION = "MetricsAvailable"
REQUIRED = {"LMCacheMP": REQUIRED_LMCACHE_MP, "LMCacheInProcess": REQUIRED_LMCACHE_IN_PROCESS, "None": REQUIRED_VLLM}


@dataclass
class _Deployment:
    """What the loop keeps per InferenceDeployment."""

    body: dict[str, Any]
    window: DeploymentWindow
    alerts: Alerts
    written_at: float = float("-inf")
    failures: list[str] = field(default_factory=list)

    @property
    def mode(self) -> str:
        return ((self.body.get("spec") or {}).get("kvCache") or {}).get("mode") or "LMCacheMP"

    @property
    def stored(self) -> bool:
        """Whether it draws on a pool (only those need demand curves)."""
        return bool(((self.body.get("spec") or {}).get("kvCache") or {}).get("storage"))


class TelemetryLoop:
    """The loop's state and cycle; :meth:`observe` is fed InferenceDeployment events."""

    def __init__(
        self, config: OperatorConfig, kube: KubeClient, metrics: OperatorMetrics, demand: DemandBook | None = None
    ) -> None:
        self.config = config
        self.kube = kube
        self.metrics = metrics
        #: Where every replica's snapshot also goes, for the rebalancer's demand curves.
        self.demand = demand
        self.targets = TargetIndex(config.namespaces)
        self.deployments: dict[DeploymentKey, _Deployment] = {}
        #: (deployment, pod) -> (time, bytes): the quota each replica's server reported at its last
        #: quota read, in either metrics source (None: it reported none).
        self.served_quotas: dict[tuple[DeploymentKey, str], tuple[float, float | None]] = {}
        #: Completed cycles (tests and logs).
        self.cycles = 0
        #: When the cycle under way started and how far the last one overran the interval (monotonic s).
        self._cycle_started: float | None = None
        self._last_overrun = 0.0

    @property
    def lag_seconds(self) -> float:
        """How far the loop's own cycles run behind the scrape interval (the last one's overrun, or the
        current one's so far). Staleness is judged that much later: a cycle of 1,000 replicas on a
        saturated machine took 83 s, and a replica scraped at its start must not count as stale at its
        end because the operator itself was slow."""
        interval = self.config.scrape_interval_seconds
        current = 0.0 if self._cycle_started is None else time.monotonic() - self._cycle_started - interval
        return max(self._last_overrun, current, 0.0)

    def observe(self, kind: str | None, body: Mapping[str, Any]) -> None:
        """An InferenceDeployment event: remember its newest body, forget it once deleted."""
        metadata = body.get("metadata") or {}
        key = (metadata.get("namespace") or "", metadata.get("name") or "")
        if kind == "DELETED":
            if self.deployments.pop(key, None) is not None:
                self.metrics.forget_deployment(*key)
            for served in [served for served in self.served_quotas if served[0] == key]:
                del self.served_quotas[served]
            if self.demand is not None:
                self.demand.forget(key)
            return
        known = self.deployments.get(key)
        if known is None or known.body["metadata"].get("uid") != metadata.get("uid"):
            required = REQUIRED.get(
                ((body.get("spec") or {}).get("kvCache") or {}).get("mode") or "LMCacheMP", REQUIRED_VLLM
            )
            window = DeploymentWindow(self.config.telemetry_window_seconds, self.config.stale_seconds, required)
            self.deployments[key] = _Deployment(dict(body), window, Alerts(self.config.alerts))
        else:
            known.body = dict(body)

    def scraped_quota_bytes(self, namespace: str, deployment: str, pod: str, now: float | None = None) -> float | None:
        """The quota replica `pod` served at its last quota read, if that is fresh (None: unknown, stale
        (the server may have lost it since), or none set)."""
        served = self.served_quotas.get(((namespace, deployment), pod))
        fresh_for = self.config.stale_seconds + self.lag_seconds
        if served is None or (now if now is not None else time.time()) - served[0] > fresh_for:
            return None
        return served[1]

    def _served(self, scrape: Scrape) -> None:
        """Remember what a quota read says (an unreadable answer: no quota known)."""
        self.served_quotas[scrape.target.key, scrape.target.pod] = (scrape.at, quota_usage(scrape.data)[0])

    async def run(self) -> None:
        """Scrape, summarise and report every interval until cancelled."""
        timeout = min(self.config.scrape_timeout_seconds, self.config.scrape_interval_seconds)
        watch = asyncio.create_task(self.targets.run(self.kube), name="kvtier-telemetry-targets")
        try:
            async with Scraper(
                metrics=self.metrics,
                concurrency=self.config.scrape_concurrency,
                timeout=timeout,
                keepalive=4 * self.config.scrape_interval_seconds,
            ) as scraper:
                prometheus = (
                    PrometheusClient(self.config.prometheus_url, scraper)
                    if self.config.metrics_source == "prometheus" and self.config.prometheus_url
                    else None
                )
                # No cycle before the pods are listed: an empty index would read as "no Ready replica" and
                # flip every deployment's MetricsAvailable (writes and Events) each time the operator starts.
                await self.targets.synced.wait()
                while True:
                    started = time.monotonic()
                    try:
                        await self.cycle(scraper, prometheus)
                    except asyncio.CancelledError:
                        raise
                    except Exception:
                        log.exception("telemetry cycle failed")
                    self.cycles += 1
                    await asyncio.sleep(max(0.0, self.config.scrape_interval_seconds - (time.monotonic() - started)))
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch

    async def cycle(self, scraper: Scraper, prometheus: PrometheusClient | None = None) -> None:
        started = time.monotonic()  # writes are spaced by cycle starts, which are an interval apart
        self._cycle_started = started
        by_deployment = self.targets.by_deployment()
        for deployment in self.deployments.values():
            deployment.failures = []
        try:
            if prometheus is None:
                summaries = await self._scrape(scraper, by_deployment)
            else:
                summaries = await self._query(scraper, prometheus, by_deployment)
        finally:
            self._last_overrun = max(0.0, time.monotonic() - started - self.config.scrape_interval_seconds)
            self._cycle_started = None
        writes = asyncio.Semaphore(STATUS_WRITES_IN_FLIGHT)

        async def report(key: DeploymentKey, deployment: _Deployment) -> None:
            targets = by_deployment.get(key, [])
            summary = summaries.get(key)
            condition = metrics_condition(summary, len(targets), deployment.failures)
            self._export(key, summary, condition)
            async with writes:
                if summary is not None:
                    for kind, reason, message in deployment.alerts.observe(started, summary):
                        await post_event(self.kube, deployment.body, kind, reason, message)
                await self._write(key, deployment, summary, condition, started)

        reported = list(self.deployments.items())
        results = await asyncio.gather(
            *(report(key, deployment) for key, deployment in reported), return_exceptions=True
        )
        for (key, _), result in zip(reported, results):
            if isinstance(result, Exception):
                log.warning("%s/%s: telemetry not reported: %s", *key, result, exc_info=result)

    async def _scrape(
        self, scraper: Scraper, by_deployment: dict[DeploymentKey, list[Target]]
    ) -> dict[DeploymentKey, Summary]:
        known = [target for key, targets in by_deployment.items() if key in self.deployments for target in targets]
        scrapes = await scraper.scrape_all(known)
        per_pod: dict[tuple[DeploymentKey, str], dict[str, Scrape]] = {}
        for scrape in scrapes:
            per_pod.setdefault((scrape.target.key, scrape.target.pod), {})[scrape.endpoint] = scrape
        for (key, pod), endpoints in per_pod.items():
            deployment = self.deployments.get(key)
            if deployment is None:
                continue  # deleted while its replicas were scraped
            failed = [f"{pod}: {name}: {s.error}: {s.detail}" for name, s in endpoints.items() if not s.ok]
            deployment.failures.extend(failed)
            vllm = endpoints.get("vllm")
            if vllm is None or not vllm.ok:
                continue  # no engine numbers: the replica goes stale if this lasts
            pages = {name: s.page for name, s in endpoints.items() if s.ok and name != "quota"}
            quota = endpoints["quota"].data if "quota" in endpoints and endpoints["quota"].ok else None
            if quota is not None:
                self._served(endpoints["quota"])
            snapshot = replica_snapshot(pages.get("vllm"), pages.get("lmcache"), pages.get("probe"), quota)
            deployment.window.add(pod, vllm.at, snapshot)
            if self.demand is not None and deployment.stored:
                self.demand.observe(key, pod, vllm.at, snapshot)
        if self.demand is not None:
            for key, targets in by_deployment.items():
                self.demand.forget(key, [t.pod for t in targets])
        now, lag = time.time(), self.lag_seconds
        return {
            key: deployment.window.summary(now, replicas=[t.pod for t in targets], lag_seconds=lag)
            for key, targets in by_deployment.items()
            if (deployment := self.deployments.get(key)) is not None
        }

    async def _query(
        self, scraper: Scraper, prometheus: PrometheusClient, by_deployment: dict[DeploymentKey, list[Target]]
    ) -> dict[DeploymentKey, Summary]:
        """Prometheus holds the engine series; the quota API (which Prometheus does not hold) and the
        probes (whose decaying histograms the rebalancer takes increments of, scrape by scrape) are
        read from the pods themselves."""
        window = self.config.telemetry_window_seconds
        direct = [
            Target(t.namespace, t.deployment, t.pod, t.ip, tuple(p for p in t.ports if p[0] in ("quota", "probe")))
            for key, targets in by_deployment.items()
            if key in self.deployments
            for t in targets
        ]
        quotas: dict[DeploymentKey, dict[str, Any]] = {}
        probes: dict[tuple[DeploymentKey, str], Scrape] = {}
        for scrape in await scraper.scrape_all(direct):
            if scrape.target.key not in self.deployments:
                continue  # deleted while its replicas were read
            if not scrape.ok:
                self.deployments[scrape.target.key].failures.append(
                    f"{scrape.target.pod}: {scrape.endpoint}: {scrape.error}: {scrape.detail}"
                )
            elif scrape.endpoint == "quota":
                quotas.setdefault(scrape.target.key, {})[scrape.target.pod] = scrape.data
                self._served(scrape)
            else:
                probes[scrape.target.key, scrape.target.pod] = scrape
        if self.demand is not None:
            for (key, pod), scrape in probes.items():
                if not self.deployments[key].stored:  # present: the loop above has not awaited since
                    continue
                quota = quotas.get(key, {}).get(pod)
                self.demand.observe(key, pod, scrape.at, replica_snapshot(probe=scrape.page, quota=quota))
            for key, targets in by_deployment.items():
                self.demand.forget(key, [t.pod for t in targets])

        async def summary(key: DeploymentKey, targets: list[Target]) -> Summary | None:
            deployment = self.deployments.get(key)
            if deployment is None:
                return None  # deleted while the queries of others were answered
            namespace, name = key
            selector = f'namespace="{namespace}",pod=~"{name.replace(".", "[.]")}-[0-9]+"'
            answers = await prometheus.query_all(promql.deployment_queries(selector, window))
            failed = [
                f"query {query}: {answer.get('error')}"
                for query, answer in answers.items()
                if isinstance(answer, dict) and answer.get("status") == "error"
            ]
            deployment.failures.extend(failed)
            if failed:
                return (
                    None  # no summary from part of the series: status.kv keeps its last numbers, the condition says why
                )
            return promql.summary_from_results(
                answers,
                window,
                required=deployment.window.required,
                expected=[t.pod for t in targets],
                quotas=quotas.get(key),
            )

        # Every deployment's queries at once (the scraper's semaphore bounds what is in flight).
        keys = [key for key in by_deployment if key in self.deployments]
        results = await asyncio.gather(*(summary(key, by_deployment[key]) for key in keys))
        return {key: result for key, result in zip(keys, results) if result is not None}

    def _export(self, key: DeploymentKey, summary: Summary | None, condition: tuple[str, str, str]) -> None:
        m, labels = self.metrics, {"namespace": key[0], "deployment": key[1]}
        m.metrics_stale.labels(**labels).set(0 if condition[0] == "True" else 1)
        if summary is None:
            return
        values = [
            (m.hbm_watermark.labels(**labels, stat="mean"), summary.hbm_watermark_mean),
            (m.hbm_watermark.labels(**labels, stat="max"), summary.hbm_watermark_max),
            *(
                (m.hit_ratio.labels(**labels, tier=tier), getattr(summary.hit_ratio, tier))
                for tier in ("hbm", "cpu", "storage", "total")
            ),
            (m.ttft.labels(**labels, quantile="0.5"), summary.ttft_p50_seconds),
            (m.ttft.labels(**labels, quantile="0.99"), summary.ttft_p99_seconds),
            (m.preemptions.labels(**labels), summary.preemptions_per_second),
            (m.storage_quota.labels(**labels), summary.storage_quota_bytes),
            (m.storage_used.labels(**labels), summary.storage_used_bytes),
        ]
        for gauge, value in values:
            if value is not None:
                gauge.set(value)

    async def _write(
        self,
        key: DeploymentKey,
        deployment: _Deployment,
        summary: Summary | None,
        condition: tuple[str, str, str],
        now: float,
    ) -> None:
        if now - deployment.written_at < self.config.status_interval_seconds - 0.001:
            return
        body = deployment.body
        found = body.get("status") or {}
        written = written_summary(found.get("kv"), summary) if summary is not None else None
        # One sample a replica (a new deployment, or this process's first scrape after a restart) has no rates:
        # a first status.kv waits for the next scrape, and one written before is not compared with it.
        first_sample = summary is not None and summary.stale is None and not summary.span_seconds
        if written is None and first_sample:
            return
        conditions = list(found.get("conditions") or [])
        current = find(conditions, CONDITION) or {}
        condition_moved = (current.get("status"), current.get("reason"), current.get("message")) != condition
        kv_moved = (
            summary is not None and summary.replicas > 0 and not first_sample and materially_changed(written, summary)
        )
        if not (condition_moved or kv_moved):
            return
        metadata = body["metadata"]
        status: dict[str, Any] = {
            "conditions": set_condition(
                conditions,
                CONDITION,
                *condition,  # type: ignore[arg-type]  # (status, reason, message) as the report builds it
                generation=metadata.get("generation"),
            )
        }
        if kv_moved:
            assert summary is not None
            status["kv"] = kv_status(summary)
        patch = {"metadata": {"resourceVersion": metadata.get("resourceVersion")}, "status": status}
        try:
            await self.kube.patch(INFERENCEDEPLOYMENTS, key[0], key[1], patch, subresource="status")
        except APIError as error:
            if error.status not in (404, 409):
                log.warning("%s/%s: status not written: %s", *key, error)
            return  # a newer body (or none) is on its way: try again next cycle
        deployment.written_at = now
        if condition_moved and condition[1] == "ScrapeFailed" and current.get("reason") != "ScrapeFailed":
            await post_event(self.kube, body, "Warning", "ScrapeFailed", condition[2])


async def serve_metrics(registry: CollectorRegistry, port: int, host: str = "0.0.0.0") -> web.AppRunner:
    """The operator's own metrics on `http://host:port/metrics`; `await runner.cleanup()` stops it."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, host, port, reuse_address=True).start()
    return runner


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    """Start and stop the loop and the metrics server; feed the loop deployment events."""

    @kopf.on.startup(id="telemetry", registry=registry)
    async def start(memo: kopf.Memo, **_: Any) -> None:
        memo.telemetry = TelemetryLoop(config, memo.kube, memo.metrics, memo.demand)
        memo.telemetry_task = asyncio.create_task(memo.telemetry.run(), name="kvtier-telemetry")
        memo.metrics_server = (
            await serve_metrics(memo.metrics.registry, config.metrics_port) if config.metrics_port else None
        )

    @kopf.on.cleanup(id="telemetry", registry=registry)
    async def stop(memo: kopf.Memo, **_: Any) -> None:
        task = getattr(memo, "telemetry_task", None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if getattr(memo, "metrics_server", None) is not None:
            await memo.metrics_server.cleanup()

    # Async, so that it runs on the event loop with the cycle: on kopf's thread pool it changed
    # `deployments` while a cycle iterated it ("dictionary changed size during iteration", a lost cycle).
    @kopf.on.event(*DEPLOYMENT, id="telemetry", registry=registry)
    async def observe(event: Mapping[str, Any], memo: kopf.Memo, **_: Any) -> None:
        memo.telemetry.observe(event.get("type"), event.get("object") or {})
