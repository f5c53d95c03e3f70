"""What the kubelets of the simulated nodes do; runs against the embedded API server or a real one."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kvtier.kube import NODES, PODS, STRATEGIC_PATCH, APIError, KubeClient
from kvtier.testing.engines import EngineFactory, RunningEngine
from kvtier.testing.podsim.nodes import NodeSpec
from kvtier.testing.podsim.objects import isolated, now, pod_condition

log = logging.getLogger(__name__)


class AddressPool:
    """Distinct pod addresses in 127.0.0.0/8 (127.0.0.1 is left to the API server).

    By default a random ``127.N.0.0/16`` (N in 100..250, clear of the addresses tests pick by
    hand), so embedded clusters in parallel processes on one machine do not collide.
    """

    def __init__(self, network: str | None = None):
        network = network or f"127.{random.randint(100, 250)}.0.0/16"
        self._free = iter(ipaddress.ip_network(network).hosts())
        self._released: list[str] = []
        self._by_pod: dict[str, str] = {}

    def take(self, pod_uid: str) -> str:
        if pod_uid not in self._by_pod:
            self._by_pod[pod_uid] = self._released.pop(0) if self._released else str(next(self._free))
        return self._by_pod[pod_uid]

    def release(self, pod_uid: str) -> None:
        address = self._by_pod.pop(pod_uid, None)
        if address:
            self._released.append(address)


@dataclass
class RunningPod:
    uid: str
    address: str
    engines: list[RunningEngine]
    probe_failures: dict[str, int] = field(default_factory=dict)  # consecutive failed readiness probes
    last_probes: dict[str, tuple[float, bool]] = field(default_factory=dict)  # when and how each container answered


class Kubelet:
    """Node registration and the pods bound to those nodes: engines on pod addresses, probes, status."""

    kube: KubeClient
    nodes: list[NodeSpec]
    engine_factory: EngineFactory
    addresses: AddressPool
    exit_code: Callable[[dict[str, Any]], int]
    probe_periods: bool
    _running: dict[str, RunningPod]
    _http: aiohttp.ClientSession | None

    async def register_nodes(self) -> None:
        """Create the simulated Node objects (ready, with their allocatable resources)."""
        for node in self.nodes:
            if await self.kube.get_or_none(NODES, None, node.name) is None:
                await self.kube.create(NODES, node.as_object())
            await self.kube.patch(NODES, None, node.name, {"status": node.status()}, subresource="status")
        self._nodes_registered = True

    async def heartbeat(self, interval: float = 10.0) -> None:
        """Renew the nodes' Ready condition, as kubelets do (a real node lifecycle controller
        taints a silent node unreachable after 40s and then evicts its pods)."""
        while True:
            await asyncio.sleep(interval)
            for node in self.nodes:
                try:
                    await self.kube.patch(NODES, None, node.name, {"status": node.status()}, subresource="status")
                except (APIError, aiohttp.ClientError) as error:
                    log.debug("heartbeat of node %s: %s", node.name, error)

    async def _run_kubelets(self, pods: list[dict[str, Any]]) -> None:
        alive = set()
        updates = []
        mine = {node.name for node in self.nodes}
        for pod in pods:
            uid = pod["metadata"]["uid"]
            if pod["spec"].get("nodeName") not in mine:
                continue
            if pod["metadata"].get("deletionTimestamp"):
                await self._stop_pod(uid)
                if not pod["metadata"].get("finalizers"):  # the containers are gone: end the grace period
                    await isolated(
                        pod,
                        self.kube.delete(
                            PODS, pod["metadata"]["namespace"], pod["metadata"]["name"], grace_period_seconds=0
                        ),
                    )
                continue
            if pod["spec"].get("restartPolicy", "Always") != "Always":
                if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                    updates.append(isolated(pod, self._complete_pod(pod)))
                continue
            alive.add(uid)
            if uid not in self._running:
                await self._start_pod(pod)
            updates.append(isolated(pod, self._update_pod_status(pod)))
        await asyncio.gather(*updates)  # probes of different pods run concurrently
        for uid in list(self._running):
            if uid not in alive:
                await self._stop_pod(uid)

    def engines(self, uid: str) -> list[RunningEngine]:
        """What serves a running pod's containers, in container order (for fault injection in tests)."""
        running = self._running.get(uid)
        return list(running.engines) if running is not None else []

    async def _complete_pod(self, pod: dict[str, Any]) -> None:
        """A run-to-completion pod: every container exits with `exit_code(pod)`."""
        code = self.exit_code(pod)
        reason = "Completed" if code == 0 else "Error"
        statuses = [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": code, "reason": reason, "startedAt": now(), "finishedAt": now()}},
            }
            for c in pod["spec"].get("containers", [])
        ]
        status = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "hostIP": "127.0.0.1",
            "startTime": (pod.get("status") or {}).get("startTime") or now(),
            "containerStatuses": statuses,
        }
        conditions = {
            "PodScheduled": ("True", "", ""),
            "Initialized": ("True", "", ""),
            "ContainersReady": ("False", "PodCompleted", ""),
            "Ready": ("False", "PodCompleted", ""),
        }
        await self._set_pod_conditions(pod, conditions, status)

    async def _start_pod(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        address = self.addresses.take(uid)
        engines = []
        for container in pod["spec"].get("containers", []):
            try:
                engines.append(await self.engine_factory(pod, container, address))
            except OSError as error:
                log.warning("cannot serve %s/%s on %s: %s", pod["metadata"]["name"], container["name"], address, error)
        self._running[uid] = RunningPod(uid, address, engines)

    async def _stop_pod(self, uid: str) -> None:
        running = self._running.pop(uid, None)
        if running is None:
            return
        for engine in running.engines:
            await engine.stop()
        self.addresses.release(uid)

    async def _probe_when_due(self, running: RunningPod, container: dict[str, Any]) -> tuple[bool, bool]:
        """The container's readiness and whether it was probed just now: every pass, or (`probe_periods`) once
        per `readinessProbe.periodSeconds` (default 10) as a kubelet does."""
        name = container["name"]
        last = running.last_probes.get(name)
        period = float((container.get("readinessProbe") or {}).get("periodSeconds", 10))
        if self.probe_periods and last is not None and time.monotonic() - last[0] < period:
            return last[1], False
        ready = await self._probe(running.address, container)
        running.last_probes[name] = (time.monotonic(), ready)
        return ready, True

    async def _probe(self, address: str, container: dict[str, Any]) -> bool:
        probe = container.get("readinessProbe") or {}
        http_get = probe.get("httpGet")
        if http_get is None:
            return True
        port = http_get.get("port")
        if isinstance(port, str):
            port = next((p["containerPort"] for p in container.get("ports", []) if p.get("name") == port), None)
        if port is None:
            return False
        assert self._http is not None
        try:
            timeout = aiohttp.ClientTimeout(total=float(probe.get("timeoutSeconds", 1)))  # the kubelet's default: 1 s
            async with self._http.get(f"http://{address}:{port}{http_get.get('path', '/')}", timeout=timeout) as reply:
                return 200 <= reply.status < 400
        except (TimeoutError, aiohttp.ClientError):
            return False

    async def _update_pod_status(self, pod: dict[str, Any]) -> None:
        running = self._running[pod["metadata"]["uid"]]
        statuses = []
        containers = pod["spec"].get("containers", [])
        probes = await asyncio.gather(*(self._probe_when_due(running, container) for container in containers))
        for container, (probed, fresh) in zip(containers, probes):
            previous = next(
                (s for s in (pod.get("status") or {}).get("containerStatuses", []) if s["name"] == container["name"]),
                None,
            )
            # As a kubelet: a ready container turns unready after `failureThreshold` (default 3) failures in a row.
            failures = 0 if probed else running.probe_failures.get(container["name"], 0) + fresh
            running.probe_failures[container["name"]] = failures
            threshold = (container.get("readinessProbe") or {}).get("failureThreshold", 3)
            ready = probed or (bool((previous or {}).get("ready")) and failures < threshold)
            started_at = (previous or {}).get("state", {}).get("running", {}).get("startedAt") or now()
            statuses.append(
                {
                    "name": container["name"],
                    "image": container.get("image", ""),
                    "imageID": "",
                    "ready": ready,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": started_at}},
                }
            )
        containers_ready = all(s["ready"] for s in statuses)
        gates = [g["conditionType"] for g in pod["spec"].get("readinessGates", [])]
        gates_open = all((pod_condition(pod, gate) or {}).get("status") == "True" for gate in gates)
        ready = containers_ready and gates_open
        reason = "" if ready else ("ContainersNotReady" if not containers_ready else "ReadinessGatesNotReady")
        conditions = {
            "PodScheduled": ("True", "", ""),
            "Initialized": ("True", "", ""),
            "ContainersReady": (
                "True" if containers_ready else "False",
                "" if containers_ready else "ContainersNotReady",
                "",
            ),
            "Ready": ("True" if ready else "False", reason, ""),
        }
        status = {
            "phase": "Running",
            "podIP": running.address,
            "podIPs": [{"ip": running.address}],
            "hostIP": "127.0.0.1",
            "startTime": (pod.get("status") or {}).get("startTime") or now(),
            "containerStatuses": statuses,
        }
        if pod["spec"].get("initContainers"):
            status["initContainerStatuses"] = [
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
                }
                for c in pod["spec"]["initContainers"]
            ]
        await self._set_pod_conditions(pod, conditions, status)

    async def _set_pod_conditions(
        self, pod: dict[str, Any], conditions: dict[str, tuple[str, str, str]], status: dict[str, Any] | None = None
    ) -> None:
        """Write the kubelet's conditions, keeping others' (readiness gates) untouched; skip no-op writes.

        As a kubelet's status manager does, the patch is a strategic merge that names only the kubelet's own
        conditions (merged by `type`): a readiness gate the operator set after this copy of the pod was read
        survives (a merge patch replaces the whole list, and under load erased gates the copy had not seen yet).
        """
        current = (pod.get("status") or {}).get("conditions", [])
        merged = [c for c in current if c.get("type") not in conditions]
        own = []
        for kind, (value, reason, message) in conditions.items():
            old = next((c for c in current if c.get("type") == kind), None)
            same = old is not None and old.get("status") == value
            entry = {
                "type": kind,
                "status": value,
                "lastTransitionTime": old.get("lastTransitionTime") if same and old else now(),
            }
            if reason:
                entry["reason"] = reason
            if message:
                entry["message"] = message
            own.append(entry)
        new_status = {**(status or {}), "conditions": merged + own}
        old_status = pod.get("status") or {}

        def comparable(value: Any, key: str) -> Any:
            if key == "conditions":  # merged by type: the order the server keeps them in does not matter
                return {c.get("type"): comparable(c, "") for c in value or []}
            return json.loads(json.dumps(value, sort_keys=True))

        if all(comparable(old_status.get(k), k) == comparable(v, k) for k, v in new_status.items()):
            return
        try:
            await self.kube.patch(
                PODS,
                pod["metadata"]["namespace"],
                pod["metadata"]["name"],
                {"status": {**new_status, "conditions": own}},
                subresource="status",
                content_type=STRATEGIC_PATCH,
            )
        except APIError as error:
            if error.status != 404:
                raise
