"""What kvtier renders for the engines: every example manifest and a matrix of specs, as pods' containers."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import yaml

from kvtier.api import InferenceDeployment, KVPool
from kvtier.api.documents import read_documents
from kvtier.contract import DEPLOYMENT_LABEL
from kvtier.render import RenderOptions, render_deployment
from kvtier.render.offline import render_documents
from tests.conftest import EXAMPLES

CSI_BLOCK = {"csi": {"storageClassName": "fast-nvme", "volumeMode": "Block"}}
CSI_FILESYSTEM = {"csi": {"storageClassName": "fast-nvme", "volumeMode": "Filesystem"}}
NVMEOF = {
    "nvmeof": {
        "targets": [{"address": "192.0.2.10"}],
        "namespaces": [
            {"nqn": "nqn.2024-06.com.example:kv-0", "uuid": "5b0c8d4e-0f1a-4c2b-9d3e-000000000000", "size": "2Ti"}
        ],
    }
}
USER_ARGS = ["--max-num-seqs", "64", "--enable-prefix-caching", "--enable-expert-parallel"]


@dataclass(frozen=True)
class Rendered:
    """One rendered InferenceDeployment: its spec and its pod's containers (and LMCache config file)."""

    name: str
    deployment: InferenceDeployment
    containers: dict[str, dict[str, Any]]
    lmcache_yaml: str | None
    template: dict[str, Any]
    """The StatefulSet's pod template."""

    @property
    def vllm_argv(self) -> list[str]:
        """The words after `vllm serve`."""
        container = self.containers["vllm"]
        assert container["command"] == ["vllm", "serve"], container["command"]
        return list(container["args"])

    @property
    def lmcache_argv(self) -> list[str] | None:
        """The words after `lmcache server` (LMCacheMP), else None."""
        container = self.containers.get("lmcache")
        if container is None:
            return None
        assert container["command"] == ["lmcache", "server"], container["command"]
        return list(container["args"])


def _of(name: str, deployment: InferenceDeployment, objects: list[dict[str, Any]]) -> Rendered:
    (sts,) = [obj for obj in objects if obj["kind"] == "StatefulSet"]
    containers = {c["name"]: c for c in sts["spec"]["template"]["spec"]["containers"]}
    config_maps = [obj for obj in objects if obj["kind"] == "ConfigMap"]
    lmcache_yaml = config_maps[0]["data"]["lmcache.yaml"] if config_maps else None
    return Rendered(name, deployment, containers, lmcache_yaml, sts["spec"]["template"])


def examples() -> list[Rendered]:
    """Every InferenceDeployment of manifests/examples, rendered as `kvtier render` does."""
    result = render_documents(read_documents([str(EXAMPLES)]), RenderOptions())
    assert not result.failed, result.messages
    documents = [doc.model for doc in read_documents([str(EXAMPLES)]) if isinstance(doc.model, InferenceDeployment)]
    rendered = []
    for deployment in documents:
        objects = [
            obj
            for obj in result.objects
            if obj["metadata"].get("namespace") == deployment.metadata.namespace
            and obj["metadata"].get("labels", {}).get(DEPLOYMENT_LABEL) == deployment.metadata.name
        ]
        rendered.append(_of(f"example-{deployment.metadata.name}", deployment, objects))
    assert rendered, f"no InferenceDeployment in {EXAMPLES}"
    return rendered


def deployment(
    mode: str = "LMCacheMP",
    tp: int = 1,
    max_model_len: int | None = None,
    args: list[str] | None = None,
    storage: bool = True,
    kv_bytes_per_token: int = 147456,
    cpu: str = "64Gi",
    chunk_size: int = 256,
    served_name: str | None = "chat",
) -> InferenceDeployment:
    engine: dict[str, Any] = {
        "image": "vllm/vllm-openai:v0.33.0",
        "tensorParallelSize": tp,
        "gpuMemoryUtilization": 0.85,
        "args": args or [],
    }
    if max_model_len is not None:
        engine["maxModelLen"] = max_model_len
    kv: dict[str, Any] = {"mode": mode}
    if mode != "None":
        kv |= {"chunkSize": chunk_size, "cpu": {"size": cpu}}
        if storage:
            kv["storage"] = {"poolRef": "pool", "request": "1Ti", "max": "2Ti"}
    model: dict[str, Any] = {"name": "Qwen/Qwen3-8B", "kvBytesPerToken": kv_bytes_per_token}
    if served_name:
        model["servedName"] = served_name
    return InferenceDeployment.model_validate(
        {
            "apiVersion": "kvtier.io/v1alpha1",
            "kind": "InferenceDeployment",
            "metadata": {"name": "chat", "namespace": "ml", "uid": "6f1f9c1e-3a52-4b8e-9a4f-1c2d3e4f5a6b"},
            "spec": {"replicas": 1, "model": model, "engine": engine, "kvCache": kv},
        }
    )


def pool(storage: dict[str, Any], policy: str = "MarginalGain") -> KVPool:
    return KVPool.model_validate(
        {
            "apiVersion": "kvtier.io/v1alpha1",
            "kind": "KVPool",
            "metadata": {"name": "pool"},
            "spec": {"capacity": "8Ti", "storage": storage, "rebalance": {"policy": policy}},
        }
    )


def render(
    name: str,
    spec: InferenceDeployment,
    storage: dict[str, Any] | None = None,
    policy: str = "MarginalGain",
    options: RenderOptions | None = None,
) -> Rendered:
    kv_pool = pool(storage, policy) if storage is not None and spec.spec.kv_cache.storage is not None else None
    return _of(name, spec, render_deployment(spec, kv_pool, options or RenderOptions()))


def vllm_matrix() -> list[Rendered]:
    """Modes x TP 1/2/8 x maxModelLen set or not x user args or none (storage on a block pool where allowed)."""
    cases = []
    for mode, tp, max_len, args in itertools.product(
        ("LMCacheMP", "LMCacheInProcess", "None"), (1, 2, 8), (None, 32768), (None, USER_ARGS)
    ):
        storage = CSI_FILESYSTEM if mode == "LMCacheInProcess" else CSI_BLOCK
        name = f"{mode}-tp{tp}-len{max_len or 'default'}-{'args' if args else 'noargs'}"
        cases.append(render(name, deployment(mode, tp, max_len, args), storage))
    return cases


def lmcache_cases() -> list[Rendered]:
    """Every LMCache mode with and without a storage tier, on every kind of volume it can use."""
    cases = [
        render("mp-block-rebalanced", deployment("LMCacheMP"), CSI_BLOCK),
        render("mp-nvmeof-static", deployment("LMCacheMP"), NVMEOF, policy="Static"),
        render("mp-filesystem", deployment("LMCacheMP"), CSI_FILESYSTEM),
        render("mp-no-storage", deployment("LMCacheMP", storage=False)),
        render("mp-tp8-small-cpu", deployment("LMCacheMP", tp=8, cpu="1536Mi"), CSI_BLOCK),
        render("in-process-local-disk", deployment("LMCacheInProcess", tp=2), CSI_FILESYSTEM),
        render("in-process-raw-block", deployment("LMCacheInProcess"), NVMEOF),
        render("in-process-no-storage", deployment("LMCacheInProcess", storage=False)),
    ]
    return cases + [case for case in examples() if case.deployment.spec.kv_cache.mode != "None"]


def lmcache_config(case: Rendered) -> dict[str, Any]:
    assert case.lmcache_yaml is not None
    return yaml.safe_load(case.lmcache_yaml)


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]
