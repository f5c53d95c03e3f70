"""The real-control-plane ground: :class:`~kvtier.testing.controlplane.ControlPlane` + kvtier's CRDs + simulated
kubelets (and a stand-in CSI provisioner) + the operator, which runs with its own ServiceAccount's token when
given the RBAC objects it is installed with (so the real authorizer judges every request it makes).

    async with ControlPlaneCluster(operator=OperatorConfig(), operator_rbac=rbac_objects(docs)) as cluster: ...
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvtier.api.crd import build_crds
from kvtier.kube import CUSTOMRESOURCEDEFINITIONS, APIError, Resource
from kvtier.testing import podsim
from kvtier.testing.cluster import SimulatedCluster
from kvtier.testing.controlplane import ControlPlane, find_binaries
from kvtier.testing.podsim import NodeSpec

#: Kinds that make up the operator's identity and permissions in an install manifest.
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
_RBAC_RESOURCES = {
    "ServiceAccount": Resource("", "v1", "serviceaccounts"),
    "ClusterRole": Resource("rbac.authorization.k8s.io", "v1", "clusterroles", namespaced=False),
    "ClusterRoleBinding": Resource("rbac.authorization.k8s.io", "v1", "clusterrolebindings", namespaced=False),
    "Role": Resource("rbac.authorization.k8s.io", "v1", "roles"),
    "RoleBinding": Resource("rbac.authorization.k8s.io", "v1", "rolebindings"),
}


def rbac_objects(documents: Iterable[dict[str, Any] | None]) -> list[dict[str, Any]]:
    """The ServiceAccount and RBAC objects of a manifest (install.yaml, `helm template` output)."""
    return [doc for doc in documents if doc and doc.get("kind") in RBAC_KINDS]


class ControlPlaneCluster(SimulatedCluster):
    """The real API server, controllers and scheduler; the pod simulator only as kubelets and CSI provisioner."""

    components = podsim.UNDER_CONTROL_PLANE

    def __init__(
        self,
        nodes: list[NodeSpec] | None = None,
        *,
        binaries: Path | None = None,
        operator_rbac: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ):
        super().__init__(nodes, **kwargs)
        self.control_plane = ControlPlane(binaries or find_binaries(), kubeconfig=self.kubeconfig)
        #: The operator's ServiceAccount and RBAC objects; None: the operator uses the admin's credentials.
        self.operator_rbac = operator_rbac

    @property
    def url(self) -> str:
        return self.control_plane.url

    async def _start_api(self) -> None:
        await asyncio.to_thread(self.control_plane.start)

    async def _stop_api(self) -> None:
        await asyncio.to_thread(self.control_plane.stop)

    async def _install_crds(self) -> None:
        assert self.kube is not None
        crds = build_crds()
        for crd in crds.values():
            await self.kube.apply(CUSTOMRESOURCEDEFINITIONS, crd, field_manager="kvtier-test")
        await wait_established(self.kube, [crd["metadata"]["name"] for crd in crds.values()])

    async def _prepare_operator(self) -> None:
        await super()._prepare_operator()
        assert self.kube is not None and self.operator is not None
        if self.operator_rbac is None:
            return
        for obj in self.operator_rbac:
            await self.kube.apply(_RBAC_RESOURCES[obj["kind"]], obj, field_manager="kvtier-test")
        account = next(obj for obj in self.operator_rbac if obj["kind"] == "ServiceAccount")
        token = await self.service_account_token(account["metadata"]["namespace"], account["metadata"]["name"])
        path = self.kubeconfig.with_name("operator.kubeconfig")
        self.control_plane.write_kubeconfig(path, user=f"{account['metadata']['name']}-token", token=token)
        self.operator = replace(self.operator, kubeconfig=path)

    async def service_account_token(self, namespace: str, name: str, seconds: int = 86400) -> str:
        """A token for the account from the TokenRequest API (what a projected volume gives a pod)."""
        assert self.kube is not None
        reply = await self.kube.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": seconds}},
        )
        return str(reply["status"]["token"])


async def wait_established(kube: Any, names: list[str], timeout: float = 60) -> None:
    """Until every named CRD is Established (its API is served)."""
    deadline = time.monotonic() + timeout
    pending = list(names)
    while pending:
        for name in list(pending):
            try:
                crd = await kube.get(CUSTOMRESOURCEDEFINITIONS, None, name)
            except APIError:
                continue
            if any(
                c.get("type") == "Established" and c.get("status") == "True"
                for c in (crd.get("status") or {}).get("conditions") or []
            ):
                pending.remove(name)
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"CRDs not Established within {timeout}s: {pending}")
        await asyncio.sleep(0.2)
