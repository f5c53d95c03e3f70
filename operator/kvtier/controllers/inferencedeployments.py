"""InferenceDeployment controller: storage admission, fit check, children by server-side apply, status.

One level-based `reconcile` runs on create, spec update, resume and every resync period, so a
deleted or edited child comes back and status follows the pods. Its steps, each of which may stop
the pass with a condition saying why: parse -> claim storage from the pool ledger (written
before anything is actuated) -> check that a replica fits a node -> render (sized by the volumes
the replicas already have, keeping an existing StatefulSet's fixed parts: `controllers.volumes`)
-> apply and prune -> expand the claims when `max` grew -> apply each running replica's storage
quota (opens its readiness gate) -> status. Static volumes are never deleted here: a deployment
gives them back to its pool, which wipes or retains them (`controllers.reclaim`).

In steady state a pass makes one API request, the pool's GET: children, claims and pods come from
watches (`controllers.children`, telemetry's pod index), a child is applied only when it changed or
drifted, the ledger is written only when the admission changes it, and status is patched only when it
differs from what the object holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

import aiohttp
import kopf

from kvtier.api.inferencedeployment import InferenceDeployment
from kvtier.api.kvpool import KVPool, KVPoolStatus
from kvtier.api.units import format_quantity
from kvtier.contract import DEPLOYMENT_LABEL, DEPLOYMENT_NAMESPACE_LABEL
from kvtier.controllers.children import (
    CHILD_RESOURCES,
    Applied,
    ApplyFailed,
    Observed,
    annotated,
    apply_children,
    prune_children,
    register_indexes,
)
from kvtier.controllers.conditions import find, set_condition
from kvtier.controllers.events import post_transitions
from kvtier.controllers.kvpools import PoolGone, PoolView, created_at, update_pool_status
from kvtier.controllers.reclaim import release_volume
from kvtier.controllers.replicas import not_ready
from kvtier.controllers.runtime import InvalidSpec, OperatorConfig, api_errors, measured, parse
from kvtier.controllers.volumes import expand_claims, keep_claim_templates, volume_size
from kvtier.kube import (
    INFERENCEDEPLOYMENTS,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    PODS,
    STATEFULSETS,
    APIError,
    KubeClient,
)
from kvtier.rebalance.actuator import apply_quotas, quota_in_place
from kvtier.render import (
    NodeResources,
    RenderError,
    StorageBinding,
    check_fit,
    render_deployment,
    selector,
)
from kvtier.render.reclaim import RELEASED_LABEL
from kvtier.render.volumes import kv_volume
from kvtier.storage.ledger import Admission, Claim, admit, release
from kvtier.telemetry.targets import TargetIndex

DEPLOYMENT = ("kvtier.io", "v1alpha1", "inferencedeployments")


class Stop(Exception):
    """Ends a pass early: the conditions set so far say why (not an error of the operator)."""


class Pass:
    """One reconcile pass over one InferenceDeployment: its conditions and status as they are computed."""

    def __init__(self, body: kopf.Body, retry: int = 0):
        self.body = body
        #: The first attempt at an object no pass has written yet: a missing pool is looked for once more.
        self.first_look = retry == 0 and not body.get("status")
        self.generation = body.metadata.get("generation")
        self.before: list[dict[str, Any]] = list((body.get("status") or {}).get("conditions", []))
        self.conditions = list(self.before)
        self.status: dict[str, Any] = {"observedGeneration": self.generation}

    def condition(self, kind: str, status: str, reason: str, message: str = "") -> None:
        self.conditions = set_condition(self.conditions, kind, status, reason, message, self.generation)  # type: ignore[arg-type]  # callers pass True/False/Unknown

    def stop(self, reason: str, message: str, *, degraded: bool = True) -> Stop:
        """Not ready, for `reason`; a spec or cluster problem (degraded) or a wait."""
        self.condition("Ready", "False", reason, message)
        if degraded:
            self.condition("Degraded", "True", reason, message)
        return Stop(message)

    def unchanged(self) -> bool:
        """Whether the object's status already says all this pass would write."""
        return _holds(dict(self.body.get("status") or {}), {**self.status, "conditions": self.conditions})

    async def write(self, kube: KubeClient) -> None:
        if self.unchanged():
            return
        meta = self.body.metadata
        await kube.patch(
            INFERENCEDEPLOYMENTS,
            meta.namespace,
            meta.name,
            {"status": {**self.status, "conditions": self.conditions}},
            subresource="status",
        )
        await post_transitions(kube, self.body, self.before, self.conditions)


