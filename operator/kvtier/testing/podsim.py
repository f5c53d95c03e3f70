"""The pod simulator: what kube-controller-manager, the scheduler and the kubelets do, for the embedded cluster.

It is an ordinary API client (it would work against any API server) and runs level-based: every
change it watches, and a tick every `resync` seconds (for readiness probes), triggers one pass
that looks at everything and fixes what differs. Simplifications, deliberately:

- StatefulSets: ordinal pods `<sts>-<i>` and PVCs `<template>-<sts>-<i>`; `Parallel` and
  `OrderedReady` creation; scale-down from the highest ordinal; rolling updates delete the
  highest-ordinal outdated pod only while every pod is Ready (one at a time, as `RollingUpdate`
  with `maxUnavailable: 1`); PVCs owned by the StatefulSet only when
  `persistentVolumeClaimRetentionPolicy.whenDeleted` is `Delete`; with `whenScaled: Delete` the
  claims of ordinals scaled away are deleted once their pod is gone.
- Deployments: pods owned by the Deployment directly (no ReplicaSets), named
  `<deployment>-<revision>-<n>`; new pods first, outdated ones deleted once the new are Ready.
- Jobs: one pod at a time (`<job>-<random>`), a new one after a failure until `backoffLimit`
  (default 6) failures; `succeeded: 1` and the conditions `SuccessCriteriaMet` and `Complete` after a
  success, `FailureTarget` and `Failed` (reason `BackoffLimitExceeded`) after too many failures.
- Volumes: a PVC binds to the PV whose `claimRef` names it, else to its `volumeName`, else an
  Available PV of its class, mode and size, else a PV provisioned for an existing StorageClass.
  A PV whose claim is gone becomes Released (Retain) or is deleted (Delete). A bound claim whose
  request grew past its `status.capacity` is expanded at once, as the external resizer and the
  node plugin would: its PV's capacity and the claim's `status.capacity` become the request (the
  API server's admission already refused growth the StorageClass does not allow).
- Scheduling: first node (by name) whose allocatable CPU, memory, `nvidia.com/gpu` and pods
  still fit the pod's requests and whose labels match its `nodeSelector`; taints are not modelled.
  Binding writes `spec.nodeName` directly.
- Kubelets: each pod gets its own address in 127.0.0.0/8; every container's declared ports are
  served by the engine factory; a container is ready when its `readinessProbe.httpGet` answers
  200 (or at once without a probe); the pod is Ready when all containers are and every
  `readinessGates` condition is True. A deleted pod's engines stop at once. Pods whose
  `restartPolicy` is `Never` or `OnFailure` run to completion instead of serving: once scheduled
  they end `Succeeded`, or `Failed` when `exit_code(pod)` (a test's hook; 0 by default) is not 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import json
import logging
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import aiohttp

from kvtier.api.units import quantity_value
from kvtier.kube import (
    DEPLOYMENTS,
    JOBS,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    PODS,
    STATEFULSETS,
    STORAGECLASSES,
    APIError,
    KubeClient,
)
from kvtier.testing.engines import EngineFactory, RunningEngine, stub_engine

log = logging.getLogger(__name__)

GPU = "nvidia.com/gpu"
_KUBELET_CONDITIONS = ("PodScheduled", "Initialized", "ContainersReady", "Ready")


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:10]


@dataclass(frozen=True)
class NodeSpec:
    """A simulated node's allocatable resources."""

    name: str
    cpu: str = "128"
    memory: str = "2Ti"
    gpus: int = 8
    pods: int = 110
    labels: dict[str, str] = field(default_factory=dict)

    def as_object(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": {"kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux", **self.labels},
            },
            "spec": {},
        }

    def status(self) -> dict[str, Any]:
        allocatable = {"cpu": self.cpu, "memory": self.memory, GPU: str(self.gpus), "pods": str(self.pods)}
        return {
            "capacity": allocatable,
            "allocatable": allocatable,
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "simulated node",
                 "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}
            ],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": self.name}],
            "nodeInfo": {
                "machineID": self.name, "systemUUID": self.name, "bootID": self.name,
                "kernelVersion": "simulated", "osImage": "kvtier pod simulator",
                "containerRuntimeVersion": "kvtier-sim://1", "kubeletVersion": "v1.33.0-kvtier-sim",
                "kubeProxyVersion": "v1.33.0-kvtier-sim", "operatingSystem": "linux", "architecture": "amd64",
            },
        }


