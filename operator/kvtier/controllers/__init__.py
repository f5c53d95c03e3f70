"""Thin kopf handlers, one module per kind, registered into a registry per operator run."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import kopf

from kvtier.controllers import inferencedeployments, kvpools, rebalancing, runtime, telemetry
from kvtier.controllers.runtime import OperatorConfig
from kvtier.rebalance.demand import DemandBook
from kvtier.telemetry.metrics import OperatorMetrics


def build_registry(config: OperatorConfig) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    runtime.register(registry, config)
    kvpools.register(registry, config)
    inferencedeployments.register(registry, config)
    telemetry.register(registry, config)
    rebalancing.register(registry, config)
    runtime.register_cleanup(registry)
    return registry


async def run_operator(
    config: OperatorConfig,
    *,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
    liveness_endpoint: str | None = None,
) -> None:
    """Run the operator until `stop_flag` is set (or a signal, in the main thread).

    `memo.metrics` holds the operator's own Prometheus metrics (one registry per run); `memo.demand`
    the deployments' demand estimators, fed by telemetry and read by the rebalance rounds."""
    scope: dict[str, Any] = {"namespaces": config.namespaces} if config.namespaces else {"clusterwide": True}
    if config.peering:  # mandatory peering: kopf stops if the peering object does not exist
        scope.update(peering_name=config.peering, priority=config.priority)
    await kopf.operator(
        registry=build_registry(config),
        standalone=not config.peering,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
        liveness_endpoint=liveness_endpoint,
        memo=kopf.Memo(metrics=OperatorMetrics(), demand=DemandBook(config.stale_seconds)),
        **scope,
    )


__all__ = ["OperatorConfig", "build_registry", "run_operator"]
