"""What kube-scheduler does, for the embedded cluster: first fitting node by name."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from kvtier.api.units import quantity_value
from kvtier.kube import NODES, PERSISTENT_VOLUME_CLAIMS, PODS, KubeClient
from kvtier.testing.podsim.objects import isolated, pod_requests


class Scheduler:
    """Binds pending pods to nodes (requests, nodeSelector and bound claims; no taints)."""

    kube: KubeClient

    async def _schedule(self, pods: list[dict[str, Any]]) -> None:
        claims = {
            (c["metadata"]["namespace"], c["metadata"]["name"]): c
            for c in (await self.kube.list(PERSISTENT_VOLUME_CLAIMS))["items"]
        }
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
            if pod["spec"].get("schedulerName", "default-scheduler") != "default-scheduler":
                continue  # another scheduler's pod, as kube-scheduler leaves it
            reason = self._unbound_claims(pod, claims)
            chosen = None
            if reason is None:
                chosen, reason = self._fit(pod, nodes, used)
            name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
            if chosen is None:
                await isolated(pod, self._set_pod_conditions(pod, {"PodScheduled": ("False", "Unschedulable", reason)}))
                continue
            for resource, value in pod_requests(pod).items():
                used[chosen][resource] = used[chosen].get(resource, Decimal(0)) + value
            used[chosen]["pods"] += 1
            await isolated(pod, self.kube.patch(PODS, namespace, name, {"spec": {"nodeName": chosen}}))

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
    def _fit(
        pod: dict[str, Any], nodes: dict[str, dict[str, Any]], used: dict[str, dict[str, Decimal]]
    ) -> tuple[str | None, str]:
        requests = {**pod_requests(pod), "pods": Decimal(1)}
        selector = pod["spec"].get("nodeSelector") or {}
        shortages: dict[str, int] = {}
        for name in sorted(nodes):
            labels = nodes[name]["metadata"].get("labels") or {}
            if any(labels.get(k) != v for k, v in selector.items()):
                shortages["node(s) didn't match Pod's node affinity/selector"] = (
                    shortages.get("node(s) didn't match Pod's node affinity/selector", 0) + 1
                )
                continue
            allocatable = (nodes[name].get("status") or {}).get("allocatable") or {}
            short = [
                resource
                for resource, value in requests.items()
                if value > 0
                and used[name].get(resource, Decimal(0)) + value > quantity_value(str(allocatable.get(resource, "0")))
            ]
            if not short:
                return name, ""
            for resource in short:
                key = f"Insufficient {resource}"
                shortages[key] = shortages.get(key, 0) + 1
        detail = ", ".join(f"{count} {reason}" for reason, count in sorted(shortages.items()))
        return None, f"0/{len(nodes)} nodes are available: {detail or 'no nodes'}."