def pod_requests(pod: dict[str, Any]) -> dict[str, Decimal]:
    """Effective requests: the sum over containers (a missing request is its limit), at least each init container."""

    def of(container: dict[str, Any]) -> dict[str, Decimal]:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {name: quantity_value(str(value)) for name, value in merged.items()}

    total: dict[str, Decimal] = {}
    for container in pod["spec"].get("containers", []):
        for name, value in of(container).items():
            total[name] = total.get(name, Decimal(0)) + value
    for container in pod["spec"].get("initContainers", []):
        for name, value in of(container).items():
            total[name] = max(total.get(name, Decimal(0)), value)
    return total


def _owned_by(obj: dict[str, Any], owner: dict[str, Any]) -> bool:
    uid = owner["metadata"]["uid"]
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences", []))


def _owner_reference(owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _condition(pod: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in (pod.get("status") or {}).get("conditions", []) if c.get("type") == kind), None)


async def _isolated(obj: dict[str, Any], step: Any) -> None:
    """Run one object's step; its API errors (a terminating namespace, a lost race) do not stop the pass."""
    try:
        await step
    except APIError as error:
        log.debug("%s %s/%s: %s", obj.get("kind"), obj["metadata"].get("namespace"), obj["metadata"]["name"], error)


def _job_condition(kind: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": kind, "status": "True", "reason": reason, "message": message,
            "lastProbeTime": _now(), "lastTransitionTime": _now()}


def is_ready(pod: dict[str, Any]) -> bool:
    condition = _condition(pod, "Ready")
    return bool(condition and condition.get("status") == "True")


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
class _RunningPod:
    uid: str
    address: str
    engines: list[RunningEngine]