async def claim_storage(
    world: World, deployment: InferenceDeployment, body: kopf.Body, step: Pass
) -> tuple[KVPool, Admission]:
    """Admit the deployment into its pool's ledger (compare-and-swap on the pool's status)."""
    storage = deployment.spec.kv_cache.storage
    assert storage is not None
    claim = Claim.of(deployment, created_at(body.metadata))
    decision: Admission | None = None

    def change(pool: KVPool, status: KVPoolStatus) -> KVPoolStatus:
        nonlocal decision
        decision = admit(pool, status, claim)
        return decision.status

    try:
        pool, _ = await update_pool_status(world.kube, storage.pool_ref, change, world.pool_view)
    except PoolGone:
        if step.first_look:  # `kubectl apply -f dir/` may create the pool a moment after its deployment
            raise kopf.TemporaryError(f"KVPool {storage.pool_ref} not found yet", delay=1) from None
        step.condition("StorageBound", "False", "PoolNotFound", f"KVPool {storage.pool_ref} does not exist")
        raise step.stop(
            "PoolNotFound", f"KVPool {storage.pool_ref} does not exist (spec.kvCache.storage.poolRef)"
        ) from None
    except InvalidSpec as error:
        step.condition("StorageBound", "False", "PoolInvalid", f"KVPool {storage.pool_ref}: {error}")
        raise step.stop("PoolInvalid", f"KVPool {storage.pool_ref} is invalid: {error}") from None
    assert decision is not None
    return pool, decision


