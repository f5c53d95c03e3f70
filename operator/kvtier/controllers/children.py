"""An InferenceDeployment's children as the cluster holds them (watch-fed indexes), applied only when they changed.

A reconcile pass reads no child from the API: kopf indexes, fed by one watch per kind, hold every
object that carries the deployment label (`kvtier.io/deployment`), by the deployment's
`(namespace, name)`. From them a pass

- applies (server-side) only the children that need it (:class:`Applied`): one missing, one whose
  rendered manifest changed (its digest, kept on the object as the `kvtier.io/applied-digest`
  annotation, differs), or one whose fields kvtier owns were changed by someone else since the
  operator's last apply (drift: the object as it is, projected onto the fields rendered, differs
  from the same projection of what that apply returned; an object at the resourceVersion last
  compared is not projected again). A restarted operator trusts the annotation
  and takes what it sees as the baseline, so coming back applies nothing that did not change;
- prunes the indexed children the spec no longer renders, and strays that carry the label;
- reads the StatefulSet and the replicas' claims from the same indexes.

The indexes lag the API by a watch event: a pass that sees an object older than its own last apply
applies once more (idempotent), and a pass that misses a just-created object applies it again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from kvtier.contract import DEPLOYMENT_LABEL, DEPLOYMENT_NAMESPACE_LABEL
from kvtier.controllers.reclaim import release_volume
from kvtier.controllers.runtime import FIELD_MANAGER, OperatorConfig
from kvtier.kube import (
    CONFIGMAPS,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    PODDISRUPTIONBUDGETS,
    PODMONITORS,
    SERVICES,
    STATEFULSETS,
    APIError,
    KubeClient,
    Resource,
)

#: Every kind an InferenceDeployment owns, by `kind`: applied, and pruned when no longer rendered.
CHILD_RESOURCES: dict[str, Resource] = {
    "ConfigMap": CONFIGMAPS,
    "Service": SERVICES,
    "StatefulSet": STATEFULSETS,
    "PodDisruptionBudget": PODDISRUPTIONBUDGETS,
    "PodMonitor": PODMONITORS,
    "PersistentVolume": PERSISTENT_VOLUMES,
}
#: The replicas' claims (made by the StatefulSet from its templates): read, never applied.
CLAIMS = "PersistentVolumeClaim"
DIGEST_ANNOTATION = "kvtier.io/applied-digest"

Key = tuple[str, str, str, str | None, str]  # owner namespace, owner name, kind, object namespace, object name


class ApplyFailed(Exception):
    """The API did not take one child's apply (a quota, an admission webhook, a full Service range...)."""

    def __init__(self, child: Mapping[str, Any], error: APIError):
        self.error = error
        answer = error.body.get("message") if isinstance(error.body, dict) else str(error.body)[:200]
        super().__init__(f"{child['kind']} {child['metadata']['name']} was not applied: {error.status} {answer}")


def _index_id(kind: str) -> str:
    return f"children_{kind.lower()}"


def _trimmed(body: Mapping[str, Any]) -> dict[str, Any]:
    metadata = {k: v for k, v in (body.get("metadata") or {}).items() if k != "managedFields"}
    return {**{k: v for k, v in body.items() if k != "metadata"}, "metadata": metadata}


