"""The pod of one replica: `vllm`, and by mode `lmcache` and `kvtier-probe`, with their volumes.

- `vllm`: `vllm serve <model>` with the operator's flags, the KV connector for the mode, then the
  user's `args` and `env`. `enableServiceLinks` is off: Service environment variables such as
  `VLLM_PORT=tcp://...` (from any Service named `vllm`) would break vLLM's own settings.
- `lmcache` (LMCacheMP): `lmcache server`. vLLM hands it KV tensors over CUDA IPC, so it shares the
  pod's `/dev/shm` with `vllm` and sees the node's GPUs through `NVIDIA_VISIBLE_DEVICES=all` without
  claiming any (as LMCache's own operator runs it). Its HTTP port (`lmcache-api`: the quota API and
  `/metrics`) listens on all addresses so the rebalancer can set quotas and the operator scrape it;
  its ZMQ port only on localhost. The image needs `lmcache-rust-raw-block-io` for the storage tier.
- `kvtier-probe` (LMCacheMP with a storage tier on a pool that is not `Static`):
  `kvtier probe --log-dir DIR --chunk-bytes N --port P`: tails the LMCache lookup-hash log in DIR (an
  emptyDir shared with `lmcache`), keeps LRU stack distances of chunks (N bytes each) and serves the
  demand curve on `http://:P/metrics` (liveness on `/health`). vLLM then also exports its
  block-lifetime histograms (`--kv-cache-metrics`).
- Readiness gate `kvtier.io/kv-quota-applied` (LMCacheMP with a storage tier): under IsolatedLRU a
  tenant without a quota gets no L2 at all, so a replica takes traffic only once the rebalancer has
  set its quota. In-process modes have their sizes in the config file and need no gate.
- Init containers: on a Filesystem volume, LMCacheMP's raw-block device is a file pre-sized once
  (kept across restarts: the index reloads from it); in-process `local_disk` is wiped at every start.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from kvtier.api.inferencedeployment import InferenceDeployment
from kvtier.api.units import format_quantity
from kvtier.contract import (
    HEALTH_PATH,
    HTTP_PORT,
    LMCACHE_API_PORT,
    LMCACHE_CONTAINER,
    LMCACHE_HEALTH_PATH,
    METRICS_PATH,
    PROBE_CONTAINER,
    PROBE_METRICS_PORT,
    QUOTA_GATE,
    VLLM_CONTAINER,
)
from kvtier.render import lmcache
from kvtier.render.meta import config_map_name, labels
from kvtier.render.options import RenderOptions
from kvtier.render.simulate import simulate_pod_spec
from kvtier.render.sizing import GPU_RESOURCE, PROBE_CPU, PROBE_MEMORY_LIMIT, PodSizing, pod_sizing
from kvtier.render.volumes import KVVolume

SHM_VOLUME = "dshm"
LOOKUP_LOG_VOLUME = "lookup-hashes"
CONFIG_VOLUME = "lmcache-config"
#: The LMCache server may reload a large raw-block index before it answers its health check.
LMCACHE_STARTUP_SECONDS = 600
#: Empties the disk tier's directory; a filesystem's own `lost+found` stays.
_WIPE = "find {dir} -mindepth 1 -maxdepth 1 ! -name lost+found -exec rm -rf {{}} +"
#: Sizes the raw-block device file once; a file already of that size (and LMCache's index in it) is kept.
_PRESIZE = (
    "set -eu; f={file}; n={size}; "
    'if [ ! -f "$f" ] || [ "$(stat -c %s "$f")" != "$n" ]; then '
    'rm -f "$f"; fallocate -l "$n" "$f" || truncate -s "$n" "$f"; fi'
)


@dataclass(frozen=True)
class PodPlan:
    """What one replica's pod runs, decided once from the spec, the storage tier and the options."""

    deployment: InferenceDeployment
    volume: KVVolume | None
    options: RenderOptions

    @property
    def mode(self) -> str:
        return self.deployment.spec.kv_cache.mode

    @property
    def probe(self) -> bool:
        return self.mode == "LMCacheMP" and self.volume is not None and self.volume.rebalanced

    @property
    def quota_gate(self) -> bool:
        return self.mode == "LMCacheMP" and self.volume is not None

    @cached_property
    def sizing(self) -> PodSizing:
        return pod_sizing(self.deployment, self.options, probe=self.probe)

    @property
    def volume_container(self) -> str:
        """The container that does the storage tier's I/O (when there is a storage tier)."""
        return LMCACHE_CONTAINER if self.mode == "LMCacheMP" else VLLM_CONTAINER


