"""Volume reclaim: static volumes their deployments gave back are wiped (or retained) before reuse.

Driven by the KVPool controller on every pass, level-based, from what is in the cluster:

- a deployment gives a static PersistentVolume back (`release_volume`: deleted, or the ordinal scaled
  away) by labelling it `kvtier.io/released` and dropping its deployment labels; the pool's ledger
  moves the namespace to `status.reclaiming` in the same step (`kvtier.storage.ledger`);
- `volumeReclaim: Retain`: nothing more. The volume stays `Released` and the namespace reserved
  until an administrator deletes the PersistentVolume;
- `volumeReclaim: Wipe`: once the volume's old claim is gone, its `claimRef` is pointed at a claim
  of the operator's own namespace, a Job wipes it (`kvtier.render.reclaim`), and only after the Job
  succeeded are the Job, the claim and the PersistentVolume deleted. A failed Job stays for
  inspection and is reported; deleting it retries;
- a namespace in `status.reclaiming` whose PersistentVolume is gone is free again (`reclaim_volumes`
  returns it; the pool controller writes the ledger).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvtier.api.kvpool import KVPool
from kvtier.contract import DEPLOYMENT_LABEL, DEPLOYMENT_NAMESPACE_LABEL
from kvtier.kube import JOBS, NAMESPACES, PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES, APIError, KubeClient
from kvtier.render.reclaim import RELEASED_LABEL, claim_ref, wipe_claim, wipe_job, wipe_name
from kvtier.storage import CSIBackend, backend_for
from kvtier.storage.base import POOL_LABEL
from kvtier.storage.nvmeof import persistent_volume_name


@dataclass
class Reclaim:
    """What one pass found: namespaces free again, and wipes that failed or could not start."""

    freed: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    unwiped: list[str] = field(default_factory=list)
    """Released PersistentVolumes no wipe could start for (the operator's namespace is missing)."""
    reason: str = "WipeFailed"
    """CamelCase cause of `problems`, for conditions."""


async def release_volume(kube: KubeClient, volume: dict[str, Any]) -> None:
    """Give a deployment's static PersistentVolume back to its pool's reclaim."""
    labels = {RELEASED_LABEL: "true", DEPLOYMENT_LABEL: None, DEPLOYMENT_NAMESPACE_LABEL: None}
    await kube.patch(PERSISTENT_VOLUMES, None, volume["metadata"]["name"], {"metadata": {"labels": labels}})


def _finished(job: dict[str, Any]) -> str | None:
    conditions = (job.get("status") or {}).get("conditions", [])
    return next(
        (c["type"] for c in conditions if c.get("type") in ("Complete", "Failed") and c.get("status") == "True"), None
    )


async def _claim_in_use(kube: KubeClient, volume: dict[str, Any]) -> bool:
    """Whether the claim the volume is bound to (its deployment's) still exists."""
    ref = volume["spec"].get("claimRef") or {}
    if not ref.get("uid"):
        return False
    claim = await kube.get_or_none(PERSISTENT_VOLUME_CLAIMS, ref.get("namespace"), ref.get("name", ""))
    return claim is not None and claim["metadata"]["uid"] == ref["uid"]


async def _wipe(kube: KubeClient, volume: dict[str, Any], namespace: str, image: str) -> str | None:
    """Advance the wipe of one volume; the problem, if its Job failed."""
    name, ref = wipe_name(volume), volume["spec"].get("claimRef") or {}
    if (ref.get("namespace"), ref.get("name")) != (namespace, name):
        if await _claim_in_use(kube, volume):
            return None  # its pod may still write: wait for the deployment's claim to go
        await kube.patch(
            PERSISTENT_VOLUMES, None, volume["metadata"]["name"], {"spec": {"claimRef": claim_ref(volume, namespace)}}
        )
    if await kube.get_or_none(PERSISTENT_VOLUME_CLAIMS, namespace, name) is None:
        await _create(kube, PERSISTENT_VOLUME_CLAIMS, wipe_claim(volume, namespace))
    job = await kube.get_or_none(JOBS, namespace, name)
    if job is None:
        await _create(kube, JOBS, wipe_job(volume, namespace, image))
        return None
    outcome = _finished(job)
    if outcome == "Failed":
        return (
            f"wiping PersistentVolume {volume['metadata']['name']} failed (Job {namespace}/{name}); its namespace "
            f"stays out of use until a wipe succeeds (delete the Job to retry)"
        )
    if outcome == "Complete":
        await kube.delete(JOBS, namespace, name)
        await kube.delete(PERSISTENT_VOLUME_CLAIMS, namespace, name)
        await kube.delete(PERSISTENT_VOLUMES, None, volume["metadata"]["name"])
    return None


async def _create(kube: KubeClient, resource: Any, body: dict[str, Any]) -> None:
    try:
        await kube.create(resource, body)
    except APIError as error:
        if error.status != 409:  # created by an earlier pass the read did not see yet
            raise


async def reclaim_volumes(kube: KubeClient, pool: KVPool, namespace: str, image: str) -> Reclaim:
    """One reclaim pass over the pool's released volumes (`namespace`: the operator's, where wipes run)."""
    name = pool.metadata.name or ""
    reclaiming = pool.status.reclaiming if pool.status else []
    if isinstance(backend_for(pool), CSIBackend) and not reclaiming:
        return Reclaim()  # dynamically provisioned volumes are the CSI driver's to reclaim: nothing to list
    found = await kube.list(PERSISTENT_VOLUMES, label_selector=f"{POOL_LABEL}={name}")
    volumes = {v["metadata"]["name"]: v for v in found.get("items", [])}
    result = Reclaim()
    released = [
        v
        for v in volumes.values()
        if (v["metadata"].get("labels") or {}).get(RELEASED_LABEL) and not v["metadata"].get("deletionTimestamp")
    ]
    if pool.spec.volume_reclaim == "Wipe" and released and await kube.get_or_none(NAMESPACES, None, namespace) is None:
        # Wipes run in the operator's namespace; without it they cannot start (and would fail with 404s forever).
        result.unwiped = sorted(v["metadata"]["name"] for v in released)
        result.reason = "OperatorNamespaceMissing"
        result.problems.append(
            f"the operator's namespace {namespace} does not exist, so {len(released)} released "
            f"volume(s) cannot be wiped (wipe Jobs run there): create it (kubectl create namespace "
            f"{namespace}) or set spec.volumeReclaim: Retain"
        )
        released = []
    if pool.spec.volume_reclaim == "Wipe" and released:
        for volume in released:
            problem = await _wipe(kube, volume, namespace, image)
            if problem:
                result.problems.append(problem)
        found = await kube.list(PERSISTENT_VOLUMES, label_selector=f"{POOL_LABEL}={name}")
        volumes = {v["metadata"]["name"]: v for v in found.get("items", [])}
    result.freed = {uuid for uuid in reclaiming if persistent_volume_name(name, uuid) not in volumes}
    return result