def _binding(pool: KVPool, decision: Admission, size: int | None) -> StorageBinding:
    assert decision.allocation is not None
    inventory = {ns.uuid: ns for ns in (pool.spec.storage.nvmeof.namespaces if pool.spec.storage.nvmeof else [])}
    return StorageBinding(
        quota=decision.allocation.quota,
        namespaces=tuple(inventory[uuid] for uuid in decision.allocation.volumes),
        volume_size=size,
    )


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    @kopf.index("", "v1", "nodes", id="nodes", registry=registry)
    async def nodes(body: kopf.Body, **_: Any) -> dict[None, NodeResources]:
        return {None: NodeResources.from_node(body)}

    @kopf.on.startup(id="open-http", registry=registry)
    async def open_http(memo: kopf.Memo, **_: Any) -> None:
        memo.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=config.quota_timeout_seconds))

    @kopf.on.cleanup(id="close-http", registry=registry)
    async def close_http(memo: kopf.Memo, **_: Any) -> None:
        if getattr(memo, "http", None) is not None:
            await memo.http.close()

    register_indexes(registry, config)

    @kopf.on.startup(id="applied-children", registry=registry)
    async def remember_applied(memo: kopf.Memo, **_: Any) -> None:
        memo.applied = Applied()

    async def reconcile(body: kopf.Body, memo: kopf.Memo, nodes: kopf.Index, **kwargs: Any) -> None:
        kube: KubeClient = memo.kube
        step = Pass(body, kwargs.get("retry") or 0)
        telemetry = getattr(memo, "telemetry", None)
        world = World(
            kube,
            memo.http,
            config,
            memo.applied,
            Observed(kwargs, body.metadata.namespace, body.metadata.name),
            getattr(telemetry, "targets", None),
            memo.pool_view,
            getattr(telemetry, "scraped_quota_bytes", _nothing_scraped),
        )
        try:
            with api_errors():
                await _reconcile(world, body, list(nodes.get(None, [])), step)
        except Stop:
            pass
        except InvalidSpec as error:
            step.stop("InvalidSpec", str(error))
            with api_errors():
                await step.write(kube)
            raise
        except ApplyFailed as failure:
            # Said on the object (and in a Warning Event); retried as the API's answer says (5xx, 403: later).
            step.stop("Forbidden" if failure.error.status == 403 else "ApplyFailed", str(failure))
            with api_errors():
                await step.write(kube)
                raise failure.error from None
        except kopf.TemporaryError as error:
            if isinstance(error.__cause__, APIError) and error.__cause__.status == 403:
                # RBAC or a ResourceQuota: say so on the object (the retry goes on: a fixed role heals it).
                step.stop("Forbidden", str(error.__cause__))
                with api_errors():
                    await step.write(kube)
            raise
        with api_errors():
            await step.write(kube)

    reconcile = measured("InferenceDeployment", reconcile)
    kopf.on.resume(*DEPLOYMENT, id="reconcile", registry=registry)(reconcile)
    kopf.on.create(*DEPLOYMENT, id="reconcile", registry=registry)(reconcile)
    kopf.on.update(*DEPLOYMENT, id="reconcile", field="spec", registry=registry)(reconcile)
    kopf.timer(*DEPLOYMENT, id="resync", interval=config.resync_seconds, registry=registry)(reconcile)

    @kopf.on.delete(*DEPLOYMENT, id="release-storage", registry=registry)
    async def release_storage(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        """Volumes go back to the pool only once the deployment is gone: claims, static volumes, ledger entry.

        The StatefulSet goes first (it would recreate the claims of its pods), then its claims (kept by
        `whenDeleted: Retain` for a StatefulSet deleted by hand), then the static volumes are given back
        to the pool (which wipes or retains them), then the ledger entry (its namespaces to `reclaiming`).
        """
        kube: KubeClient = memo.kube
        name, namespace = body.metadata.name, body.metadata.namespace
        memo.applied.forget(namespace, name)
        with api_errors():
            if await kube.get_or_none(STATEFULSETS, namespace, name) is not None:
                await kube.delete(STATEFULSETS, namespace, name)
                raise kopf.TemporaryError(f"waiting for StatefulSet {name} to go before releasing its volumes", delay=1)
            claims = await kube.list(PERSISTENT_VOLUME_CLAIMS, namespace, label_selector=f"{DEPLOYMENT_LABEL}={name}")
            for claim in claims.get("items", []):
                await kube.delete(PERSISTENT_VOLUME_CLAIMS, namespace, claim["metadata"]["name"])
            volumes = await kube.list(
                PERSISTENT_VOLUMES, label_selector=f"{DEPLOYMENT_LABEL}={name},{DEPLOYMENT_NAMESPACE_LABEL}={namespace}"
            )
            for volume in volumes.get("items", []):
                await release_volume(kube, volume)
            pool_ref = (((body.get("spec") or {}).get("kvCache") or {}).get("storage") or {}).get("poolRef")
            if pool_ref:
                try:
                    await update_pool_status(
                        kube, pool_ref, lambda pool, status: release(pool, status, body.metadata.uid), memo.pool_view
                    )
                except (PoolGone, InvalidSpec):
                    pass


@dataclass(frozen=True)
class World:
    """What a pass reads and writes through: the API, the engines, and the watch-fed views of the children."""

    kube: KubeClient
    http: aiohttp.ClientSession
    config: OperatorConfig
    applied: Applied
    observed: Observed
    targets: TargetIndex | None
    pool_view: PoolView
    #: (namespace, deployment, pod) -> the quota the replica's server reported at its last fresh scrape.
    scraped_quota: Callable[[str, str, str], float | None]

    async def pods(self, deployment: InferenceDeployment) -> list[dict[str, Any]]:
        return await replica_pods(self.kube, self.targets, deployment)


def _nothing_scraped(namespace: str, deployment: str, pod: str) -> None:
    """Without the telemetry loop no quota is known to be in place: every replica is called."""
    return None


async def replica_pods(
    kube: KubeClient, targets: TargetIndex | None, deployment: InferenceDeployment
) -> list[dict[str, Any]]:
    """The deployment's replicas, from the pod watch (listed only before its first list is in)."""
    name, namespace = deployment.metadata.name or "", deployment.metadata.namespace or ""
    known = targets.pods_of(namespace, name) if targets is not None else None
    if known is not None:
        return known
    return (await kube.list(PODS, namespace, label_selector=selector(deployment))).get("items", [])


async def _reconcile(world: World, body: kopf.Body, nodes: list[NodeResources], step: Pass) -> None:
    kube, config, observed = world.kube, world.config, world.observed
    deployment = parse(InferenceDeployment, body)
    name = body.metadata.name
    step.status["selector"] = selector(deployment)
    pool: KVPool | None = None
    binding: StorageBinding | None = None
    rendered = deployment
    storage = deployment.spec.kv_cache.storage
    statefulset = observed.named("StatefulSet", name)
    claims = observed.claims() if storage is not None else []
    quota = 0
    held_back: tuple[str, str] | None = None  # the ledger admitted fewer replicas than the spec asks: why
    if storage is not None:
        pool, decision = await claim_storage(world, deployment, body, step)
        if decision.allocation is None:
            step.condition("StorageBound", "False", decision.reason, decision.message)
            # NeverFits is the spec's problem (degraded); waiting for capacity is not.
            raise step.stop(decision.reason, decision.message, degraded=decision.reason == "NeverFits")
        allocation = decision.allocation
        # Bound only when the ledger grants all of it; otherwise the reason says what it lacks.
        if decision.reason == "Bound" and allocation.replicas == deployment.spec.replicas:
            step.condition("StorageBound", "True", "Bound", decision.message)
        else:
            reason = decision.reason if decision.reason != "Bound" else "InsufficientCapacity"
            step.condition("StorageBound", "False", reason, decision.message)
            if allocation.replicas < deployment.spec.replicas:
                held_back = (
                    reason,
                    f"{allocation.replicas}/{deployment.spec.replicas} replicas admitted to KVPool "
                    f"{storage.pool_ref}: {decision.message}",
                )
        binding = _binding(pool, decision, volume_size(claims, statefulset))
        rendered = deployment.model_copy(
            update={"spec": deployment.spec.model_copy(update={"replicas": allocation.replicas})}
        )
        quota = kv_volume(rendered, pool, binding).quota  # capped by the volumes
        step.status["kv"] = {"storage": {"quota": format_quantity(quota)}}
    reasons = check_fit(deployment, nodes, config.render, pool) if nodes else ["no nodes are known yet"]
    if reasons:
        raise step.stop("DoesNotFit", "; ".join(reasons))
    try:
        children = render_deployment(rendered, pool, config.render, binding)
    except RenderError as error:
        where = f"{error.field}: " if error.field else ""
        raise step.stop(error.reason, f"{where}{error}") from None
    if statefulset is not None:
        problem = keep_claim_templates(next(c for c in children if c["kind"] == "StatefulSet"), statefulset)
        if problem:
            raise step.stop("StatefulSetImmutable", problem)
    children = [annotated(child) for child in children]
    for child in children:
        if (
            child["kind"] == "PersistentVolume"
            and observed.named("PersistentVolume", child["metadata"]["name"]) is None
            and await _being_reclaimed(kube, child["metadata"]["name"])
        ):
            raise step.stop(
                "VolumeReclaiming",
                f"PersistentVolume {child['metadata']['name']} of an earlier replica "
                f"is still being reclaimed (spec.volumeReclaim of KVPool "
                f"{storage.pool_ref if storage else ''}); the replica waits for it",
                degraded=False,
            )
    await apply_children(kube, world.applied, observed, children)
    kinds = [kind for kind in CHILD_RESOURCES if kind != "PodMonitor" or config.render.pod_monitor]
    await prune_children(kube, observed, children, kinds)
    if storage is not None and binding is not None and deployment.spec.kv_cache.mode == "LMCacheMP":
        namespace = deployment.metadata.namespace or ""
        due = [
            pod
            for pod in await world.pods(deployment)
            if not quota_in_place(pod, quota, world.scraped_quota(namespace, name, pod["metadata"]["name"]))
        ]
        results = await apply_quotas(
            kube,
            world.http,
            due,
            quota,
            config.render.lmcache_http_port,
            replicas_now=partial(world.pods, deployment),
        )
        failed = [
            f"{r.pod}: {r.detail}"
            for r in results
            if not (r.applied or r.skipped or r.unanswered)  # the next resync retries those
        ]
        if failed:
            step.condition("Degraded", "True", "QuotaNotApplied", "; ".join(failed))
            raise step.stop("QuotaNotApplied", "; ".join(failed))
    expansion = (
        await expand_claims(kube, deployment, pool, claims) if pool is not None and storage is not None else None
    )
    await _workload_status(world, deployment, step)
    if held_back is not None:  # Ready says why the missing replicas do not run, not only that they do not
        step.condition("Ready", "False", *held_back)
    if expansion:
        step.condition("Degraded", "True", "VolumeExpansionNotAllowed", expansion)


async def _being_reclaimed(kube: KubeClient, name: str) -> bool:
    """Whether the PersistentVolume `name` was given back to its pool (the same name rendered again must wait)."""
    volume = await kube.get_or_none(PERSISTENT_VOLUMES, None, name)
    return bool(volume and (volume["metadata"].get("labels") or {}).get(RELEASED_LABEL))


async def _workload_status(world: World, deployment: InferenceDeployment, step: Pass) -> None:
    statefulset = world.observed.named("StatefulSet", deployment.metadata.name or "") or {}
    observed = statefulset.get("status") or {}
    desired = deployment.spec.replicas
    replicas, ready = observed.get("replicas", 0), observed.get("readyReplicas", 0)
    updated = observed.get("updatedReplicas", 0)
    step.status.update(replicas=replicas, readyReplicas=ready)
    stale = observed.get("observedGeneration", 0) < statefulset.get("metadata", {}).get("generation", 0)
    if stale or updated < replicas or replicas != desired:
        step.condition("Progressing", "True", "RollingOut", f"{updated}/{desired} replicas updated, {replicas} running")
    else:
        step.condition("Progressing", "False", "Stable", f"{desired} replicas on the current spec")
    step.condition("Degraded", "False", "AsExpected")
    if ready >= desired and not stale:
        step.condition(
            "Ready", "True", "AllReplicasReady" if desired else "ScaledToZero", f"{ready}/{desired} replicas ready"
        )
    else:
        pods = await world.pods(deployment)
        grace_seconds = world.config.start_grace_seconds
        step.condition(
            "Ready", "False", *not_ready(pods, ready, desired, _false_for(step.before, "Ready"), grace_seconds)
        )


def _holds(whole: Any, part: Any) -> bool:
    """Whether `whole` already has every field of `part` with the same value (a merge patch would not change it)."""
    if isinstance(part, dict):
        return isinstance(whole, dict) and all(_holds(whole.get(key), value) for key, value in part.items())
    return bool(whole == part)


def _false_for(conditions: list[dict[str, Any]], kind: str) -> float:
    """Seconds condition `kind` has been False (0 if it is not False now)."""
    condition = find(conditions, kind)
    if condition is None or condition.get("status") != "False" or not condition.get("lastTransitionTime"):
        return 0.0
    since = datetime.fromisoformat(condition["lastTransitionTime"].replace("Z", "+00:00"))
    return max(0.0, (datetime.now(UTC) - since).total_seconds())