def register_indexes(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    """One kopf index per child kind: `(deployment namespace, deployment name)` -> the objects."""
    resources = {**CHILD_RESOURCES, CLAIMS: PERSISTENT_VOLUME_CLAIMS}
    for kind, resource in resources.items():
        if kind == "PodMonitor" and not config.render.pod_monitor:
            continue

        async def index(body: kopf.Body, **_: Any) -> dict[tuple[str, str], dict[str, Any]] | None:
            labels = body.metadata.labels
            owner_namespace = labels.get(DEPLOYMENT_NAMESPACE_LABEL) or body.metadata.namespace
            if not owner_namespace or body.metadata.get("deletionTimestamp"):
                return None
            return {(owner_namespace, labels[DEPLOYMENT_LABEL]): _trimmed(body)}

        kopf.index(
            resource.group,
            resource.version,
            resource.plural,
            id=_index_id(kind),
            labels={DEPLOYMENT_LABEL: kopf.PRESENT},
            registry=registry,
        )(index)


class Observed:
    """One deployment's children as the indexes hold them (handler kwargs in, objects by kind out)."""

    def __init__(self, indexes: Mapping[str, Any], namespace: str, name: str) -> None:
        self.namespace, self.name = namespace, name
        self._indexes = indexes

    def of(self, kind: str) -> list[dict[str, Any]]:
        index = self._indexes.get(_index_id(kind))
        return list(index.get((self.namespace, self.name), [])) if index is not None else []

    def named(self, kind: str, name: str) -> dict[str, Any] | None:
        return next((o for o in self.of(kind) if o["metadata"]["name"] == name), None)

    def claims(self) -> list[dict[str, Any]]:
        return self.of(CLAIMS)


def digest(child: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(child, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


def project(observed: Any, rendered: Any) -> Any:
    """`observed` cut down to the fields `rendered` sets (what kvtier owns of the object)."""
    if isinstance(rendered, dict) and isinstance(observed, dict):
        return {key: project(observed.get(key), value) for key, value in rendered.items()}
    if isinstance(rendered, list) and isinstance(observed, list) and len(rendered) == len(observed):
        return [project(o, r) for o, r in zip(observed, rendered)]
    return observed


@dataclass(frozen=True)
class _Record:
    digest: str
    #: The digest of what the child held of the rendered fields, and at which resourceVersion it was seen:
    #: an object at the same resourceVersion is unchanged, so it is not projected again.
    projection_digest: str
    resource_version: str | None


def _seen(child: dict[str, Any], observed: dict[str, Any]) -> _Record:
    return _Record(
        child["metadata"]["annotations"][DIGEST_ANNOTATION],
        digest(project(observed, child)),
        observed["metadata"].get("resourceVersion"),
    )


class Applied:
    """What this operator process last applied of each child (lost on restart: the annotation stands in)."""

    def __init__(self) -> None:
        self._records: dict[Key, _Record] = {}

    def needs_apply(self, key: Key, child: dict[str, Any], observed: dict[str, Any] | None) -> bool:
        """Whether `child` (annotated with its digest) must be applied, seeing `observed`."""
        if observed is None:
            return True
        wanted = child["metadata"]["annotations"][DIGEST_ANNOTATION]
        if (observed["metadata"].get("annotations") or {}).get(DIGEST_ANNOTATION) != wanted:
            return True
        record = self._records.get(key)
        version = observed["metadata"].get("resourceVersion")
        if (
            record is not None
            and record.digest == wanted
            and version is not None
            and record.resource_version == version
        ):
            return False  # not changed since it was last compared
        seen = _seen(child, observed)
        if record is None or record.digest != wanted:
            self._records[key] = seen  # a restart: what is there is what was applied
            return False
        if record.projection_digest != seen.projection_digest:
            return True
        self._records[key] = seen  # changed only in fields kvtier does not own (status, others' labels)
        return False

    def applied(self, key: Key, child: dict[str, Any], result: dict[str, Any]) -> None:
        self._records[key] = _seen(child, result)

    def forget(self, namespace: str, name: str) -> None:
        """Drop what is remembered of a deployment's children (it is gone)."""
        for key in [k for k in self._records if k[:2] == (namespace, name)]:
            del self._records[key]


def annotated(child: dict[str, Any]) -> dict[str, Any]:
    """The child with its rendered manifest's digest as an annotation."""
    metadata = child["metadata"]
    return {
        **child,
        "metadata": {**metadata, "annotations": {**metadata.get("annotations", {}), DIGEST_ANNOTATION: digest(child)}},
    }


def key_of(observed: Observed, child: Mapping[str, Any]) -> Key:
    metadata = child["metadata"]
    return observed.namespace, observed.name, child["kind"], metadata.get("namespace"), metadata["name"]


async def apply_children(
    kube: KubeClient, applied: Applied, observed: Observed, children: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Apply the children that need it (volumes first, so claims find them); the ones applied.

    A conflict (409) propagates as it is (a retry resolves it); any other refusal as `ApplyFailed`."""
    done = []
    for child in sorted(children, key=lambda c: c["kind"] != "PersistentVolume"):
        key = key_of(observed, child)
        if not applied.needs_apply(key, child, observed.named(child["kind"], child["metadata"]["name"])):
            continue
        try:
            result = await kube.apply(CHILD_RESOURCES[child["kind"]], child, field_manager=FIELD_MANAGER)
        except APIError as error:
            if error.status == 409:
                raise
            raise ApplyFailed(child, error) from error
        applied.applied(key, child, result)
        done.append(child)
    return done


async def prune_children(
    kube: KubeClient, observed: Observed, children: Iterable[dict[str, Any]], kinds: Iterable[str]
) -> None:
    """Delete the deployment's indexed children of `kinds` that the current spec does not render."""
    wanted = {(c["kind"], c["metadata"]["name"]) for c in children}
    for kind in kinds:
        for item in observed.of(kind):
            if (kind, item["metadata"]["name"]) in wanted:
                continue
            if kind == "PersistentVolume":
                await release_volume(kube, item)  # an ordinal scaled away: its pool reclaims the volume
            else:
                await kube.delete(CHILD_RESOURCES[kind], item["metadata"].get("namespace"), item["metadata"]["name"])
