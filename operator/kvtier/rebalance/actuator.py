"""Applying a replica's storage quota on its LMCache MP server, and opening its readiness gate.

`PUT /quota/_default {"limit_gb": x}` sets the limit of requests that carry no `cache_salt`
(under IsolatedLRU a salt without a quota gets no L2 at all); a `GET` confirms it. Only then is
the pod's `kvtier.io/kv-quota-applied` condition set, so a replica takes traffic only with its
tier in place. Every call is idempotent: the controller repeats them each resync.

A replica whose `lmcache` container keeps exiting is reported with LMCache's own last words (the
container's termination message: rendered with `FallbackToLogsOnError`, so the log tail), and the
one known cause named: an image without `lmcache-rust-raw-block-io`, which the `raw_block` adapter
needs and lmcache 0.5.6 does not install.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from kvtier.api.units import GIB, gib
from kvtier.contract import DEFAULT_SALT, LMCACHE_CONTAINER, QUOTA_GATE, quota_path
from kvtier.kube import PODS, APIError, KubeClient

#: What LMCache 0.5.6 says when the raw_block adapter's Rust extension is missing (tests/conformance pins it).
RAW_BLOCK_MISSING = "Rust raw-block extension is not installed"
RAW_BLOCK_HINT = (
    "the lmcache image lacks the raw_block adapter's extension: install "
    "`lmcache-rust-raw-block-io` (pip install --pre 'lmcache-rust-raw-block-io==0.5.7rc2') in it"
)
#: How `set_quota` says that the server did not answer in time.
NO_ANSWER = "no answer"
#: Quotas are compared at this precision (LMCache keeps `limit_gb` as a float).
GIB_TOLERANCE = 1e-6


@dataclass(frozen=True)
class QuotaResult:
    pod: str
    applied: bool
    detail: str
    skipped: bool = False
    """The replica does not serve: not up yet, or gone (deleted, replaced) during the call. Nothing to
    apply to; its successor gets its quota before it takes traffic (the readiness gate)."""
    unanswered: bool = False
    """The server did not answer in time, on a replica whose quota was applied before (its gate is open):
    it keeps serving with that quota; a resync repeats the call rather than calling the replica failed."""


def _container_ready(pod: dict[str, Any], name: str) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses", [])
    return any(s.get("name") == name and s.get("ready") for s in statuses)


def exit_reason(pod: dict[str, Any], name: str) -> str | None:
    """Why container `name` last exited, when it did: its termination message, the known cause named first."""
    for status in (pod.get("status") or {}).get("containerStatuses", []):
        if status.get("name") != name:
            continue
        for state in (status.get("state") or {}, status.get("lastState") or {}):
            terminated = state.get("terminated")
            if terminated and terminated.get("exitCode", 0) != 0:
                message = (terminated.get("message") or "").strip()
                if RAW_BLOCK_MISSING in message:
                    return f"container {name} exits: {RAW_BLOCK_HINT} ({RAW_BLOCK_MISSING})"
                last = message.splitlines()[-1][:300] if message else terminated.get("reason", "")
                return f"container {name} exits with code {terminated.get('exitCode')}: {last}"
    return None


def _gate_open(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions", [])
    return any(c.get("type") == QUOTA_GATE and c.get("status") == "True" for c in conditions)


def quota_in_place(pod: dict[str, Any], quota_bytes: int, scraped_bytes: float | None) -> bool:
    """Whether a replica already serves `quota_bytes`: its gate is open and its server reported that quota at
    its last fresh scrape. A resync calls only the others, so steady state makes no quota call; a server that
    lost its quota (a restarted container) reports none, and is called again."""
    return (
        _gate_open(pod) and scraped_bytes is not None and abs(scraped_bytes / GIB - gib(quota_bytes)) <= GIB_TOLERANCE
    )


async def set_quota(http: aiohttp.ClientSession, address: str, port: int, quota_bytes: int) -> str | None:
    """Set and verify one server's `_default` quota; None on success, else what went wrong."""
    url = f"http://{address}:{port}{quota_path()}"
    limit = gib(quota_bytes)
    try:
        async with http.get(url) as reply:
            current = await reply.json() if reply.status == 200 else {}
        if current.get("exists") and abs(float(current.get("limit_gb", -1)) - limit) < GIB_TOLERANCE:
            return None
        async with http.put(url, json={"limit_gb": limit}) as reply:
            if reply.status >= 300:
                return f"PUT {url}: HTTP {reply.status} {(await reply.text())[:200]}"
        async with http.get(url) as reply:
            confirmed = await reply.json()
        if abs(float(confirmed.get("limit_gb", -1)) - limit) >= GIB_TOLERANCE:
            return f"GET {url} reads limit_gb={confirmed.get('limit_gb')} after setting {limit}"
    except TimeoutError:
        return f"{url}: {NO_ANSWER} within {http.timeout.total:g} s"
    except (aiohttp.ClientError, ValueError) as error:
        return f"{url}: {str(error) or type(error).__name__}"
    return None


async def open_gate(kube: KubeClient, pod: dict[str, Any], message: str) -> None:
    """Set the pod's quota readiness condition (a conditional write: a newer pod status wins)."""
    status = dict(pod.get("status") or {})
    conditions = [c for c in status.get("conditions", []) if c.get("type") != QUOTA_GATE]
    conditions.append(
        {
            "type": QUOTA_GATE,
            "status": "True",
            "reason": "QuotaApplied",
            "message": message,
            "lastTransitionTime": status.get("startTime") or pod["metadata"]["creationTimestamp"],
        }
    )
    await kube.replace(PODS, {**pod, "status": {**status, "conditions": conditions}}, subresource="status")


async def apply_quotas(
    kube: KubeClient,
    http: aiohttp.ClientSession,
    pods: list[dict[str, Any]],
    quota_bytes: int,
    port: int,
    replicas_now: Callable[[], Awaitable[list[dict[str, Any]]]],
    container: str = LMCACHE_CONTAINER,
) -> list[QuotaResult]:
    """Bring every running replica to `quota_bytes` and open its gate; replicas not serving are skipped.

    `replicas_now` gives the deployment's replicas as the pod watch has them now: after a failed call, it
    tells a replica that was replaced or deleted meanwhile from one that still serves (no GET per pod).
    """

    def serving(pod: dict[str, Any]) -> bool:
        address = (pod.get("status") or {}).get("podIP")
        return bool(address) and _container_ready(pod, container) and not pod["metadata"].get("deletionTimestamp")

    async def gone_meanwhile(pod: dict[str, Any]) -> bool:
        """Whether the replica stopped serving while we called it (a rolling update replacing it, a scale-down)."""
        try:
            now = {p["metadata"].get("uid"): p for p in await replicas_now()}
        except APIError:
            return False  # cannot tell: report what the call met
        current = now.get(pod["metadata"].get("uid"))
        return current is None or not serving(current)

    async def one(pod: dict[str, Any]) -> QuotaResult:
        name = pod["metadata"]["name"]
        if not serving(pod):
            reason = exit_reason(pod, container)
            return QuotaResult(name, False, reason or "not running yet", skipped=reason is None)
        problem = await set_quota(http, address=pod["status"]["podIP"], port=port, quota_bytes=quota_bytes)
        if problem and await gone_meanwhile(pod):
            return QuotaResult(name, False, f"stopped serving during the call ({problem})", skipped=True)
        if problem:
            return QuotaResult(name, False, problem, unanswered=NO_ANSWER in problem and _gate_open(pod))
        if not _gate_open(pod):
            try:
                await open_gate(kube, pod, f"limit_gb={gib(quota_bytes):g} on {DEFAULT_SALT}")
            except APIError as error:
                if error.status not in (404, 409):  # gone, or changed meanwhile: the next resync retries
                    raise
                return QuotaResult(name, False, f"pod changed while opening the gate ({error.status})")
        return QuotaResult(name, True, "")

    return list(await asyncio.gather(*(one(pod) for pod in pods)))
