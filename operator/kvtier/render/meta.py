"""Names, labels and owner references of an InferenceDeployment's children."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtier.api.inferencedeployment import InferenceDeployment
from kvtier.contract import DEPLOYMENT_LABEL, DEPLOYMENT_NAMESPACE_LABEL

ENGINE_NAME = "kvtier-engine"
#: Namespace of an object read from a file that does not name one (kubectl would use the context's).
DEFAULT_NAMESPACE = "default"


def name_of(deployment: InferenceDeployment) -> str:
    """The InferenceDeployment's name: also the StatefulSet's, the API Service's and the PDB's."""
    assert deployment.metadata.name, "a rendered InferenceDeployment has a name"
    return deployment.metadata.name


def namespace_of(deployment: InferenceDeployment) -> str:
    return deployment.metadata.namespace or DEFAULT_NAMESPACE


def headless_service_name(deployment: InferenceDeployment) -> str:
    return f"{name_of(deployment)}-headless"


def config_map_name(deployment: InferenceDeployment) -> str:
    return f"{name_of(deployment)}-lmcache"


def selector_labels(deployment: InferenceDeployment) -> dict[str, str]:
    """Labels that select the pods; they never change for the life of the deployment."""
    return {"app.kubernetes.io/name": ENGINE_NAME, "app.kubernetes.io/instance": name_of(deployment)}


def selector(deployment: InferenceDeployment) -> str:
    """The pod selector as a string (`status.selector`, for the scale subresource)."""
    return ",".join(f"{key}={value}" for key, value in selector_labels(deployment).items())


def labels(deployment: InferenceDeployment) -> dict[str, str]:
    """Labels on every child and every pod."""
    return {
        **selector_labels(deployment),
        "app.kubernetes.io/managed-by": "kvtier",
        "app.kubernetes.io/part-of": "kvtier",
        DEPLOYMENT_LABEL: name_of(deployment),
    }


def cluster_labels(deployment: InferenceDeployment) -> dict[str, str]:
    """Labels of a cluster-scoped child: they name the owning deployment, namespace included."""
    return {**labels(deployment), DEPLOYMENT_NAMESPACE_LABEL: namespace_of(deployment)}


def owner_reference(body: Mapping[str, Any]) -> dict[str, Any]:
    """The controller reference to an object (a kopf body or any wire dict with `metadata.uid`)."""
    metadata = body["metadata"]
    return {
        "apiVersion": body["apiVersion"],
        "kind": body["kind"],
        "name": metadata["name"],
        "uid": metadata["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_meta(deployment: InferenceDeployment, name: str) -> dict[str, Any]:
    """`metadata` of a namespaced child: labels, and the owner reference once the deployment has a uid.

    Objects rendered offline from a file (no uid yet) carry no owner reference.
    """
    meta: dict[str, Any] = {"name": name, "namespace": namespace_of(deployment), "labels": labels(deployment)}
    if deployment.metadata.uid:
        # From the fields an owner reference needs (dumping the whole model for them was a sixth of the
        # operator's CPU at 1,000 deployments: every pass renders every child).
        meta["ownerReferences"] = [
            owner_reference(
                {
                    "apiVersion": deployment.api_version,
                    "kind": deployment.kind,
                    "metadata": {"name": name_of(deployment), "uid": deployment.metadata.uid},
                }
            )
        ]
    return meta
