"""Whether replicas that are not Ready are still starting, or in trouble (pure: pods in, words out).

A normal start (scheduling, waiting for a volume to bind, pulling the image, loading the model,
waiting for the storage quota) is not trouble: the deployment's Ready condition is False with
reason `ReplicasStarting` and a Normal Event. It becomes `ReplicasNotReady`, a Warning, as soon
as a pod fails (a crash loop, an image that cannot be pulled, a pod that cannot be scheduled, a
container that exited with an error), or once Ready has been False for longer than the grace
period.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: Waiting reasons of a container that will not start without a change.
FAILING_WAITING_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


#: Scheduler messages that mean "waiting for the pod's claims to bind", a normal start step: the
#: scheduler keeps the pod Unschedulable until the PersistentVolume controller has bound them.
WAITING_FOR_CLAIMS = ("unbound immediate PersistentVolumeClaims", "persistentvolumeclaim")


def _waiting_for_claims(condition: Mapping[str, Any]) -> bool:
    message = condition.get("message") or ""
    return any(marker in message for marker in WAITING_FOR_CLAIMS)


def _detail(state: Mapping[str, Any]) -> str:
    message = (state.get("message") or "").strip()
    return f" ({message[:200]})" if message else ""


def pod_trouble(pod: Mapping[str, Any]) -> str | None:
    """Why this pod will not become Ready on its own, or None while it may still be starting."""
    status = pod.get("status") or {}
    if status.get("phase") == "Failed":
        return f"failed: {status.get('reason') or 'its containers exited'}{_detail(status)}"
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("reason") == "Unschedulable"
            and not _waiting_for_claims(condition)
        ):
            return f"cannot be scheduled{_detail(condition)}"
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        name = container.get("name", "?")
        state = container.get("state") or {}
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in FAILING_WAITING_REASONS:
            return f"container {name}: {waiting['reason']}{_detail(waiting)}"
        terminated = state.get("terminated") or {}
        if terminated and terminated.get("exitCode", 0) != 0:
            return f"container {name} exited with code {terminated['exitCode']}{_detail(terminated)}"
        last = (container.get("lastState") or {}).get("terminated") or {}
        restarts = container.get("restartCount") or 0
        if restarts and last:
            return (
                f"container {name} restarted {restarts} time{'s' if restarts != 1 else ''} "
                f"(last exit code {last.get('exitCode', '?')}{', ' + last['reason'] if last.get('reason') else ''})"
            )
    return None


def _progress(pod: Mapping[str, Any]) -> str:
    """Where a starting pod is: `Pending`, `waiting for its volumes to bind`, `ContainerCreating`,
    `Running, not Ready yet`."""
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and _waiting_for_claims(condition)
        ):
            return "waiting for its volumes to bind"
    for container in status.get("containerStatuses") or []:
        reason = ((container.get("state") or {}).get("waiting") or {}).get("reason")
        if reason:
            return reason
    phase = status.get("phase") or "Pending"
    return "Running, not Ready yet" if phase == "Running" else phase


def not_ready(
    pods: Iterable[Mapping[str, Any]], ready: int, desired: int, not_ready_seconds: float, grace_seconds: float
) -> tuple[str, str]:
    """The Ready=False condition's (reason, message) for `ready` of `desired` replicas.

    `not_ready_seconds`: how long Ready has been False already (0 when it was True until now).
    """
    counts = f"{ready}/{desired} replicas ready"
    waiting = sorted((p for p in pods if not _ready(p)), key=lambda p: p.get("metadata", {}).get("name", ""))
    for pod in waiting:
        trouble = pod_trouble(pod)
        if trouble is not None:
            return "ReplicasNotReady", f"{counts}: pod {pod['metadata']['name']} {trouble}"
    if not_ready_seconds > grace_seconds:
        where = f" (pod {waiting[0]['metadata']['name']}: {_progress(waiting[0])})" if waiting else ""
        return "ReplicasNotReady", f"{counts}, still not all Ready after {not_ready_seconds:.0f}s{where}"
    if waiting:
        states = ", ".join(f"{p['metadata']['name']} {_progress(p)}" for p in waiting[:3])
        return "ReplicasStarting", f"{counts}; starting: {states}{' ...' if len(waiting) > 3 else ''}"
    return "ReplicasStarting", f"{counts}; starting"
