"""What every kvtier controller shares: operator settings, login, the API client, and error mapping.

Handlers parse a body into its model once (`parse`), talk to the API through `memo.kube`, and
let `api_errors` turn API answers into kopf's retry semantics: 409, 429 and 5xx are temporary
(retried after a delay, never slept on in the handler), other 4xx are permanent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import aiohttp
import kopf
from pydantic import BaseModel, ValidationError

from kvtier.api.errors import Problem, problems
from kvtier.kube import APIError, Connection, KubeClient, load_configuration
from kvtier.render import RenderOptions
from kvtier.telemetry.report import AlertRules

FIELD_MANAGER = "kvtier"
FINALIZER = "kvtier.io/finalizer"
#: Longest wait at exit for the handlers still running (kopf's workers, then the timers' passes) before the
#: clients close.
DRAIN_SECONDS = 10.0

M = TypeVar("M", bound=BaseModel)
H = TypeVar("H", bound=Callable[..., Awaitable[Any]])


@dataclass(frozen=True)
class OperatorConfig:
    """Operator-wide settings (`kvtier run` flags)."""

    kubeconfig: Path | None = None
    """None: $KUBECONFIG, ~/.kube/config, or the in-cluster service account."""
    namespaces: tuple[str, ...] = ()
    """Namespaces whose InferenceDeployments are served (empty: all)."""
    resync_seconds: float = 10.0
    """Level-based resync period: drift is corrected and status refreshed at least this often."""
    start_grace_seconds: float = 600.0
    """How long an InferenceDeployment's replicas may take to become Ready (scheduling, image pull, model
    load) before Ready=False is a Warning (`ReplicasNotReady`); a failing pod is one at once."""
    render: RenderOptions = field(default_factory=RenderOptions)
    quota_timeout_seconds: float = 2.0
    """Per-request timeout of calls to the engines' quota API."""
    metrics_port: int = 0
    """Port of the operator's own Prometheus metrics (`/metrics`); 0: not served."""
    metrics_source: Literal["scrape", "prometheus"] = "scrape"
    """Where engine metrics come from: scraping every Ready replica, or a Prometheus server."""
    prometheus_url: str | None = None
    """Base URL of the Prometheus server (`metrics_source="prometheus"`)."""
    scrape_interval_seconds: float = 15.0
    """Seconds between telemetry cycles (scrapes or Prometheus queries)."""
    scrape_timeout_seconds: float = 5.0
    """Per-request timeout of one scrape (capped at the interval)."""
    scrape_concurrency: int = 64
    """Requests in flight at most during a cycle."""
    telemetry_window_seconds: float = 300.0
    """Window of the per-deployment statistics (hit ratios, rates, watermark mean and max)."""
    status_interval_seconds: float = 30.0
    """Least time between two telemetry writes of one deployment's status (written only on a material change)."""
    alerts: AlertRules = field(default_factory=AlertRules)
    """When the watermark or the hit ratio deserve an Event."""
    peering: str | None = None
    """kopf peering object to join (a ClusterKopfPeering, or a KopfPeering per namespace); None: standalone."""
    priority: int = 0
    """Peering priority: a peer with a higher one pauses this operator."""
    namespace: str = "kvtier-system"
    """The operator's own namespace: released static volumes are wiped there (their claim and Job)."""

    def __post_init__(self) -> None:
        if self.metrics_source == "prometheus" and not self.prometheus_url:
            raise ValueError("metrics_source prometheus needs prometheus_url")

    @property
    def stale_seconds(self) -> float:
        """A replica without a sample for this long is stale (three missed cycles); the telemetry loop waits
        longer by however far its own cycle overruns the interval (`TelemetryLoop.lag_seconds`)."""
        return 3 * self.scrape_interval_seconds + self.scrape_timeout_seconds


class InvalidSpec(kopf.PermanentError):
    """The object does not validate; `problems` name the fields."""

    def __init__(self, found: list[Problem]):
        self.problems = found
        super().__init__("; ".join(str(problem) for problem in found))


def parse(model: type[M], body: Any) -> M:
    """The body as its model, or `InvalidSpec` naming every field at fault."""
    try:
        return model.model_validate(dict(body))
    except ValidationError as error:
        raise InvalidSpec(problems(error)) from None


@contextlib.contextmanager
def api_errors() -> Iterator[None]:
    """Map API failures to kopf: conflicts and overload are retried later, other client errors are not."""
    try:
        yield
    except APIError as error:
        if error.status == 409:
            raise kopf.TemporaryError(f"conflict, retrying: {error}", delay=1) from error
        if error.status == 429:
            raise kopf.TemporaryError(f"throttled: {error}", delay=error.retry_after or 5) from error
        if error.status >= 500 or error.status in (401, 403, 404):
            raise kopf.TemporaryError(str(error), delay=5) from error
        raise kopf.PermanentError(str(error)) from error
    except (aiohttp.ClientError, TimeoutError) as error:
        raise kopf.TemporaryError(f"API unreachable: {error}", delay=5) from error