def _http_probe(path: str, port: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _probes(path: str, port: str, startup_seconds: int) -> dict[str, Any]:
    return {
        "startupProbe": _http_probe(path, port, 10, math.ceil(startup_seconds / 10)),
        "readinessProbe": _http_probe(path, port, 10, 3),
        "livenessProbe": _http_probe(path, port, 30, 5),
    }


def _env(name: str, value: str) -> dict[str, str]:
    return {"name": name, "value": value}


def _mounts(plan: PodPlan, container: str, *mounts: dict[str, Any]) -> dict[str, Any]:
    """`volumeMounts` (and `volumeDevices`) of a container: the given mounts plus the storage volume."""
    fields: dict[str, Any] = {"volumeMounts": list(mounts)}
    if plan.volume is not None and container == plan.volume_container:
        for key, entries in plan.volume.attachment.container_fields().items():
            fields[key] = fields.get(key, []) + entries
    return {key: value for key, value in fields.items() if value}


def vllm_args(plan: PodPlan) -> list[str]:
    spec = plan.deployment.spec
    engine = spec.engine
    args = [
        spec.model.name,
        "--served-model-name", spec.served_name,
        "--tensor-parallel-size", str(engine.tensor_parallel_size),
        "--gpu-memory-utilization", str(engine.gpu_memory_utilization),
    ]  # fmt: skip
    if engine.max_model_len is not None:
        args += ["--max-model-len", str(engine.max_model_len)]
    args += ["--port", str(plan.options.vllm_port)]
    connector = lmcache.kv_transfer_config(plan.deployment, plan.options)
    if connector is not None:
        args += ["--kv-transfer-config", connector]
    if plan.probe:
        args.append("--kv-cache-metrics")
    return args + engine.args


def vllm_container(plan: PodPlan) -> dict[str, Any]:
    engine = plan.deployment.spec.engine
    sizing = plan.sizing
    env = [_env("PYTHONHASHSEED", plan.options.python_hash_seed)]
    config_mounts = []
    if plan.mode == "LMCacheInProcess":
        env.append(_env("LMCACHE_CONFIG_FILE", f"{lmcache.CONFIG_DIR}/{lmcache.CONFIG_KEY}"))
        config_mounts.append({"name": CONFIG_VOLUME, "mountPath": lmcache.CONFIG_DIR, "readOnly": True})
    gpus = str(sizing.gpus)
    return {
        "name": VLLM_CONTAINER,
        "image": engine.image,
        "command": ["vllm", "serve"],
        "args": vllm_args(plan),
        "env": env + [var.to_wire() for var in engine.env],
        "ports": [{"name": HTTP_PORT, "containerPort": plan.options.vllm_port}],
        "resources": {
            "requests": {
                **engine.resources.requests,
                "memory": format_quantity(sizing.vllm_memory),
                GPU_RESOURCE: gpus,
            },
            "limits": {
                **engine.resources.limits,
                "memory": format_quantity(sizing.vllm_memory_limit),
                GPU_RESOURCE: gpus,
            },
        },
        **_mounts(plan, VLLM_CONTAINER, {"name": SHM_VOLUME, "mountPath": "/dev/shm"}, *config_mounts),
        **_probes(HEALTH_PATH, HTTP_PORT, plan.options.startup_seconds),
    }


def lmcache_container(plan: PodPlan) -> dict[str, Any]:
    options = plan.options
    memory = format_quantity(plan.sizing.lmcache_memory)
    log_mounts = [{"name": LOOKUP_LOG_VOLUME, "mountPath": lmcache.LOOKUP_LOG_DIR}] if plan.probe else []
    return {
        "name": LMCACHE_CONTAINER,
        "image": options.lmcache_image,
        "command": ["lmcache", "server"],
        "args": lmcache.server_args(plan.deployment, plan.volume, options, lookup_log=plan.probe),
        "env": [
            _env("PYTHONHASHSEED", options.python_hash_seed),
            _env("NVIDIA_VISIBLE_DEVICES", "all"),
            _env("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
        ],
        "ports": [{"name": LMCACHE_API_PORT, "containerPort": options.lmcache_http_port}],
        "resources": {
            "requests": {"cpu": options.lmcache_cpu, "memory": memory},
            "limits": {"memory": memory},
        },
        **_mounts(plan, LMCACHE_CONTAINER, {"name": SHM_VOLUME, "mountPath": "/dev/shm"}, *log_mounts),
        **_probes(LMCACHE_HEALTH_PATH, LMCACHE_API_PORT, LMCACHE_STARTUP_SECONDS),
        # Why LMCache exits (e.g. a missing raw-block extension) reaches the pod status and the operator.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def probe_container(plan: PodPlan) -> dict[str, Any]:
    options = plan.options
    return {
        "name": PROBE_CONTAINER,
        "image": options.probe_image,
        "command": ["kvtier", "probe"],
        "args": [
            "--log-dir",
            lmcache.LOOKUP_LOG_DIR,
            "--chunk-bytes",
            str(plan.deployment.spec.chunk_bytes),
            "--port",
            str(options.probe_port),
        ],  # fmt: skip
        "ports": [{"name": PROBE_METRICS_PORT, "containerPort": options.probe_port}],
        "resources": {
            "requests": {"cpu": PROBE_CPU, "memory": format_quantity(plan.sizing.probe_memory)},
            "limits": {"memory": format_quantity(PROBE_MEMORY_LIMIT)},
        },
        "volumeMounts": [{"name": LOOKUP_LOG_VOLUME, "mountPath": lmcache.LOOKUP_LOG_DIR, "readOnly": True}],
        # No readiness probe: serving does not wait for the demand curve.
        "livenessProbe": _http_probe(HEALTH_PATH, PROBE_METRICS_PORT, 30, 5),
    }


def init_containers(plan: PodPlan) -> list[dict[str, Any]]:
    """Prepare a Filesystem volume: pre-size the MP device file, or wipe the in-process disk tier."""
    volume = plan.volume
    if volume is None or volume.attachment.volume_mode != "Filesystem":
        return []
    attachment = volume.attachment
    if plan.mode == "LMCacheMP":
        name, image = "kv-store-presize", plan.options.lmcache_image
        script = _PRESIZE.format(file=shlex.quote(attachment.device_path), size=volume.usable_bytes)
    else:
        name, image = "kv-store-wipe", plan.deployment.spec.engine.image
        script = _WIPE.format(dir=shlex.quote(attachment.path))
    return [{"name": name, "image": image, "command": ["sh", "-c", script], **attachment.container_fields()}]


def containers(plan: PodPlan) -> list[dict[str, Any]]:
    result = [vllm_container(plan)]
    if plan.mode == "LMCacheMP":
        result.append(lmcache_container(plan))
    if plan.probe:
        result.append(probe_container(plan))
    return result


def pod_volumes(plan: PodPlan) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": format_quantity(plan.sizing.shm)}}
    ]
    if plan.probe:
        volumes.append({"name": LOOKUP_LOG_VOLUME, "emptyDir": {}})
    if plan.mode == "LMCacheInProcess":
        volumes.append({"name": CONFIG_VOLUME, "configMap": {"name": config_map_name(plan.deployment)}})
    return volumes


def pod_template(plan: PodPlan) -> dict[str, Any]:
    """The StatefulSet's pod template, without the config-hash annotation (see `workload.config_hash`)."""
    engine = plan.deployment.spec.engine
    spec: dict[str, Any] = {
        "enableServiceLinks": False,
        "containers": containers(plan),
        "volumes": pod_volumes(plan),
    }
    if init := init_containers(plan):
        spec["initContainers"] = init
    if plan.quota_gate:
        spec["readinessGates"] = [{"conditionType": QUOTA_GATE}]
    if engine.node_selector:
        spec["nodeSelector"] = dict(engine.node_selector)
    if engine.tolerations:
        spec["tolerations"] = [toleration.to_wire() for toleration in engine.tolerations]
    if plan.options.runtime_class_name:
        spec["runtimeClassName"] = plan.options.runtime_class_name
    if plan.options.simulated_engine_image:
        spec = simulate_pod_spec(spec, plan.options.simulated_engine_image)
    return {
        "metadata": {
            "labels": labels(plan.deployment),
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(plan.options.vllm_port),
                "prometheus.io/path": METRICS_PATH,
            },
        },
        "spec": spec,
    }
