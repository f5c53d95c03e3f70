"""Small synchronous helpers over the `cluster` fixture's async client, for end-to-end tests."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from kvtier.kube import EVENTS, INFERENCEDEPLOYMENTS, KVPOOLS, STORAGECLASSES, Resource
from tests.conftest import EXAMPLES, wait_for

KUBECTL = Path(sys.executable).parent / "kubectl"
TI = 2**40


def get(cluster, resource: Resource, namespace: str | None, name: str) -> dict[str, Any] | None:
    return cluster.run(cluster.kube.get_or_none(resource, namespace, name))


def items(cluster, resource: Resource, namespace: str | None = None, selector: str | None = None) -> list[dict]:
    return cluster.run(cluster.kube.list(resource, namespace, label_selector=selector))["items"]


def create(cluster, resource: Resource, body: dict[str, Any]) -> dict[str, Any]:
    return cluster.run(cluster.kube.create(resource, body))


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    """The condition `kind` of an object (an empty dict when absent)."""
    conditions = ((obj or {}).get("status") or {}).get("conditions", [])
    return next((c for c in conditions if c.get("type") == kind), {})


def events(cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    return [e for e in items(cluster, EVENTS, namespace) if e["involvedObject"]["name"] == name]


def posted(cluster, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    """The Events `reason` about `name`, once at least one is there.

    The operator posts a pass's Events after it writes the status, so a test that has just seen the
    status waits for them rather than reading them at once."""
    return wait_for(
        lambda: [e for e in events(cluster, namespace, name) if e["reason"] == reason],
        timeout=30,
        message=f"an Event {reason} about {name}",
    )


def kubectl(cluster, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": os.environ.get("HOME", "/tmp")}
    result = subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(cluster.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
    return result


def example(name: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / name).read_text())


SIM_CLASS = "sim-fast"


def ensure_sim_storage_class(cluster) -> None:
    """The StorageClass `csi_pool` names (the embedded cluster's pod simulator provisions for it)."""
    if get(cluster, STORAGECLASSES, None, SIM_CLASS) is None:
        cluster.run(
            cluster.kube.create(
                STORAGECLASSES,
                {
                    "apiVersion": "storage.k8s.io/v1",
                    "kind": "StorageClass",
                    "metadata": {"name": SIM_CLASS},
                    "provisioner": "csi.example.com",
                    "reclaimPolicy": "Delete",
                },
            )
        )


def csi_pool(name: str, capacity: str) -> dict[str, Any]:
    return {
        "apiVersion": "kvtier.io/v1alpha1",
        "kind": "KVPool",
        "metadata": {"name": name},
        "spec": {
            "capacity": capacity,
            "storage": {"csi": {"storageClassName": SIM_CLASS}},
            "rebalance": {"policy": "Static"},
        },
    }


def deployment(
    namespace: str,
    name: str,
    pool: str | None,
    *,
    replicas: int = 1,
    request: str = "1Ti",
    minimum: str | None = None,
    tp: int = 1,
) -> dict[str, Any]:
    """A small InferenceDeployment (TP `tp`, 8Gi CPU tier) drawing `request` per replica from `pool`."""
    body = copy.deepcopy(example("inferencedeployment.yaml"))
    body["metadata"] = {"name": name, "namespace": namespace}
    spec = body["spec"]
    spec["replicas"] = replicas
    spec["engine"].update(tensorParallelSize=tp, args=[], resources={"requests": {"cpu": "4", "memory": "16Gi"}})
    spec["kvCache"]["cpu"] = {"size": "8Gi"}
    if pool is None:
        del spec["kvCache"]["storage"]
    else:
        spec["kvCache"]["storage"] = {"poolRef": pool, "request": request, "min": minimum or request, "max": request}
    return body


def create_pool(cluster, body: dict[str, Any]) -> dict[str, Any]:
    return create(cluster, KVPOOLS, body)


def create_deployment(cluster, body: dict[str, Any]) -> dict[str, Any]:
    return create(cluster, INFERENCEDEPLOYMENTS, body)


def delete_pool(cluster, name: str) -> None:
    """Delete a pool and wait until it is gone.

    Its released volumes are wiped by Jobs, checked every resync (10 s): on a slow 2-core machine with
    the real control plane that has taken over a minute, longer than `kubectl delete` may wait here.
    """
    kubectl(cluster, "delete", "kvp", name, "--ignore-not-found", "--wait=false")
    wait_for(lambda: get(cluster, KVPOOLS, None, name) is None, timeout=180, message=f"pool {name} gone")