class Passes:
    """The reconcile passes in flight, and whether the operator is exiting.

    One instance serves every object: kopf hands each object a shallow copy of the operator's memo, so a
    flag set on the operator's memo at exit would never reach the copies, while this object's state does."""

    def __init__(self) -> None:
        self.stopping = False
        self._running: set[asyncio.Future[None]] = set()

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        done = asyncio.get_running_loop().create_future()
        self._running.add(done)
        try:
            yield
        finally:
            done.set_result(None)
            self._running.discard(done)

    async def drain(self, timeout: float) -> None:
        """Start no pass from now on, and wait up to `timeout` seconds for those still running."""
        self.stopping = True
        deadline = asyncio.get_running_loop().time() + timeout
        while self._running:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            await asyncio.wait(list(self._running), timeout=left)


def measured(kind: str, handler: H) -> H:
    """`handler`, counted and timed in `kvtier_reconcile_total{kind, result}` and
    `kvtier_reconcile_duration_seconds{kind}` (result: success, retry or error), and tracked in the
    memo's `Passes` so that the exit waits for it."""

    @functools.wraps(handler)
    async def wrapper(**kwargs: Any) -> Any:
        memo = kwargs["memo"]
        passes: Passes = memo.passes
        if passes.stopping:
            # The operator is exiting and its clients are closing: a pass kopf starts now would fail on a
            # closed session. The next operator's resume pass and resync do its work (reconcile is level-based).
            return None
        start, result = time.perf_counter(), "success"
        try:
            with passes.running():
                return await handler(**kwargs)
        except kopf.TemporaryError:
            result = "retry"
            raise
        except Exception:
            result = "error"
            raise
        finally:
            memo.metrics.reconciles.labels(kind=kind, result=result).inc()
            memo.metrics.reconcile_duration.labels(kind=kind).observe(time.perf_counter() - start)

    return wrapper  # type: ignore[return-value]  # same signature as the handler it wraps


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    """Startup (settings, the API client), login, and the exit's wait for running passes; the client is
    closed by `register_cleanup`."""

    @kopf.on.startup(id="configure", registry=registry)
    async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        settings.persistence.finalizer = FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kvtier.io")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix="kvtier.io", key="last-handled-configuration"
        )
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.networking.error_backoffs = [1, 2, 5, 10]
        settings.posting.level = logging.WARNING
        # kopf gives the change handlers in flight (create, update, delete) 2 s at exit, then cancels them:
        # give them as long as the drain gives a timer's pass.
        settings.queueing.exit_timeout = DRAIN_SECONDS
        connection = Connection.from_kubeconfig(str(config.kubeconfig) if config.kubeconfig else None)
        memo.kube = await KubeClient(connection, user_agent="kvtier-operator").open()
        memo.config = config

    @kopf.on.cleanup(id="drain-passes", registry=registry)
    async def drain(memo: kopf.Memo, **_: Any) -> None:
        """Let the passes still running end before any client closes (registered first, so it runs first).

        At exit kopf leaves a timer's pass running ("orphaned"); without this wait, every one in flight
        would fail on a closed session and log a traceback on each shutdown of a busy operator. No pass
        starts from here on, during the wait or after it (`measured` reads the one `Passes` that every
        object's copy of the memo shares)."""
        await memo.passes.drain(DRAIN_SECONDS)

    @kopf.on.login(id="login", registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(config.kubeconfig)


def connection_info(kubeconfig: Path | None) -> kopf.ConnectionInfo:
    """kopf's credentials, from the same kubeconfig (or in-cluster account) as the operator's own client."""
    configuration = load_configuration(str(kubeconfig) if kubeconfig else None)
    # A kubeconfig's token lands under "BearerToken" (the in-cluster account's under "authorization").
    token = configuration.api_key.get("authorization") or configuration.api_key.get("BearerToken") or ""
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        scheme="Bearer" if token else None,
        token=token.removeprefix("Bearer ") or None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


def register_cleanup(registry: kopf.OperatorRegistry) -> None:
    """Close the API client: registered last, as kopf runs cleanup handlers in registration order and the
    other modules' cleanups (telemetry's loop, for one) may still use it."""

    @kopf.on.cleanup(id="close-client", registry=registry)
    async def close(memo: kopf.Memo, **_: Any) -> None:
        if getattr(memo, "kube", None) is not None:
            await memo.kube.close()
