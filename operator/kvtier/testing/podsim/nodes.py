"""Simulated nodes: what a kubelet registers (allocatable CPU, memory, GPUs and pods; Ready)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvtier.testing.podsim.objects import GPU, now


@dataclass(frozen=True)
class NodeSpec:
    """A simulated node's allocatable resources."""

    name: str
    cpu: str = "128"
    memory: str = "2Ti"
    gpus: int = 8
    pods: int = 110
    labels: dict[str, str] = field(default_factory=dict)

    def as_object(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": {"kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux", **self.labels},
            },
            "spec": {},
        }

    def status(self) -> dict[str, Any]:
        allocatable = {"cpu": self.cpu, "memory": self.memory, GPU: str(self.gpus), "pods": str(self.pods)}
        return {
            "capacity": allocatable,
            "allocatable": allocatable,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "simulated node",
                    "lastHeartbeatTime": now(),
                    "lastTransitionTime": now(),
                }
            ],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": self.name}],
            "nodeInfo": {
                "machineID": self.name,
                "systemUUID": self.name,
                "bootID": self.name,
                "kernelVersion": "simulated",
                "osImage": "kvtier pod simulator",
                "containerRuntimeVersion": "kvtier-sim://1",
                "kubeletVersion": "v1.33.0-kvtier-sim",
                "kubeProxyVersion": "v1.33.0-kvtier-sim",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }
