"""A KVPool's capacity recommendation: `status.recommendation`, refreshed every `spec.recommendation.interval`.

A daemon per pool reads the pool and its deployments (with the demand curves their status publishes),
computes the recommendation with the pure :mod:`kvtier.rebalance.recommend` (``kvtier plan --live``'s
computation), writes it only on a material change, and posts a Warning Event (`PoolUndersized`) when the
pool has been undersized for `undersizedRefreshes` refreshes in a row, a Normal one (`PoolSized`) when it
has recovered for as many; nothing while the state holds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import aiohttp
import kopf
from pydantic import ValidationError

from kvtier.api.kvpool import KVPool, KVPoolStatus, PoolRecommendation, RecommendationSpec
from kvtier.api.units import format_quantity
from kvtier.controllers.events import post_event
from kvtier.controllers.kvpools import DEPLOYMENTS, POOL, PoolGone, PoolView, read_pool, update_pool_status
from kvtier.controllers.runtime import InvalidSpec, OperatorConfig, parse
from kvtier.kube import APIError, KubeClient
from kvtier.rebalance.costmodel import preset
from kvtier.rebalance.planlive import DEFAULT_COST_MODEL, live_pools
from kvtier.rebalance.recommend import Sizing, advance, material, recommend, undersized

log = logging.getLogger(__name__)

#: Longest wait between two looks at `spec.recommendation.interval` (seconds).
INTERVAL_SLICE = 10.0


async def refresh_recommendation(
    kube: KubeClient, name: str, deployments: Iterable[Mapping[str, Any]], view: PoolView | None = None
) -> PoolRecommendation | None:
    """One refresh of KVPool `name`, whose `deployments` (their spec and `status.kv`, from the watch-fed
    `curve_deployments` index) name it: the recommendation now in its status (None: the pool is gone)."""
    body = await read_pool(kube, name, view)
    if body is None:
        return None
    pool = parse(KVPool, body)
    settings = pool.spec.recommendation
    [live] = live_pools([body], deployments, preset(DEFAULT_COST_MODEL))
    # CPU-bound (under a second for a few deployments): off the event loop.
    now = datetime.now(UTC).replace(microsecond=0)  # as the status keeps it
    fresh = await asyncio.to_thread(recommend, live, settings.min_gain_per_doubling, now)
    flipped: list[PoolRecommendation] = []

    def change(pool: KVPool, status: KVPoolStatus) -> KVPoolStatus:
        old = status.recommendation
        state = advance(
            Sizing(old.undersized, old.streak) if old else Sizing(False, 0),
            undersized(fresh, settings.undersized_margin),
            settings.undersized_refreshes,
        )
        new = fresh.model_copy(update={"undersized": state.undersized, "streak": state.streak})
        flipped[:] = [new] if state.flipped else []
        return status.model_copy(update={"recommendation": new}) if material(old, new) else status

    try:
        _, status = await update_pool_status(kube, name, change, view)
    except PoolGone:
        return None
    for new in flipped:
        await _post_flip(kube, body, new, settings)
    return status.recommendation


async def _post_flip(
    kube: KubeClient, body: Mapping[str, Any], recommendation: PoolRecommendation, settings: RecommendationSpec
) -> None:
    capacity = format_quantity(recommendation.capacity)
    recommended = (
        "none" if recommendation.recommended_capacity is None else format_quantity(recommendation.recommended_capacity)
    )
    if recommendation.undersized:
        await post_event(
            kube,
            body,
            "Warning",
            "PoolUndersized",
            f"the deployments' demand calls for {recommended}, more than {1 + settings.undersized_margin:g}x the "
            f"capacity {capacity}, for {settings.undersized_refreshes} refreshes in a row: {recommendation.reason}",
        )
    else:
        await post_event(
            kube,
            body,
            "Normal",
            "PoolSized",
            f"the recommended capacity {recommended} is within {1 + settings.undersized_margin:g}x the capacity "
            f"{capacity} again: {recommendation.reason}",
        )


def _interval(spec: Mapping[str, Any]) -> float:
    """`spec.recommendation.interval` in seconds (the default when it does not parse: the reconcile says why)."""
    try:
        return RecommendationSpec.model_validate(spec.get("recommendation") or {}).interval
    except ValidationError:
        return RecommendationSpec().interval


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    @kopf.index(*DEPLOYMENTS, id="curve_deployments", registry=registry)
    async def curve_deployments(body: kopf.Body, **_: Any) -> dict[str, dict[str, Any]] | None:
        """Pool name -> the InferenceDeployments that name it, with the demand curve their `status.kv`
        publishes (the refresh reads no deployment from the API)."""
        pool = (((body.get("spec") or {}).get("kvCache") or {}).get("storage") or {}).get("poolRef")
        if not pool:
            return None
        return {
            pool: {
                "apiVersion": body["apiVersion"],
                "kind": body["kind"],
                "metadata": {"name": body.metadata.name, "namespace": body.metadata.namespace},
                "spec": dict(body.spec),
                "status": {"kv": dict(body.status["kv"])} if body.status.get("kv") else {},
            }
        }

    @kopf.daemon(*POOL, id="recommendation", registry=registry, cancellation_timeout=10)
    async def recommendation(
        name: str,
        spec: kopf.Spec,
        memo: kopf.Memo,
        stopped: kopf.DaemonStopped,
        curve_deployments: kopf.Index,
        **_: Any,
    ) -> None:
        """A refresh every `spec.recommendation.interval` (read anew each time) until the pool goes."""
        while not stopped:
            started = time.monotonic()
            while not stopped and time.monotonic() - started < _interval(spec):
                await stopped.wait(min(INTERVAL_SLICE, _interval(spec) - (time.monotonic() - started)))
            if stopped:
                break
            try:
                await refresh_recommendation(memo.kube, name, list(curve_deployments.get(name, ())), memo.pool_view)
            except (APIError, aiohttp.ClientError, TimeoutError, InvalidSpec, ValueError) as error:
                log.warning("KVPool %s: capacity recommendation skipped: %s", name, error)
            except Exception:
                log.exception("KVPool %s: capacity recommendation failed", name)
