"""Thin kopf handlers, one module per kind, registered into a registry per operator run."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import kopf

from kvtier.controllers import (
    inferencedeployments,
    kopfgate,
    kvpools,
    rebalancing,
    recommendation,
    runtime,
    telemetry,
)
from kvtier.controllers.runtime import OperatorConfig, Passes
from kvtier.rebalance.demand import DemandBook
from kvtier.telemetry.metrics import OperatorMetrics


class _SignalsAreTheCallers(logging.Filter):
    """Drops kopf's "OS signals are ignored: running not in the main thread": an operator on a thread (the
    embedded cluster's, `kvtier dev up`, `kvtier demo`) is stopped through `stop_flag` by a caller that
    handles the signals itself, so the note only misleads."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("OS signals are ignored: running not in the main thread")


_SIGNALS_FILTER = _SignalsAreTheCallers()


class _RoutineSuccesses(logging.Filter):
    """Drops kopf's INFO line for each success of a periodic pass or a watch observer: the resync timer and
    the telemetry event handler succeed for every deployment every few seconds (100 lines a second at 1,000
    deployments), the pool view's for every pool status write, and they say nothing a condition or a metric
    does not (`kvtier run --verbose` keeps them)."""

    ROUTINE = frozenset(
        {"Timer 'resync' succeeded.", "Handler 'telemetry' succeeded.", "Handler 'pool-view' succeeded."}
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and record.getMessage() in self.ROUTINE)


_ROUTINE_FILTER = _RoutineSuccesses()


def build_registry(config: OperatorConfig) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    runtime.register(registry, config)
    kvpools.register(registry, config)
    inferencedeployments.register(registry, config)
    telemetry.register(registry, config)
    rebalancing.register(registry, config)
    recommendation.register(registry, config)
    runtime.register_cleanup(registry)
    return registry


async def run_operator(
    config: OperatorConfig,
    *,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
    liveness_endpoint: str | None = None,
    verbose: bool = False,
) -> None:
    """Run the operator until `stop_flag` is set (or a signal, in the main thread); `verbose` keeps kopf's
    line for every success of a periodic pass.

    `memo.metrics` holds the operator's own Prometheus metrics (one registry per run); `memo.demand`
    the deployments' demand estimators, fed by telemetry and read by the rebalance rounds."""
    scope: dict[str, Any] = {"namespaces": config.namespaces} if config.namespaces else {"clusterwide": True}
    if config.peering:  # mandatory peering: kopf stops if the peering object does not exist
        scope.update(peering_name=config.peering, priority=config.priority)
    if threading.current_thread() is not threading.main_thread() and stop_flag is not None:
        logging.getLogger("kopf._core.reactor.running").addFilter(_SIGNALS_FILTER)  # idempotent
    if verbose:
        logging.getLogger("kopf.objects").removeFilter(_ROUTINE_FILTER)
    else:
        logging.getLogger("kopf.objects").addFilter(_ROUTINE_FILTER)  # idempotent
    kopfgate.install()
    await kopf.operator(
        registry=build_registry(config),
        standalone=not config.peering,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
        liveness_endpoint=liveness_endpoint,
        memo=kopf.Memo(metrics=OperatorMetrics(), demand=DemandBook(config.stale_seconds), passes=Passes()),
        **scope,
    )


__all__ = ["OperatorConfig", "build_registry", "run_operator"]
