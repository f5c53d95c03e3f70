"""The pod simulator: what kube-controller-manager, the scheduler and the kubelets do, for the embedded cluster.

One module per thing it stands in for: :mod:`.workloads` (the StatefulSet, Deployment and Job
controllers), :mod:`.volumes` (the PV/PVC binder, and a stand-in CSI provisioner and resizer),
:mod:`.scheduler` and :mod:`.kubelet` (nodes and their pods). On the embedded cluster all of them
run (:data:`EMBEDDED`); under a real control plane (:mod:`kvtier.testing.controlplane`) the real
controllers and scheduler do their parts and only :data:`UNDER_CONTROL_PLANE` runs: the kubelets
and the provisioner a CSI driver would bring.

It is an ordinary API client (it works against any API server) and runs level-based: every
change it watches, and a tick every `resync` seconds (for readiness probes), triggers one pass
that looks at everything and fixes what differs. It reads through informers (:mod:`.informer`:
one list, then watches; its own writes refresh the cache), so a pass makes no LIST. Simplifications, deliberately:

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
  Binding writes `spec.nodeName` directly. Pods naming another `schedulerName` are left alone.
- Kubelets: each pod gets its own address in 127.0.0.0/8; every container's declared ports are
  served by the engine factory; a container is ready when its `readinessProbe.httpGet` answers
  200 (or at once without a probe) and unready after `failureThreshold` (default 3) failed probes
  in a row, one probe per pass (or per `periodSeconds` with `probe_periods`); the pod is Ready
  when all containers are and every `readinessGates` condition is True. A deleted pod's engines stop at once. Pods whose
  `restartPolicy` is `Never` or `OnFailure` run to completion instead of serving: once scheduled
  they end `Succeeded`, or `Failed` when `exit_code(pod)` (a test's hook; 0 by default) is not 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import aiohttp

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
    Resource,
)
from kvtier.testing.engines import EngineFactory, stub_engine
from kvtier.testing.podsim.informer import CachedClient
from kvtier.testing.podsim.kubelet import AddressPool, Kubelet, RunningPod
from kvtier.testing.podsim.nodes import NodeSpec
from kvtier.testing.podsim.objects import GPU, is_ready, isolated, owned_by, pod_requests
from kvtier.testing.podsim.scheduler import Scheduler
from kvtier.testing.podsim.volumes import VolumeControllers
from kvtier.testing.podsim.workloads import WorkloadControllers

__all__ = [
    "EMBEDDED",
    "GPU",
    "UNDER_CONTROL_PLANE",
    "AddressPool",
    "NodeSpec",
    "PodSimulator",
    "is_ready",
    "pod_requests",
]

log = logging.getLogger(__name__)

#: Every part: the embedded cluster has no controllers or scheduler of its own.
EMBEDDED = frozenset({"workloads", "volume-binder", "provisioner", "scheduler", "kubelet"})
#: Under a real control plane: what no real component here does (kubelets, a CSI driver's provisioner).
UNDER_CONTROL_PLANE = frozenset({"provisioner", "kubelet"})


class PodSimulator(WorkloadControllers, VolumeControllers, Scheduler, Kubelet):
    """The chosen parts (`components`, a subset of :data:`EMBEDDED`) for simulated nodes; `await run()` until cancelled."""

    def __init__(
        self,
        kube: KubeClient,
        nodes: list[NodeSpec],
        *,
        engine_factory: EngineFactory = stub_engine,
        addresses: AddressPool | None = None,
        resync: float = 0.5,
        probe_periods: bool = False,
        exit_code: Callable[[dict[str, Any]], int] = lambda pod: 0,
        components: frozenset[str] = EMBEDDED,
    ):
        unknown = set(components) - EMBEDDED
        if unknown:
            raise ValueError(f"unknown pod simulator components {sorted(unknown)}; known: {sorted(EMBEDDED)}")
        self.kube = CachedClient(kube)  # type: ignore[assignment]  # a KubeClient whose lists come from informers
        self.nodes = nodes
        self.components = frozenset(components)
        self.engine_factory = engine_factory
        self.addresses = addresses or AddressPool()
        self.resync = resync
        #: Probe readiness once per `periodSeconds` (as kubelets do) rather than on every pass (quicker to notice,
        #: the tests' default); for many pods, where probing every pass is the simulator's own bottleneck.
        self.probe_periods = probe_periods
        #: The exit code of a run-to-completion pod (restartPolicy Never or OnFailure); tests replace it.
        self.exit_code = exit_code
        self._running: dict[str, RunningPod] = {}  # by pod uid
        self._wake = asyncio.Event()
        self._http: aiohttp.ClientSession | None = None
        self.passes = 0
        self._nodes_registered = False

    def _watched(self) -> list[Resource]:
        watched = [PODS, NODES]
        if "workloads" in self.components:
            watched += [STATEFULSETS, DEPLOYMENTS, JOBS]
        if self.components & {"volume-binder", "provisioner"}:
            watched += [PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES, STORAGECLASSES]
        return watched

    async def run(self) -> None:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1))
        assert isinstance(self.kube, CachedClient)
        watchers = [
            asyncio.create_task(
                self.kube.inform(resource, self._wake.set).run(), name=f"podsim-watch-{resource.plural}"
            )
            for resource in self._watched()
        ]
        if "kubelet" in self.components:
            watchers.append(asyncio.create_task(self.heartbeat(), name="podsim-node-heartbeat"))
        try:
            while True:
                try:
                    await self.reconcile()
                except APIError as error:
                    log.debug("pod simulator pass interrupted: %s", error)
                except aiohttp.ClientError as error:
                    log.warning("pod simulator cannot reach the API: %s", error)
                self.passes += 1
                # Not asyncio.wait_for: on Python 3.11 a cancellation that lands as the wake-up comes is swallowed
                # (bpo-42130), and the stop that sent it waits forever on a loop that goes on.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.resync):
                        await self._wake.wait()
                self._wake.clear()
        finally:
            for task in watchers:
                task.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
            await asyncio.gather(*(self._stop_pod(uid) for uid in list(self._running)))
            await self._http.close()

    # -- one pass --------------------------------------------------------------------------------

    async def reconcile(self) -> None:
        if "kubelet" in self.components and not self._nodes_registered:
            await self.register_nodes()
        if "workloads" in self.components:
            pods = (await self.kube.list(PODS))["items"]
            for sts in (await self.kube.list(STATEFULSETS))["items"]:
                await isolated(sts, self._reconcile_statefulset(sts, [p for p in pods if owned_by(p, sts)]))
            for deployment in (await self.kube.list(DEPLOYMENTS))["items"]:
                await isolated(
                    deployment, self._reconcile_deployment(deployment, [p for p in pods if owned_by(p, deployment)])
                )
            for job in (await self.kube.list(JOBS))["items"]:
                await isolated(job, self._reconcile_job(job, [p for p in pods if owned_by(p, job)]))
        if "volume-binder" in self.components:
            await self._bind_volumes(provision="provisioner" in self.components)
        elif "provisioner" in self.components:
            await self.provision_for_binder()
        pods = (await self.kube.list(PODS))["items"]
        if "scheduler" in self.components:
            await self._schedule(pods)
        if "kubelet" in self.components:
            await self._run_kubelets(pods)
