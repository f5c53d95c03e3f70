"""Where to scrape: the Ready replicas of every InferenceDeployment, kept current by a pod watch.

:class:`TargetIndex` holds one :class:`Target` per Ready pod that carries the
``kvtier.io/deployment`` label (every rendered replica does), keyed by the deployment's
``(namespace, name)``. :meth:`TargetIndex.run` lists the pods once, then follows a watch from
that list's resourceVersion, resuming from the last version seen when the server ends the
stream and listing again only when the server says the version is gone (410). A scrape cycle
reads :meth:`TargetIndex.by_deployment` and never calls the API.

A target's endpoints are the ``/metrics`` pages of its ``vllm`` container (port ``http``), its
``lmcache`` container (port ``lmcache-api``: LMCache 0.5.6 serves ``/metrics`` on its HTTP port) and its ``kvtier-probe`` sidecar (port
``probe-metrics``), and the LMCache MP quota API (``GET /quota`` on port ``lmcache-api``: storage
quota and usage), each present only if the pod declares the port.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from kvtier.contract import (
    DEPLOYMENT_LABEL,
    HTTP_PORT,
    LMCACHE_API_PORT,
    LMCACHE_CONTAINER,
    METRICS_PATH,
    PROBE_CONTAINER,
    PROBE_METRICS_PORT,
    QUOTA_PATH,
    VLLM_CONTAINER,
)
from kvtier.kube import PODS, APIError, KubeClient

log = logging.getLogger(__name__)

#: Endpoint kind -> (container name, port name, path) in a rendered replica.
ENDPOINTS: dict[str, tuple[str, str, str]] = {
    "vllm": (VLLM_CONTAINER, HTTP_PORT, METRICS_PATH),
    "lmcache": (LMCACHE_CONTAINER, LMCACHE_API_PORT, METRICS_PATH),
    "probe": (PROBE_CONTAINER, PROBE_METRICS_PORT, METRICS_PATH),
    "quota": (LMCACHE_CONTAINER, LMCACHE_API_PORT, QUOTA_PATH),
}

DeploymentKey = tuple[str, str]


@dataclass(frozen=True)
class Target:
    """One Ready replica: its address and the port of each metrics endpoint it has."""

    namespace: str
    deployment: str
    pod: str
    ip: str
    ports: tuple[tuple[str, int], ...]
    """``(endpoint kind, port)`` pairs, in :data:`ENDPOINTS` order."""

    @property
    def key(self) -> DeploymentKey:
        return self.namespace, self.deployment

    def urls(self) -> dict[str, str]:
        """Endpoint kind -> URL (``http://ip:port/metrics``, ``http://ip:port/quota``)."""
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return {kind: f"http://{host}:{port}{ENDPOINTS[kind][2]}" for kind, port in self.ports}


def _ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if pod.get("metadata", {}).get("deletionTimestamp") or not status.get("podIP"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def target_of(pod: Mapping[str, Any]) -> Target | None:
    """The pod as a scrape target, or None when it is not a Ready kvtier replica."""
    metadata = pod.get("metadata") or {}
    deployment = (metadata.get("labels") or {}).get(DEPLOYMENT_LABEL)
    if not deployment or not _ready(pod):
        return None
    containers = {c.get("name"): c for c in (pod.get("spec") or {}).get("containers") or []}
    ports = []
    for kind, (container_name, port_name, _) in ENDPOINTS.items():
        container = containers.get(container_name)
        if container is None:
            continue
        port = next((p.get("containerPort") for p in container.get("ports") or [] if p.get("name") == port_name), None)
        if isinstance(port, int) and 0 < port < 65536:
            ports.append((kind, port))
    if not ports:
        return None
    return Target(
        metadata.get("namespace") or "", deployment, metadata.get("name") or "", pod["status"]["podIP"], tuple(ports)
    )


class TargetIndex:
    """Ready replicas by deployment, fed by pod events (:meth:`apply`) or a watch of its own (:meth:`run`)."""

    def __init__(self, namespaces: Iterable[str] = ()) -> None:
        #: Namespaces watched (empty: all).
        self.namespaces = tuple(namespaces) or (None,)
        self._targets: dict[tuple[str | None, str], Target] = {}  # (namespace, pod uid or name) -> target
        #: Every replica (Ready or not) by deployment, then by (namespace, pod uid or name): what the
        #: InferenceDeployment controller reads for its Ready condition and quotas instead of listing.
        #: Kept: metadata (without managedFields) and status; a pod's spec, most of its size, is read
        #: only here, into its :class:`Target`.
        self._pods: dict[DeploymentKey, dict[tuple[str | None, str], dict[str, Any]]] = {}
        #: Set once every watched namespace has been listed.
        self.synced = asyncio.Event()
        #: Lists done so far (the first, and one per expired resourceVersion).
        self.lists = 0
        self._listed: set[str | None] = set()

    def apply(self, kind: str, pod: Mapping[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED, DELETED) for a pod."""
        metadata = pod.get("metadata") or {}
        key = (metadata.get("namespace"), metadata.get("uid") or metadata.get("name") or "")
        target = target_of(pod) if kind != "DELETED" else None
        deployment = (metadata.get("labels") or {}).get(DEPLOYMENT_LABEL)
        if deployment:
            owner = (metadata.get("namespace") or "", deployment)
            if kind == "DELETED":
                self._pods.get(owner, {}).pop(key, None)
            else:
                trimmed = {k: v for k, v in pod.items() if k not in ("metadata", "spec")}
                trimmed["metadata"] = {k: v for k, v in metadata.items() if k != "managedFields"}
                self._pods.setdefault(owner, {})[key] = trimmed
            if owner in self._pods and not self._pods[owner]:
                del self._pods[owner]
        if target is None:
            self._targets.pop(key, None)
        else:
            self._targets[key] = target

    def replace(self, namespace: str | None, pods: Iterable[Mapping[str, Any]]) -> None:
        """A fresh list of a namespace (None: all) replaces what was known of it."""
        for key in [key for key in self._targets if namespace is None or key[0] == namespace]:
            del self._targets[key]
        for owner in [owner for owner in self._pods if namespace is None or owner[0] == namespace]:
            del self._pods[owner]
        for pod in pods:
            self.apply("ADDED", pod)

    def pods_of(self, namespace: str, deployment: str) -> list[dict[str, Any]] | None:
        """The deployment's replicas as the watch last saw them; None until the first list is in."""
        if not self.synced.is_set():
            return None
        return list(self._pods.get((namespace, deployment), {}).values())

    def targets(self) -> list[Target]:
        return sorted(self._targets.values(), key=lambda t: (t.namespace, t.deployment, t.pod))

    def by_deployment(self) -> dict[DeploymentKey, list[Target]]:
        grouped: dict[DeploymentKey, list[Target]] = {}
        for target in self.targets():
            grouped.setdefault(target.key, []).append(target)
        return grouped

    async def run(self, kube: KubeClient, *, timeout_seconds: int = 300, backoff: float = 1.0) -> None:
        """Keep the index current until cancelled (one watch per namespace)."""
        await asyncio.gather(*(self._follow(kube, ns, timeout_seconds, backoff) for ns in self.namespaces))

    async def _follow(self, kube: KubeClient, namespace: str | None, timeout_seconds: int, backoff: float) -> None:
        selector = DEPLOYMENT_LABEL
        version: str | None = None
        failures = 0
        while True:
            try:
                if version is None:
                    listed = await kube.list(PODS, namespace, label_selector=selector)
                    self.replace(namespace, listed.get("items") or [])
                    self.lists += 1
                    version = (listed.get("metadata") or {}).get("resourceVersion")
                    self._listed.add(namespace)
                    if len(self._listed) == len(self.namespaces):
                        self.synced.set()
                async for event in kube.watch(
                    PODS, namespace, resource_version=version, timeout_seconds=timeout_seconds, label_selector=selector
                ):
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            version = None  # too old: list again
                            break
                        raise APIError(int(obj.get("code") or 500), obj, "WATCH", PODS.path(namespace))
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self.apply(kind, obj)
                failures = 0
            except asyncio.CancelledError:
                raise
            except APIError as error:
                if error.status == 410:
                    version = None
                failures += 1
                log.warning("pod watch (%s): %s", namespace or "all namespaces", error)
            except (TimeoutError, aiohttp.ClientError, ValueError) as error:
                failures += 1
                log.warning("pod watch (%s): %s", namespace or "all namespaces", error)
            if failures:
                await asyncio.sleep(min(30.0, backoff * 2 ** min(failures - 1, 5)) * (0.5 + random.random() / 2))