class PodSimulator:
    """Controllers, scheduler and kubelets for simulated nodes; `await run()` until cancelled."""

    def __init__(
        self,
        kube: KubeClient,
        nodes: list[NodeSpec],
        *,
        engine_factory: EngineFactory = stub_engine,
        addresses: AddressPool | None = None,
        resync: float = 0.5,
        exit_code: Callable[[dict[str, Any]], int] = lambda pod: 0,
    ):
        self.kube = kube
        self.nodes = nodes
        self.engine_factory = engine_factory
        self.addresses = addresses or AddressPool()
        self.resync = resync
        #: The exit code of a run-to-completion pod (restartPolicy Never or OnFailure); tests replace it.
        self.exit_code = exit_code
        self._running: dict[str, _RunningPod] = {}  # by pod uid
        self._wake = asyncio.Event()
        self._http: aiohttp.ClientSession | None = None
        self.passes = 0
        self._nodes_registered = False

    async def run(self) -> None:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1))
        watchers = [
            asyncio.create_task(self._watch(resource), name=f"podsim-watch-{resource.plural}")
            for resource in (STATEFULSETS, DEPLOYMENTS, JOBS, PODS, PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES, NODES)
        ]
        try:
            while True:
                try:
                    await self.reconcile()
                except APIError as error:
                    log.debug("pod simulator pass interrupted: %s", error)
                except aiohttp.ClientError as error:
                    log.warning("pod simulator cannot reach the API: %s", error)
                self.passes += 1
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.resync)
                self._wake.clear()
        finally:
            for task in watchers:
                task.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
            for running in list(self._running.values()):
                await self._stop_pod(running.uid)
            await self._http.close()

    async def _watch(self, resource) -> None:  # noqa: ANN001 - a kvtier.kube.Resource
        while True:
            try:
                async for _ in self.kube.watch(resource, timeout_seconds=60):
                    self._wake.set()
            except (APIError, aiohttp.ClientError, asyncio.TimeoutError) as error:
                log.debug("pod simulator watch of %s ended: %s", resource.plural, error)
                await asyncio.sleep(0.5)

    async def register_nodes(self) -> None:
        """Create the simulated Node objects (ready, with their allocatable resources)."""
        for node in self.nodes:
            if await self.kube.get_or_none(NODES, None, node.name) is None:
                await self.kube.create(NODES, node.as_object())
            await self.kube.patch(NODES, None, node.name, {"status": node.status()}, subresource="status")
        self._nodes_registered = True

    # -- one pass --------------------------------------------------------------------------------

    async def reconcile(self) -> None:
        if not self._nodes_registered:
            await self.register_nodes()
        pods = (await self.kube.list(PODS))["items"]
        for sts in (await self.kube.list(STATEFULSETS))["items"]:
            await _isolated(sts, self._reconcile_statefulset(sts, [p for p in pods if _owned_by(p, sts)]))
        for deployment in (await self.kube.list(DEPLOYMENTS))["items"]:
            await _isolated(deployment, self._reconcile_deployment(deployment, [p for p in pods if _owned_by(p, deployment)]))
        for job in (await self.kube.list(JOBS))["items"]:
            await _isolated(job, self._reconcile_job(job, [p for p in pods if _owned_by(p, job)]))
        await self._bind_volumes()
        pods = (await self.kube.list(PODS))["items"]
        await self._schedule(pods)
        await self._run_kubelets(pods)

    # -- StatefulSet controller --------------------------------------------------------------------

    async def _reconcile_statefulset(self, sts: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        if sts["metadata"].get("deletionTimestamp"):
            return
        spec, name, namespace = sts["spec"], sts["metadata"]["name"], sts["metadata"]["namespace"]
        replicas = spec.get("replicas", 1)
        revision = _hash(spec["template"])
        by_ordinal = {int(p["metadata"]["name"].rsplit("-", 1)[1]): p for p in pods if re.search(r"-\d+$", p["metadata"]["name"])}
        for ordinal in range(replicas):
            await self._ensure_claims(sts, ordinal)
        ordered = spec.get("podManagementPolicy", "OrderedReady") == "OrderedReady"
        for ordinal in range(replicas):
            if ordinal in by_ordinal:
                continue
            if ordered and not all(o in by_ordinal and is_ready(by_ordinal[o]) for o in range(ordinal)):
                break
            await self._create_pod(sts, f"{name}-{ordinal}", revision, {"apps.kubernetes.io/pod-index": str(ordinal),
                                                                        "statefulset.kubernetes.io/pod-name": f"{name}-{ordinal}"},
                                   hostname=f"{name}-{ordinal}", subdomain=spec.get("serviceName"), ordinal=ordinal)
        for ordinal in sorted((o for o in by_ordinal if o >= replicas), reverse=True):
            await self.kube.delete(PODS, namespace, by_ordinal[ordinal]["metadata"]["name"])
            if ordered:
                break
        if (spec.get("persistentVolumeClaimRetentionPolicy") or {}).get("whenScaled") == "Delete":
            await self._delete_condemned_claims(sts, set(by_ordinal))
        current = [by_ordinal[o] for o in sorted(by_ordinal) if o < replicas]
        outdated = [p for p in current if p["metadata"]["labels"].get("controller-revision-hash") != f"{name}-{revision}"]
        if outdated and len(current) == replicas and all(is_ready(p) for p in current):
            await self.kube.delete(PODS, namespace, outdated[-1]["metadata"]["name"])
        ready = sum(is_ready(p) for p in current)
        updated = len(current) - len(outdated)
        status = {
            "observedGeneration": sts["metadata"].get("generation", 1),
            "replicas": len(current),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "currentReplicas": updated,
            "updatedReplicas": updated,
            "currentRevision": f"{name}-{revision}",
            "updateRevision": f"{name}-{revision}",
        }
        if any((sts.get("status") or {}).get(k) != v for k, v in status.items()):
            await self.kube.patch(STATEFULSETS, namespace, name, {"status": status}, subresource="status")

    async def _delete_condemned_claims(self, sts: dict[str, Any], running: set[int]) -> None:
        """`whenScaled: Delete`: the claims of ordinals beyond `replicas` go once their pod has."""
        name, namespace = sts["metadata"]["name"], sts["metadata"]["namespace"]
        prefixes = [f"{t['metadata']['name']}-{name}-" for t in sts["spec"].get("volumeClaimTemplates", [])]
        for claim in (await self.kube.list(PERSISTENT_VOLUME_CLAIMS, namespace))["items"]:
            claim_name = claim["metadata"]["name"]
            suffix = next((claim_name[len(p):] for p in prefixes if claim_name.startswith(p)), "")
            if suffix.isdigit() and int(suffix) >= sts["spec"].get("replicas", 1) and int(suffix) not in running:
                await self.kube.delete(PERSISTENT_VOLUME_CLAIMS, namespace, claim_name)

    async def _ensure_claims(self, sts: dict[str, Any], ordinal: int) -> None:
        name, namespace = sts["metadata"]["name"], sts["metadata"]["namespace"]
        retention = (sts["spec"].get("persistentVolumeClaimRetentionPolicy") or {}).get("whenDeleted", "Retain")
        for template in sts["spec"].get("volumeClaimTemplates", []):
            claim = f"{template['metadata']['name']}-{name}-{ordinal}"
            if await self.kube.get_or_none(PERSISTENT_VOLUME_CLAIMS, namespace, claim) is not None:
                continue
            labels = {**(template["metadata"].get("labels") or {}), **(sts["spec"]["selector"].get("matchLabels") or {})}
            metadata: dict[str, Any] = {"name": claim, "namespace": namespace, "labels": labels}
            if retention == "Delete":
                metadata["ownerReferences"] = [_owner_reference(sts)]
            body = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": template["spec"]}
            await self.kube.create(PERSISTENT_VOLUME_CLAIMS, body)

    async def _create_pod(self, owner: dict[str, Any], name: str, revision: str, labels: dict[str, str], *,
                          hostname: str | None = None, subdomain: str | None = None, ordinal: int | None = None) -> None:
        template = owner["spec"]["template"]
        owner_name, namespace = owner["metadata"]["name"], owner["metadata"]["namespace"]
        spec = json.loads(json.dumps(template["spec"]))
        if ordinal is not None:
            volumes = spec.setdefault("volumes", [])
            for claim_template in owner["spec"].get("volumeClaimTemplates", []):
                claim_name = claim_template["metadata"]["name"]
                volumes.append({"name": claim_name,
                                "persistentVolumeClaim": {"claimName": f"{claim_name}-{owner_name}-{ordinal}"}})
        if hostname:
            spec["hostname"] = hostname
        if subdomain:
            spec["subdomain"] = subdomain
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {**(template["metadata"].get("labels") or {}), **labels,
                           "controller-revision-hash": f"{owner_name}-{revision}"},
                "annotations": template["metadata"].get("annotations") or {},
                "ownerReferences": [_owner_reference(owner)],
            },
            "spec": spec,
        }
        try:
            await self.kube.create(PODS, pod)
        except APIError as error:
            if error.status != 409:  # created by an earlier pass that the list did not show yet
                raise

    # -- Deployment controller ---------------------------------------------------------------------

    async def _reconcile_deployment(self, deployment: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        if deployment["metadata"].get("deletionTimestamp"):
            return
        name, namespace = deployment["metadata"]["name"], deployment["metadata"]["namespace"]
        replicas = deployment["spec"].get("replicas", 1)
        revision = _hash(deployment["spec"]["template"])
        label = f"{name}-{revision}"
        current = [p for p in pods if p["metadata"]["labels"].get("controller-revision-hash") == label]
        outdated = [p for p in pods if p not in current]
        taken = {p["metadata"]["name"] for p in pods}
        index = 0
        for _ in range(replicas - len(current)):
            while f"{name}-{revision}-{index}" in taken:
                index += 1
            await self._create_pod(deployment, f"{name}-{revision}-{index}", revision, {})
            index += 1
        for pod in current[replicas:]:
            await self.kube.delete(PODS, namespace, pod["metadata"]["name"])
        if len(current) >= replicas and all(is_ready(p) for p in current[:replicas]):
            for pod in outdated:
                await self.kube.delete(PODS, namespace, pod["metadata"]["name"])
        ready = sum(is_ready(p) for p in current[:replicas])
        status = {
            "observedGeneration": deployment["metadata"].get("generation", 1),
            "replicas": len(pods),
            "updatedReplicas": min(len(current), replicas),
            "readyReplicas": ready,
            "availableReplicas": ready,
        }
        if any((deployment.get("status") or {}).get(k) != v for k, v in status.items()):
            await self.kube.patch(DEPLOYMENTS, namespace, name, {"status": status}, subresource="status")

    # -- Job controller ----------------------------------------------------------------------------

    async def _reconcile_job(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        if job["metadata"].get("deletionTimestamp"):
            return
        name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
        status = job.get("status") or {}
        if any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in status.get("conditions", [])):
            return
        phases = [(p.get("status") or {}).get("phase") for p in pods]
        succeeded, failed = phases.count("Succeeded"), phases.count("Failed")
        active = sum(1 for p, phase in zip(pods, phases)
                     if phase not in ("Succeeded", "Failed") and not p["metadata"].get("deletionTimestamp"))
        backoff_limit = job["spec"].get("backoffLimit", 6)
        new: dict[str, Any] = {"active": active, "succeeded": succeeded, "failed": failed,
                               "startTime": status.get("startTime") or _now()}
        if succeeded:
            new.update(active=0, completionTime=_now(), conditions=[
                _job_condition("SuccessCriteriaMet", "CompletionsReached", "Reached expected number of succeeded pods"),
                _job_condition("Complete", "CompletionsReached", "Reached expected number of succeeded pods")])
        elif failed > backoff_limit:
            new["conditions"] = [
                _job_condition("FailureTarget", "BackoffLimitExceeded", "Job has reached the specified backoff limit"),
                _job_condition("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")]
        elif not active:
            await self._create_job_pod(job)
            new["active"] = 1
        if any(status.get(k) != v for k, v in new.items() if k not in ("startTime", "completionTime")):
            await self.kube.patch(JOBS, namespace, name, {"status": new}, subresource="status")

    async def _create_job_pod(self, job: dict[str, Any]) -> None:
        template = job["spec"]["template"]
        name = job["metadata"]["name"]
        labels = {"batch.kubernetes.io/job-name": name, "job-name": name,
                  "batch.kubernetes.io/controller-uid": job["metadata"]["uid"]}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": f"{name}-",
                "namespace": job["metadata"]["namespace"],
                "labels": {**(template["metadata"].get("labels") or {}), **labels},
                "annotations": template["metadata"].get("annotations") or {},
                "ownerReferences": [_owner_reference(job)],
            },
            "spec": json.loads(json.dumps(template["spec"])),
        }
        await self.kube.create(PODS, pod)

    # -- volume binding ----------------------------------------------------------------------------

    async def _bind_volumes(self) -> None:
        claims = (await self.kube.list(PERSISTENT_VOLUME_CLAIMS))["items"]
        volumes = (await self.kube.list(PERSISTENT_VOLUMES))["items"]
        classes = {c["metadata"]["name"]: c for c in (await self.kube.list(STORAGECLASSES))["items"]}
        for claim in claims:
            if (claim.get("status") or {}).get("phase") == "Bound" or claim["metadata"].get("deletionTimestamp"):
                continue
            volume = self._matching_volume(claim, volumes)
            if volume is None and claim["spec"].get("storageClassName") in classes:
                try:
                    volume = await self._provision(claim, classes[claim["spec"]["storageClassName"]])
                except APIError as error:
                    log.debug("cannot provision for %s: %s", claim["metadata"]["name"], error)
                    continue
                volumes.append(volume)
            if volume is not None:
                await _isolated(claim, self._bind(claim, volume))
        await self._set_volume_phases()
        await self._resize_volumes()

    async def _resize_volumes(self) -> None:
        """Grow the PV and `status.capacity` of every bound claim whose request outgrew them."""
        for claim in (await self.kube.list(PERSISTENT_VOLUME_CLAIMS))["items"]:
            status = claim.get("status") or {}
            wanted = claim["spec"].get("resources", {}).get("requests", {}).get("storage")
            have = (status.get("capacity") or {}).get("storage")
            if status.get("phase") != "Bound" or wanted is None or have is None \
                    or quantity_value(str(wanted)) <= quantity_value(str(have)):
                continue
            volume = claim["spec"].get("volumeName")
            if volume:
                await _isolated(claim, self.kube.patch(PERSISTENT_VOLUMES, None, volume,
                                                       {"spec": {"capacity": {"storage": wanted}}}))
            await _isolated(claim, self.kube.patch(
                PERSISTENT_VOLUME_CLAIMS, claim["metadata"]["namespace"], claim["metadata"]["name"],
                {"status": {"capacity": {"storage": wanted}}}, subresource="status"))

    async def _set_volume_phases(self) -> None:
        """Bound while the claim it names exists, then Released (Retain) or deleted (Delete); else Available."""
        claim_uids = {c["metadata"]["uid"] for c in (await self.kube.list(PERSISTENT_VOLUME_CLAIMS))["items"]}
        for volume in (await self.kube.list(PERSISTENT_VOLUMES))["items"]:
            name, claim_uid = volume["metadata"]["name"], (volume["spec"].get("claimRef") or {}).get("uid")
            if claim_uid is None:
                phase = "Available"
            elif claim_uid in claim_uids:
                phase = "Bound"
            elif volume["spec"].get("persistentVolumeReclaimPolicy") == "Delete":
                await _isolated(volume, self.kube.delete(PERSISTENT_VOLUMES, None, name))
                continue
            else:
                phase = "Released"
            if (volume.get("status") or {}).get("phase") != phase:
                await _isolated(volume, self.kube.patch(PERSISTENT_VOLUMES, None, name, {"status": {"phase": phase}},
                                                        subresource="status"))

    @staticmethod
    def _matching_volume(claim: dict[str, Any], volumes: list[dict[str, Any]]) -> dict[str, Any] | None:
        name, namespace = claim["metadata"]["name"], claim["metadata"]["namespace"]
        spec = claim["spec"]
        wanted = quantity_value(str(spec.get("resources", {}).get("requests", {}).get("storage", "0")))
        mode = spec.get("volumeMode", "Filesystem")

        def fits(volume: dict[str, Any]) -> bool:
            capacity = quantity_value(str(volume["spec"].get("capacity", {}).get("storage", "0")))
            return capacity >= wanted and volume["spec"].get("volumeMode", "Filesystem") == mode

        for volume in volumes:
            ref = volume["spec"].get("claimRef") or {}
            if (ref.get("name"), ref.get("namespace")) == (name, namespace) and ref.get("uid") in (None, claim["metadata"]["uid"]):
                return volume if fits(volume) else None
        if spec.get("volumeName"):
            return next((v for v in volumes if v["metadata"]["name"] == spec["volumeName"] and fits(v)), None)
        selector = (spec.get("selector") or {}).get("matchLabels") or {}
        for volume in sorted(volumes, key=lambda v: v["metadata"]["name"]):
            labels = volume["metadata"].get("labels") or {}
            if (not volume["spec"].get("claimRef")
                    and volume["spec"].get("storageClassName", "") == spec.get("storageClassName", "")
                    and all(labels.get(k) == v for k, v in selector.items()) and fits(volume)):
                return volume
        return None

    async def _provision(self, claim: dict[str, Any], storage_class: dict[str, Any]) -> dict[str, Any]:
        spec = claim["spec"]
        volume = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"pvc-{claim['metadata']['uid']}",
                         "annotations": {"pv.kubernetes.io/provisioned-by": storage_class["provisioner"]}},
            "spec": {
                "capacity": {"storage": spec["resources"]["requests"]["storage"]},
                "accessModes": spec.get("accessModes", ["ReadWriteOnce"]),
                "volumeMode": spec.get("volumeMode", "Filesystem"),
                "storageClassName": storage_class["metadata"]["name"],
                "persistentVolumeReclaimPolicy": storage_class.get("reclaimPolicy", "Delete"),
                "csi": {"driver": storage_class["provisioner"], "volumeHandle": claim["metadata"]["uid"]},
            },
        }
        return await self.kube.create(PERSISTENT_VOLUMES, volume)

    async def _bind(self, claim: dict[str, Any], volume: dict[str, Any]) -> None:
        name, namespace = claim["metadata"]["name"], claim["metadata"]["namespace"]
        claim_ref = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": namespace, "name": name,
                     "uid": claim["metadata"]["uid"]}
        volume_name = volume["metadata"]["name"]
        await self.kube.patch(PERSISTENT_VOLUMES, None, volume_name, {"spec": {"claimRef": claim_ref}})
        await self.kube.patch(PERSISTENT_VOLUME_CLAIMS, namespace, name, {"spec": {"volumeName": volume_name}})
        status = {"phase": "Bound", "accessModes": volume["spec"].get("accessModes"),
                  "capacity": volume["spec"].get("capacity")}
        await self.kube.patch(PERSISTENT_VOLUME_CLAIMS, namespace, name, {"status": status}, subresource="status")

    # -- scheduler ---------------------------------------------------------------------------------

    async def _schedule(self, pods: list[dict[str, Any]]) -> None:
        claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c
                  for c in (await self.kube.list(PERSISTENT_VOLUME_CLAIMS))["items"]}
        nodes = {n["metadata"]["name"]: n for n in (await self.kube.list(NODES))["items"]}
        used: dict[str, dict[str, Decimal]] = {name: {"pods": Decimal(0)} for name in nodes}
        for pod in pods:
            node = pod["spec"].get("nodeName")
            if node in used and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                for resource, value in pod_requests(pod).items():
                    used[node][resource] = used[node].get(resource, Decimal(0)) + value
                used[node]["pods"] += 1
        for pod in pods:
            if pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"):
                continue
            reason = self._unbound_claims(pod, claims)
            chosen = None
            if reason is None:
                chosen, reason = self._fit(pod, nodes, used)
            name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
            if chosen is None:
                await _isolated(pod, self._set_pod_conditions(pod, {"PodScheduled": ("False", "Unschedulable", reason)}))
                continue
            for resource, value in pod_requests(pod).items():
                used[chosen][resource] = used[chosen].get(resource, Decimal(0)) + value
            used[chosen]["pods"] += 1
            await _isolated(pod, self.kube.patch(PODS, namespace, name, {"spec": {"nodeName": chosen}}))

    @staticmethod
    def _unbound_claims(pod: dict[str, Any], claims: dict[tuple[str, str], dict[str, Any]]) -> str | None:
        namespace = pod["metadata"]["namespace"]
        for volume in pod["spec"].get("volumes", []):
            claim_name = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if claim_name is None:
                continue
            claim = claims.get((namespace, claim_name))
            if claim is None:
                return f'persistentvolumeclaim "{claim_name}" not found'
            if (claim.get("status") or {}).get("phase") != "Bound":
                return f'pod has unbound immediate PersistentVolumeClaims ("{claim_name}")'
        return None

    @staticmethod
    def _fit(pod: dict[str, Any], nodes: dict[str, dict[str, Any]],
             used: dict[str, dict[str, Decimal]]) -> tuple[str | None, str]:
        requests = {**pod_requests(pod), "pods": Decimal(1)}
        selector = pod["spec"].get("nodeSelector") or {}
        shortages: dict[str, int] = {}
        for name in sorted(nodes):
            labels = nodes[name]["metadata"].get("labels") or {}
            if any(labels.get(k) != v for k, v in selector.items()):
                shortages["node(s) didn't match Pod's node affinity/selector"] = shortages.get(
                    "node(s) didn't match Pod's node affinity/selector", 0) + 1
                continue
            allocatable = (nodes[name].get("status") or {}).get("allocatable") or {}
            short = [resource for resource, value in requests.items() if value > 0 and
                     used[name].get(resource, Decimal(0)) + value > quantity_value(str(allocatable.get(resource, "0")))]
            if not short:
                return name, ""
            for resource in short:
                key = f"Insufficient {resource}"
                shortages[key] = shortages.get(key, 0) + 1
        detail = ", ".join(f"{count} {reason}" for reason, count in sorted(shortages.items()))
        return None, f"0/{len(nodes)} nodes are available: {detail or 'no nodes'}."

    # -- kubelets ----------------------------------------------------------------------------------

    async def _run_kubelets(self, pods: list[dict[str, Any]]) -> None:
        alive = set()
        updates = []
        for pod in pods:
            uid = pod["metadata"]["uid"]
            if pod["metadata"].get("deletionTimestamp"):
                await self._stop_pod(uid)
                if not pod["metadata"].get("finalizers"):
                    await _isolated(pod, self.kube.delete(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"]))
                continue
            if not pod["spec"].get("nodeName"):
                continue
            if pod["spec"].get("restartPolicy", "Always") != "Always":
                if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                    updates.append(_isolated(pod, self._complete_pod(pod)))
                continue
            alive.add(uid)
            if uid not in self._running:
                await self._start_pod(pod)
            updates.append(_isolated(pod, self._update_pod_status(pod)))
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
        statuses = [{"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False, "started": False,
                     "restartCount": 0, "state": {"terminated": {"exitCode": code, "reason": reason,
                                                                 "startedAt": _now(), "finishedAt": _now()}}}
                    for c in pod["spec"].get("containers", [])]
        status = {"phase": "Succeeded" if code == 0 else "Failed", "hostIP": "127.0.0.1",
                  "startTime": (pod.get("status") or {}).get("startTime") or _now(), "containerStatuses": statuses}
        conditions = {"PodScheduled": ("True", "", ""), "Initialized": ("True", "", ""),
                      "ContainersReady": ("False", "PodCompleted", ""), "Ready": ("False", "PodCompleted", "")}
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
        self._running[uid] = _RunningPod(uid, address, engines)

    async def _stop_pod(self, uid: str) -> None:
        running = self._running.pop(uid, None)
        if running is None:
            return
        for engine in running.engines:
            await engine.stop()
        self.addresses.release(uid)

    async def _probe(self, address: str, container: dict[str, Any]) -> bool:
        http_get = (container.get("readinessProbe") or {}).get("httpGet")
        if http_get is None:
            return True
        port = http_get.get("port")
        if isinstance(port, str):
            port = next((p["containerPort"] for p in container.get("ports", []) if p.get("name") == port), None)
        if port is None:
            return False
        assert self._http is not None
        try:
            async with self._http.get(f"http://{address}:{port}{http_get.get('path', '/')}") as reply:
                return 200 <= reply.status < 400
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return False

    async def _update_pod_status(self, pod: dict[str, Any]) -> None:
        running = self._running[pod["metadata"]["uid"]]
        statuses = []
        containers = pod["spec"].get("containers", [])
        probes = await asyncio.gather(*(self._probe(running.address, container) for container in containers))
        for container, ready in zip(containers, probes):
            previous = next((s for s in (pod.get("status") or {}).get("containerStatuses", [])
                             if s["name"] == container["name"]), None)
            started_at = (previous or {}).get("state", {}).get("running", {}).get("startedAt") or _now()
            statuses.append({
                "name": container["name"], "image": container.get("image", ""), "imageID": "",
                "ready": ready, "started": True, "restartCount": 0, "state": {"running": {"startedAt": started_at}},
            })
        containers_ready = all(s["ready"] for s in statuses)
        gates = [g["conditionType"] for g in pod["spec"].get("readinessGates", [])]
        gates_open = all((_condition(pod, gate) or {}).get("status") == "True" for gate in gates)
        ready = containers_ready and gates_open
        reason = "" if ready else ("ContainersNotReady" if not containers_ready else "ReadinessGatesNotReady")
        conditions = {
            "PodScheduled": ("True", "", ""),
            "Initialized": ("True", "", ""),
            "ContainersReady": ("True" if containers_ready else "False", "" if containers_ready else "ContainersNotReady", ""),
            "Ready": ("True" if ready else "False", reason, ""),
        }
        status = {
            "phase": "Running",
            "podIP": running.address,
            "podIPs": [{"ip": running.address}],
            "hostIP": "127.0.0.1",
            "startTime": (pod.get("status") or {}).get("startTime") or _now(),
            "containerStatuses": statuses,
        }
        if pod["spec"].get("initContainers"):
            status["initContainerStatuses"] = [
                {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": True, "restartCount": 0,
                 "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
                for c in pod["spec"]["initContainers"]
            ]
        await self._set_pod_conditions(pod, conditions, status)

    async def _set_pod_conditions(self, pod: dict[str, Any], conditions: dict[str, tuple[str, str, str]],
                                  status: dict[str, Any] | None = None) -> None:
        """Write the kubelet's conditions, keeping others' (readiness gates) untouched; skip no-op writes."""
        current = (pod.get("status") or {}).get("conditions", [])
        merged = [c for c in current if c.get("type") not in conditions]
        for kind, (value, reason, message) in conditions.items():
            old = next((c for c in current if c.get("type") == kind), None)
            same = old is not None and old.get("status") == value
            entry = {"type": kind, "status": value,
                     "lastTransitionTime": old.get("lastTransitionTime") if same and old else _now()}
            if reason:
                entry["reason"] = reason
            if message:
                entry["message"] = message
            merged.append(entry)
        new_status = {**(status or {}), "conditions": merged}
        old_status = pod.get("status") or {}

        def comparable(value: dict[str, Any]) -> Any:
            return json.loads(json.dumps(value, sort_keys=True))

        if all(comparable(old_status.get(k)) == comparable(v) for k, v in new_status.items()):
            return
        try:
            await self.kube.patch(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"], {"status": new_status},
                                  subresource="status")
        except APIError as error:
            if error.status != 404:
                raise
