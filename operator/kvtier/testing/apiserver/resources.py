"""Resource types the emulator serves, and the discovery documents describing them.

A :class:`ResourceType` is one group/version/resource.  Built-in types come from
:data:`BUILTINS`; custom resources are registered from CustomResourceDefinitions (one type per
served version).  Objects are stored per group and plural (see :attr:`ResourceType.storage_key`),
so every served version of a CRD sees the same objects (conversion strategy `None`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass(frozen=True)
class ScaleSpec:
    """Where a scalable kind keeps its replica counts (JSON paths as in a CRD's `scale`)."""

    spec_replicas_path: str = ".spec.replicas"
    status_replicas_path: str = ".status.replicas"
    label_selector_path: str | None = None
    # Built-ins keep a LabelSelector object at spec.selector instead of a string.
    selector_from_spec: bool = False


@dataclass
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    status: bool = False
    scale: ScaleSpec | None = None
    custom: bool = False
    schema: dict[str, Any] | None = None
    printer_columns: list[dict[str, Any]] = field(default_factory=list)
    storage_version: bool = True

    def __post_init__(self) -> None:
        if not self.singular:
            self.singular = self.kind.lower()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def storage_key(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    def describe(self) -> list[dict[str, Any]]:
        """The APIResource entries (the resource and its subresources) for discovery."""
        entries: list[dict[str, Any]] = [
            {
                "name": self.plural,
                "singularName": self.singular,
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": ALL_VERBS,
                **({"shortNames": self.short_names} if self.short_names else {}),
                **({"categories": self.categories} if self.categories else {}),
            }
        ]
        if self.status:
            entries.append(
                {
                    "name": f"{self.plural}/status",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "kind": self.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        if self.scale:
            entries.append(
                {
                    "name": f"{self.plural}/scale",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "group": "autoscaling",
                    "version": "v1",
                    "kind": "Scale",
                    "verbs": ["get", "patch", "update"],
                }
            )
        return entries


_WORKLOAD_SCALE = ScaleSpec(selector_from_spec=True)


def _b(group: str, version: str, plural: str, kind: str, namespaced: bool = True, **kw: Any) -> ResourceType:
    return ResourceType(group=group, version=version, plural=plural, kind=kind, namespaced=namespaced, **kw)


BUILTINS: list[ResourceType] = [
    _b("", "v1", "namespaces", "Namespace", False, short_names=["ns"], status=True),
    _b("", "v1", "pods", "Pod", short_names=["po"], categories=["all"], status=True),
    _b("", "v1", "services", "Service", short_names=["svc"], categories=["all"], status=True),
    _b("", "v1", "configmaps", "ConfigMap", short_names=["cm"]),
    _b("", "v1", "secrets", "Secret"),
    _b("", "v1", "events", "Event", short_names=["ev"]),
    _b("", "v1", "persistentvolumes", "PersistentVolume", False, short_names=["pv"], status=True),
    _b("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", short_names=["pvc"], status=True),
    _b("", "v1", "nodes", "Node", False, short_names=["no"], status=True),
    _b("", "v1", "serviceaccounts", "ServiceAccount", short_names=["sa"]),
    _b("", "v1", "endpoints", "Endpoints", short_names=["ep"]),
    _b(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        short_names=["deploy"],
        categories=["all"],
        status=True,
        scale=_WORKLOAD_SCALE,
    ),
    _b(
        "apps",
        "v1",
        "statefulsets",
        "StatefulSet",
        short_names=["sts"],
        categories=["all"],
        status=True,
        scale=_WORKLOAD_SCALE,
    ),
    _b(
        "apps",
        "v1",
        "replicasets",
        "ReplicaSet",
        short_names=["rs"],
        categories=["all"],
        status=True,
        scale=_WORKLOAD_SCALE,
    ),
    _b("apps", "v1", "daemonsets", "DaemonSet", short_names=["ds"], categories=["all"], status=True),
    _b("batch", "v1", "jobs", "Job", categories=["all"], status=True),
    _b("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", short_names=["pdb"], status=True),
    _b("storage.k8s.io", "v1", "storageclasses", "StorageClass", False, short_names=["sc"]),
    _b("coordination.k8s.io", "v1", "leases", "Lease"),
    _b("events.k8s.io", "v1", "events", "Event", short_names=["ev"]),
    _b("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice"),
    _b(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        False,
        short_names=["crd", "crds"],
        status=True,
    ),
    _b("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    _b("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    _b("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    _b("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    _b(
        "autoscaling",
        "v2",
        "horizontalpodautoscalers",
        "HorizontalPodAutoscaler",
        short_names=["hpa"],
        categories=["all"],
        status=True,
    ),
]


_VERSION_RE = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def version_priority(version: str) -> tuple[int, int, int, str]:
    """Kubernetes version ordering: GA > beta > alpha, higher numbers first; others last by name."""
    m = _VERSION_RE.match(version)
    if not m:
        return (3, 0, 0, version)
    major, stage, minor = int(m.group(1)), m.group(2), int(m.group(3) or 0)
    rank = {None: 0, "beta": 1, "alpha": 2}[stage]
    return (rank, -major, -minor, "")


def types_from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """One ResourceType per served version of a CustomResourceDefinition."""
    spec = crd.get("spec", {})
    names = spec.get("names", {})
    types = []
    for v in spec.get("versions", []):
        if not v.get("served", True):
            continue
        subresources = v.get("subresources") or {}
        scale = None
        if "scale" in subresources:
            s = subresources["scale"] or {}
            scale = ScaleSpec(
                spec_replicas_path=s.get("specReplicasPath", ".spec.replicas"),
                status_replicas_path=s.get("statusReplicasPath", ".status.replicas"),
                label_selector_path=s.get("labelSelectorPath"),
            )
        types.append(
            ResourceType(
                group=spec["group"],
                version=v["name"],
                plural=names["plural"],
                kind=names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                singular=names.get("singular") or names["kind"].lower(),
                short_names=list(names.get("shortNames") or []),
                categories=list(names.get("categories") or []),
                status="status" in subresources,
                scale=scale,
                custom=True,
                schema=(v.get("schema") or {}).get("openAPIV3Schema"),
                printer_columns=list(v.get("additionalPrinterColumns") or []),
                storage_version=bool(v.get("storage", False)),
            )
        )
    return types


class Registry:
    """All served resource types, indexed for routing and discovery."""

    def __init__(self) -> None:
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        for rt in BUILTINS:
            self.add(rt)

    def add(self, rt: ResourceType) -> None:
        self._types[(rt.group, rt.version, rt.plural)] = rt

    def remove_group_resource(self, group: str, plural: str) -> None:
        for key in [k for k in self._types if k[0] == group and k[2] == plural]:
            del self._types[key]

    def get(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._types.get((group, version, plural))

    def all(self) -> list[ResourceType]:
        return list(self._types.values())

    def storage_types(self) -> list[ResourceType]:
        """One type per stored collection (the storage version for CRDs)."""
        chosen: dict[tuple[str, str], ResourceType] = {}
        for rt in self._types.values():
            if rt.storage_key not in chosen or rt.storage_version:
                chosen[rt.storage_key] = rt
        return list(chosen.values())

    def versions(self, group: str) -> list[str]:
        found = {rt.version for rt in self._types.values() if rt.group == group}
        return sorted(found, key=version_priority)

    def groups(self) -> list[str]:
        """Named API groups in a stable order (built-ins first, as registered)."""
        seen: dict[str, None] = {}
        for rt in self._types.values():
            if rt.group:
                seen.setdefault(rt.group)
        return list(seen)

    # -- discovery documents -------------------------------------------------------------------

    def api_versions(self, server_address: str) -> dict[str, Any]:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
        }

    def group_document(self, group: str) -> dict[str, Any] | None:
        versions = self.versions(group)
        if not versions:
            return None
        return {
            "name": group,
            "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
            "preferredVersion": {"groupVersion": f"{group}/{versions[0]}", "version": versions[0]},
        }

    def group_list(self) -> dict[str, Any]:
        groups = [self.group_document(g) for g in self.groups()]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [g for g in groups if g]}

    def resource_list(self, group: str, version: str) -> dict[str, Any] | None:
        types = [rt for rt in self._types.values() if rt.group == group and rt.version == version]
        if not types:
            return None
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": [entry for rt in types for entry in rt.describe()],
        }
