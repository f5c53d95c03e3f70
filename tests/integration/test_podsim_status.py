"""The simulated kubelet writes pod status as a kubelet's status manager does, against the embedded API server:
a strategic merge naming only its own conditions, so a readiness gate the operator opened after the kubelet's
copy of the pod was read survives its next write (a merge patch of the whole list erased it, and under load the
gate flapped until a later pass opened it again)."""

from __future__ import annotations

import copy

from kvtier.contract import QUOTA_GATE
from kvtier.kube import PODS, KubeClient
from kvtier.rebalance.actuator import open_gate
from kvtier.testing.cluster import EmbeddedCluster
from kvtier.testing.podsim.kubelet import Kubelet

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "gated", "namespace": "default"},
    "spec": {
        "schedulerName": "someone-else",  # the simulator leaves it alone: only this test writes its status
        "readinessGates": [{"conditionType": QUOTA_GATE}],
        "containers": [{"name": "engine", "image": "example.com/engine:1"}],
    },
}


class StatusWriter(Kubelet):
    """The kubelet's status writer alone."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube


def conditions(pod) -> dict[str, str]:
    return {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}


async def test_a_status_write_from_an_older_copy_keeps_the_gate_opened_meanwhile():
    async with EmbeddedCluster() as cluster:
        kube = cluster.kube
        created = await kube.create(PODS, copy.deepcopy(POD), namespace="default")
        kubelet_copy = copy.deepcopy(created)  # read before the operator opens the gate
        await open_gate(kube, await kube.get(PODS, "default", "gated"), "limit_gb=1 on _default")
        await StatusWriter(kube)._set_pod_conditions(
            kubelet_copy, {"ContainersReady": ("True", "", ""), "Ready": ("True", "", "")}
        )
        after = conditions(await kube.get(PODS, "default", "gated"))
        assert after == {QUOTA_GATE: "True", "ContainersReady": "True", "Ready": "True"}


async def test_an_unchanged_status_is_not_written_again():
    async with EmbeddedCluster() as cluster:
        kube = cluster.kube
        await kube.create(PODS, copy.deepcopy(POD), namespace="default")
        await open_gate(kube, await kube.get(PODS, "default", "gated"), "limit_gb=1 on _default")
        writer = StatusWriter(kube)
        await writer._set_pod_conditions(await kube.get(PODS, "default", "gated"), {"Ready": ("True", "", "")})
        before = len(cluster.server.requests)
        await writer._set_pod_conditions(await kube.get(PODS, "default", "gated"), {"Ready": ("True", "", "")})
        writes = [r.verb for r in cluster.server.requests.records[before:] if r.verb == "patch"]
        assert writes == [], "the same conditions, in whatever order the server keeps them, were written again"
