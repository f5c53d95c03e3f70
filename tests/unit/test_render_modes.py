"""Rendering every KV cache mode and pool kind: valid objects whose LMCache flags and keys are documented."""

import json
import re
import shlex

import kubernetes_validate
import pytest
import yaml

from kvtier.api import InferenceDeployment, KVPool
from kvtier.api.units import parse_quantity
from kvtier.contract import CONFIG_HASH_ANNOTATION, QUOTA_GATE
from kvtier.render import (
    InsufficientCapacity,
    RenderOptions,
    StorageBinding,
    UnsupportedStorage,
    default_binding,
    render_deployment,
)
from kvtier.render.lmcache import RAW_BLOCK_CLASS, RAW_BLOCK_MODULE
from tests.conftest import SHARED

GiB, TiB = 2**30, 2**40
KUBERNETES_VERSION = "1.33"
REFERENCE = SHARED / "reference" / "lmcache-0.5.6-config.md"
MP_CONNECTOR = (
    '{"kv_connector":"LMCacheMPConnector","kv_role":"kv_both",'
    '"kv_connector_extra_config":{"lmcache.mp.host":"tcp://localhost","lmcache.mp.port":5555}}'
)
IN_PROCESS_CONNECTOR = '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'
UID = "6f1f9c1e-3a52-4b8e-9a4f-1c2d3e4f5a6b"

NVMEOF = {
    "nvmeof": {
        "targets": [{"address": "192.0.2.10"}],
        "namespaces": [
            {"nqn": f"nqn.2024-06.com.example:kv-{i}", "uuid": f"5b0c8d4e-0f1a-4c2b-9d3e-00000000000{i}", "size": "2Ti"}
            for i in range(4)
        ],
    }
}
CSI_BLOCK = {"csi": {"storageClassName": "fast-nvme", "volumeMode": "Block"}}
CSI_FILESYSTEM = {"csi": {"storageClassName": "fast-nvme", "volumeMode": "Filesystem"}}
HOST_PATH = {"hostPath": {"path": "/var/lib/kvtier"}}


def make_pool(storage, policy="MarginalGain"):
    return KVPool.model_validate(
        {
            "apiVersion": "kvtier.io/v1alpha1",
            "kind": "KVPool",
            "metadata": {"name": "pool"},
            "spec": {"capacity": "8Ti", "storage": storage, "rebalance": {"policy": policy}},
        }
    )


def make_deployment(mode="LMCacheMP", tp=1, storage=True, replicas=2, **kv_cache):
    kv = {"mode": mode, "chunkSize": 256, **kv_cache}
    if mode != "None":
        kv.setdefault("cpu", {"size": "64Gi"})
        if storage:
            kv.setdefault("storage", {"poolRef": "pool", "request": "1Ti", "max": "2Ti"})
    return InferenceDeployment.model_validate(
        {
            "apiVersion": "kvtier.io/v1alpha1",
            "kind": "InferenceDeployment",
            "metadata": {"name": "chat", "namespace": "ml", "uid": UID},
            "spec": {
                "replicas": replicas,
                "model": {"name": "Qwen/Qwen3-8B", "kvBytesPerToken": 147456},
                "engine": {
                    "image": "vllm/vllm-openai:v0.33.0",
                    "tensorParallelSize": tp,
                    "args": ["--max-num-seqs", "64"],
                    "env": [{"name": "HF_HOME", "value": "/models"}],
                    "resources": {"requests": {"cpu": "8", "memory": "48Gi"}},
                },
                "kvCache": kv,
            },
        }
    )


#: name -> (deployment keyword arguments, pool storage or None, pool rebalance policy)
CASES = {
    "mp-nvmeof": ({"tp": 2}, NVMEOF, "MarginalGain"),
    "mp-csi-block": ({"tp": 4}, CSI_BLOCK, "Proportional"),
    "mp-csi-filesystem": ({}, CSI_FILESYSTEM, "MarginalGain"),
    "mp-hostpath-static": ({}, HOST_PATH, "Static"),
    "mp-no-storage": ({"storage": False}, None, None),
    "in-process-local-disk": ({"mode": "LMCacheInProcess", "tp": 2}, CSI_FILESYSTEM, "MarginalGain"),
    "in-process-hostpath": ({"mode": "LMCacheInProcess"}, HOST_PATH, "Static"),
    "in-process-raw-block": ({"mode": "LMCacheInProcess"}, NVMEOF, "MarginalGain"),
    "in-process-no-storage": ({"mode": "LMCacheInProcess", "storage": False}, None, None),
    "none": ({"mode": "None"}, None, None),
}


def render_case(name, options=RenderOptions(pod_monitor=True)):
    kwargs, storage, policy = CASES[name]
    deployment = make_deployment(**kwargs)
    pool = make_pool(storage, policy) if storage else None
    return deployment, pool, render_deployment(deployment, pool, options)


def by_kind(objects, kind):
    return [obj for obj in objects if obj["kind"] == kind]


def statefulset(objects):
    (sts,) = by_kind(objects, "StatefulSet")
    return sts


def container(objects, name):
    containers = statefulset(objects)["spec"]["template"]["spec"]["containers"]
    matches = [c for c in containers if c["name"] == name]
    return matches[0] if matches else None


def flag(args, name):
    return args[args.index(name) + 1]


def lmcache_config(objects):
    (config_map,) = by_kind(objects, "ConfigMap")
    return yaml.safe_load(config_map["data"]["lmcache.yaml"])


MP_CASES = [name for name in CASES if name.startswith("mp-")]
IN_PROCESS_CASES = [name for name in CASES if name.startswith("in-process-")]


# --- the reference: LMCache 0.5.6's documented keys, flags and fields ---------------------------------------


class Reference:
    def __init__(self, text):
        self.text = text
        self.lines = text.splitlines()

    def _line(self, marker):
        return next(line for line in self.lines if marker in line)

    @staticmethod
    def _names(text):
        return set(re.findall(r"`([^`]+)`", re.sub(r"\([^)]*\)", "", text)))

    @property
    def config_keys(self):
        """The key table (`| `key` | `type` | `default` |`)."""
        return set(re.findall(r"^\| `([a-z0-9_]+)` \| `", self.text, re.M))

    @property
    def server_flags(self):
        return set(re.findall(r"--[a-z0-9-]+", self._line("`lmcache server` flags")))

    @property
    def raw_block_adapter_fields(self):
        return self._names(self._line("adapter JSON fields:").split("fields:", 1)[1])

    @property
    def raw_block_plugin_keys(self):
        line = self._line("Raw block devices")
        head, options = line.split("prefix:", 1)
        plugin = {name for name in self._names(head) if name.startswith("storage_plugin.")}
        return plugin | {f"rust_raw_block.{name}" for name in self._names(options)}

    @property
    def connector_configs(self):
        return set(re.findall(r"--kv-transfer-config '(\{.*?\})'", self.text))


@pytest.fixture(scope="module")
def reference():
    if not REFERENCE.exists():
        pytest.skip(f"{REFERENCE} is absent: LMCache's documented keys cannot be checked")
    return Reference(REFERENCE.read_text())


def test_the_reference_parses(reference):
    assert {"chunk_size", "max_local_cpu_size", "local_disk", "extra_config"} <= reference.config_keys
    assert {"--l1-size-gb", "--l2-adapter", "--eviction-policy", "--lookup-hash-log-dir"} <= reference.server_flags
    assert {"device_path", "slot_bytes", "num_load_workers"} <= reference.raw_block_adapter_fields
    assert "rust_raw_block.per_tp_device_paths" in reference.raw_block_plugin_keys
    assert "storage_plugin.rust_raw_block.module_path" in reference.raw_block_plugin_keys
    assert MP_CONNECTOR in reference.connector_configs


# --- every mode ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CASES)
def test_every_object_passes_kubernetes_validate(name):
    _, _, objects = render_case(name)
    for obj in objects:
        if obj["kind"] == "PodMonitor":  # a CRD kind: its schema is not in kubernetes-validate
            continue
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("name", CASES)
def test_objects_come_in_apply_order(name):
    deployment, pool, objects = render_case(name)
    kinds = [obj["kind"] for obj in objects]
    expected = ["ConfigMap"] if deployment.spec.kv_cache.mode == "LMCacheInProcess" else []
    expected += ["Service", "Service", "StatefulSet", "PodDisruptionBudget", "PodMonitor"]
    static = pool is not None and pool.spec.storage.backend in ("nvmeof", "hostPath")
    expected += ["PersistentVolume"] * (deployment.spec.replicas if static else 0)
    assert kinds == expected


@pytest.mark.parametrize("name", CASES)
def test_connector_is_exactly_the_documented_json(name, reference):
    deployment, _, objects = render_case(name)
    args = container(objects, "vllm")["args"]
    mode = deployment.spec.kv_cache.mode
    if mode == "None":
        assert "--kv-transfer-config" not in args
        return
    connector = flag(args, "--kv-transfer-config")
    assert connector == {"LMCacheMP": MP_CONNECTOR, "LMCacheInProcess": IN_PROCESS_CONNECTOR}[mode]
    assert connector in reference.connector_configs


@pytest.mark.parametrize("name", MP_CASES)
def test_lmcache_server_flags_are_documented(name, reference):
    _, _, objects = render_case(name)
    lmcache = container(objects, "lmcache")
    assert lmcache["command"] == ["lmcache", "server"]
    flags = {arg for arg in lmcache["args"] if arg.startswith("--")}
    assert flags <= reference.server_flags
    vllm_port = json.loads(flag(container(objects, "vllm")["args"], "--kv-transfer-config"))
    assert flag(lmcache["args"], "--port") == str(vllm_port["kv_connector_extra_config"]["lmcache.mp.port"])
    if "--l2-adapter" in lmcache["args"]:
        adapter = json.loads(flag(lmcache["args"], "--l2-adapter"))
        # `type` selects the adapter (LMCache's adapter registry); every other field is a documented raw_block one.
        assert adapter.pop("type") == "raw_block"
        assert set(adapter) <= reference.raw_block_adapter_fields


@pytest.mark.parametrize("name", IN_PROCESS_CASES)
def test_in_process_config_keys_are_documented(name, reference):
    _, _, objects = render_case(name)
    config = lmcache_config(objects)
    assert set(config) <= reference.config_keys
    assert set(config.get("extra_config", {})) <= reference.raw_block_plugin_keys
    if "extra_config" in config:
        assert RAW_BLOCK_MODULE in reference.text and RAW_BLOCK_CLASS in reference.text
        assert '`storage_plugins: ["rust_raw_block"]`' in reference.text


@pytest.mark.parametrize("name", MP_CASES + IN_PROCESS_CASES)
def test_sizes_reach_lmcache_as_plain_gib_numbers(name):
    deployment, _, objects = render_case(name)
    cpu_gib = deployment.spec.kv_cache.cpu.size / GiB
    vllm = container(objects, "vllm")
    assert all(var.get("value") != "True" for var in vllm["env"])
    if deployment.spec.kv_cache.mode == "LMCacheMP":
        args = container(objects, "lmcache")["args"]
        assert not [arg for arg in args if re.search(r"\d+(Gi|Ti|Mi|G|T|M)\b", arg)]
        assert float(flag(args, "--l1-size-gb")) == cpu_gib
    else:
        config = lmcache_config(objects)
        assert isinstance(config["max_local_cpu_size"], float) and config["max_local_cpu_size"] == cpu_gib
        assert isinstance(config.get("max_local_disk_size", 0.0), float)
        assert "local_disk" not in config or re.fullmatch(r"file:///.+/", config["local_disk"])
        lmcache_env = {var["name"] for var in vllm["env"] if var["name"].startswith("LMCACHE_")}
        assert lmcache_env == {"LMCACHE_CONFIG_FILE"}


def test_mode_none_runs_vllm_alone():
    _, _, objects = render_case("none")
    pod = statefulset(objects)["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["vllm"]
    assert "readinessGates" not in pod and "volumeClaimTemplates" not in statefulset(objects)["spec"]
    assert not by_kind(objects, "ConfigMap")
    assert not {"--kv-transfer-config", "--kv-cache-metrics"} & set(container(objects, "vllm")["args"])


def test_vllm_command_line():
    deployment, _, objects = render_case("mp-nvmeof")
    vllm = container(objects, "vllm")
    assert vllm["command"] == ["vllm", "serve"]
    args = vllm["args"]
    assert args[0] == "Qwen/Qwen3-8B"
    assert flag(args, "--served-model-name") == "Qwen/Qwen3-8B"
    assert flag(args, "--tensor-parallel-size") == "2"
    assert flag(args, "--gpu-memory-utilization") == "0.9"
    assert flag(args, "--port") == "8000"
    assert "--max-model-len" not in args
    assert args[-2:] == ["--max-num-seqs", "64"], "the user's args come last"
    assert vllm["env"][0] == {"name": "PYTHONHASHSEED", "value": "0"}
    assert vllm["env"][-1] == {"name": "HF_HOME", "value": "/models"}


def test_the_same_hash_seed_on_every_container_that_hashes():
    _, _, objects = render_case("mp-csi-block")
    env = container(objects, "vllm")["env"] + container(objects, "lmcache")["env"]
    seeds = [var["value"] for var in env if var["name"] == "PYTHONHASHSEED"]
    assert seeds == ["0", "0"]
    config = lmcache_config(render_case("in-process-no-storage")[2])
    assert config["pre_caching_hash_algorithm"] == "builtin"


# --- storage ------------------------------------------------------------------------------------------------


def test_mp_block_volume_is_the_raw_block_device():
    deployment, _, objects = render_case("mp-csi-block")
    lmcache = container(objects, "lmcache")
    adapter = json.loads(flag(lmcache["args"], "--l2-adapter"))
    assert lmcache["volumeDevices"] == [{"name": "kv-store", "devicePath": adapter["device_path"]}]
    assert adapter["capacity_bytes"] == 2 * TiB
    assert adapter["slot_bytes"] % 4096 == 0
    # One object per TP rank (4) per chunk, plus LMCache's 4 KiB slot header (tests/conformance stores into it)
    per_rank = deployment.spec.chunk_bytes // 4
    assert per_rank + 4096 <= adapter["slot_bytes"] < per_rank + 2 * 4096
    assert adapter["use_odirect"] is True and adapter["io_engine"] == "io_uring"
    assert adapter["num_load_workers"] == 4  # LMCache's default, and at least one per rank (TP 4)
    assert flag(lmcache["args"], "--eviction-policy") == "IsolatedLRU"
    (claim,) = statefulset(objects)["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["volumeMode"] == "Block" and claim["spec"]["storageClassName"] == "fast-nvme"
    assert "volumeDevices" not in container(objects, "vllm")


def test_slot_bytes_hold_a_chunk_and_the_slot_header_rounded_up_to_the_block_size():
    deployment = make_deployment(tp=1, chunkSize=16)  # 16 x 147456 = 2359296 = 576 x 4096, + the 4096 header
    objects = render_deployment(deployment, make_pool(CSI_BLOCK))
    assert json.loads(flag(container(objects, "lmcache")["args"], "--l2-adapter"))["slot_bytes"] == 2359296 + 4096
    body = deployment.to_wire()
    body["spec"]["model"] = {"name": "m", "kvBytesPerToken": 1000}  # 16 x 1000 + 4096 = 20096 -> 20480
    odd = InferenceDeployment.model_validate(body)
    objects = render_deployment(odd, make_pool(CSI_BLOCK))
    assert json.loads(flag(container(objects, "lmcache")["args"], "--l2-adapter"))["slot_bytes"] == 20480


def test_mp_filesystem_volume_holds_a_presized_device_file():
    _, _, objects = render_case("mp-csi-filesystem")
    adapter = json.loads(flag(container(objects, "lmcache")["args"], "--l2-adapter"))
    (init,) = statefulset(objects)["spec"]["template"]["spec"]["initContainers"]
    script = init["command"][-1]
    assert init["name"] == "kv-store-presize"
    assert shlex.quote(adapter["device_path"]) in script and f"n={adapter['capacity_bytes']};" in script
    assert "fallocate" in script and "rm -f" in script
    # the volume is sized up by the filesystem's reserve, so the file holds max (2Ti), block-aligned
    (template,) = statefulset(objects)["spec"]["volumeClaimTemplates"]
    volume = parse_quantity(template["spec"]["resources"]["requests"]["storage"])
    assert 2 * TiB <= adapter["capacity_bytes"] < volume and adapter["capacity_bytes"] % 4096 == 0
    mount = container(objects, "lmcache")["volumeMounts"][-1]
    assert mount["name"] == "kv-store" and adapter["device_path"].startswith(mount["mountPath"] + "/")
    assert init["volumeMounts"] == [mount]


def test_in_process_local_disk_is_wiped_and_sized_per_rank():
    deployment, _, objects = render_case("in-process-local-disk")
    config = lmcache_config(objects)
    mount = next(m for m in container(objects, "vllm")["volumeMounts"] if m["name"] == "kv-store")
    assert config["local_disk"] == f"file://{mount['mountPath']}/"
    # quota = request (1Ti), split over TP 2 ranks (LMCache shards the directory by GPU)
    assert config["max_local_disk_size"] == 1024 / 2
    (init,) = statefulset(objects)["spec"]["template"]["spec"]["initContainers"]
    assert init["name"] == "kv-store-wipe" and mount["mountPath"] in init["command"][-1]
    assert init["image"] == deployment.spec.engine.image
    assert "lmcache" not in {c["name"] for c in statefulset(objects)["spec"]["template"]["spec"]["containers"]}


def test_in_process_disk_tier_follows_the_ledger_quota():
    deployment = make_deployment(mode="LMCacheInProcess", tp=2)
    pool = make_pool(CSI_FILESYSTEM)
    objects = render_deployment(deployment, pool, binding=StorageBinding(quota=512 * GiB))
    assert lmcache_config(objects)["max_local_disk_size"] == 256.0
    # never more than the volume holds: max (2Ti) is usable, as the volume is sized up by the reserve
    objects = render_deployment(deployment, pool, binding=StorageBinding(quota=100 * TiB))
    assert 1024 <= lmcache_config(objects)["max_local_disk_size"] < 1024 * 1.001


def test_in_process_raw_block_with_one_rank():
    _, _, objects = render_case("in-process-raw-block")
    config = lmcache_config(objects)
    device = container(objects, "vllm")["volumeDevices"][0]["devicePath"]
    assert config["storage_plugins"] == ["rust_raw_block"]
    assert config["extra_config"]["rust_raw_block.device_path"] == device
    assert config["extra_config"]["rust_raw_block.capacity_bytes"] == TiB
    assert "rust_raw_block.per_tp_device_paths" not in config["extra_config"]


def test_in_process_raw_block_with_many_ranks_is_refused_clearly():
    deployment = make_deployment(mode="LMCacheInProcess", tp=2)
    with pytest.raises(UnsupportedStorage) as caught:
        render_deployment(deployment, make_pool(NVMEOF))
    assert caught.value.reason == "UnsupportedStorage"
    assert caught.value.field == "spec.kvCache.storage.poolRef"
    assert "per_tp_device_paths" in str(caught.value) and "tensorParallelSize is 2" in str(caught.value)


def test_static_nvmeof_pool_binds_one_namespace_per_replica():
    deployment, pool, objects = render_case("mp-nvmeof")
    volumes = by_kind(objects, "PersistentVolume")
    claims = [pv["spec"]["claimRef"] for pv in volumes]
    assert [(c["namespace"], c["name"]) for c in claims] == [("ml", "kv-store-chat-0"), ("ml", "kv-store-chat-1")]
    handles = [pv["spec"]["csi"]["volumeHandle"] for pv in volumes]
    assert handles == [ns.uuid for ns in pool.spec.storage.nvmeof.namespaces[:2]]
    binding = default_binding(deployment, pool, taken={handles[0], handles[1]})
    assert [ns.uuid for ns in binding.namespaces] == [ns.uuid for ns in pool.spec.storage.nvmeof.namespaces[2:]]
    with pytest.raises(InsufficientCapacity):
        default_binding(make_deployment(replicas=5), pool)


def test_dynamic_csi_pool_needs_no_persistent_volumes():
    _, _, objects = render_case("mp-csi-block")
    assert not by_kind(objects, "PersistentVolume")


def test_claims_outlive_pods_and_scale_down_releases_them():
    _, _, objects = render_case("mp-nvmeof")
    policy = statefulset(objects)["spec"]["persistentVolumeClaimRetentionPolicy"]
    assert policy == {"whenDeleted": "Retain", "whenScaled": "Delete"}


# --- probe, gate, monitoring --------------------------------------------------------------------------------


def test_probe_runs_where_the_pool_rebalances_from_measured_demand():
    for name in ("mp-nvmeof", "mp-csi-block", "mp-csi-filesystem"):
        deployment, _, objects = render_case(name)
        probe = container(objects, "kvtier-probe")
        assert probe["command"] == ["kvtier", "probe"]
        log_dir = flag(container(objects, "lmcache")["args"], "--lookup-hash-log-dir")
        assert flag(probe["args"], "--log-dir") == log_dir
        assert flag(probe["args"], "--chunk-bytes") == str(deployment.spec.chunk_bytes)
        assert flag(probe["args"], "--port") == "9400" and "readinessProbe" not in probe
        assert "--kv-cache-metrics" in container(objects, "vllm")["args"]
        shared = [m["name"] for m in container(objects, "lmcache")["volumeMounts"] if m["mountPath"] == log_dir]
        assert shared == [probe["volumeMounts"][0]["name"]]
    for name in ("mp-hostpath-static", "mp-no-storage", "in-process-local-disk"):
        _, _, objects = render_case(name)
        assert container(objects, "kvtier-probe") is None
        assert "--kv-cache-metrics" not in container(objects, "vllm")["args"]
        lmcache = container(objects, "lmcache")
        assert lmcache is None or "--lookup-hash-log-dir" not in lmcache["args"]


def test_quota_gate_only_where_a_live_quota_is_set():
    pods = {name: statefulset(render_case(name)[2])["spec"]["template"]["spec"] for name in CASES}
    gated = {name for name, pod in pods.items() if "readinessGates" in pod}
    assert gated == {"mp-nvmeof", "mp-csi-block", "mp-csi-filesystem", "mp-hostpath-static"}
    (gate,) = statefulset(render_case("mp-nvmeof")[2])["spec"]["template"]["spec"]["readinessGates"]
    assert gate == {"conditionType": QUOTA_GATE}


def test_mp_without_storage_has_no_l2_and_no_volume():
    _, _, objects = render_case("mp-no-storage")
    lmcache = container(objects, "lmcache")
    assert "--l2-adapter" not in lmcache["args"]
    # LMCache 0.5.6 exits at start when --l1-size-gb comes without an eviction policy (tests/conformance)
    assert flag(lmcache["args"], "--eviction-policy") == "IsolatedLRU"
    assert "volumeDevices" not in lmcache
    assert "volumeClaimTemplates" not in statefulset(objects)["spec"]


def test_pod_monitor_only_when_asked_and_scraping_named_ports():
    _, _, objects = render_case("mp-nvmeof")
    (monitor,) = by_kind(objects, "PodMonitor")
    pod = statefulset(objects)["spec"]["template"]
    ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    endpoints = {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]}
    assert (
        endpoints == {"http", "lmcache-api", "probe-metrics"} and endpoints <= ports
    )  # LMCache: /metrics on its API port
    assert "--prometheus-port" not in container(objects, "lmcache")["args"]  # 0.5.6 never opens it
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "8000"
    assert not by_kind(render_case("mp-nvmeof", RenderOptions())[2], "PodMonitor")


def test_services_select_the_pods():
    _, _, objects = render_case("mp-nvmeof")
    headless, api = by_kind(objects, "Service")
    sts = statefulset(objects)
    assert sts["spec"]["serviceName"] == headless["metadata"]["name"] == "chat-headless"
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert api["metadata"]["name"] == "chat" and api["spec"]["type"] == "ClusterIP"
    assert api["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    for selector in (headless["spec"]["selector"], api["spec"]["selector"], sts["spec"]["selector"]["matchLabels"]):
        assert selector.items() <= pod_labels.items()
    (pdb,) = by_kind(objects, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1


# --- resources ----------------------------------------------------------------------------------------------


def test_mp_memory_shm_and_gpus():
    _, _, objects = render_case("mp-nvmeof")  # TP 2, engine 48Gi, L1 64Gi
    vllm, lmcache = container(objects, "vllm"), container(objects, "lmcache")
    assert vllm["resources"]["requests"] == {"cpu": "8", "memory": "52Gi", "nvidia.com/gpu": "2"}
    assert vllm["resources"]["limits"] == {"memory": "52Gi", "nvidia.com/gpu": "2"}
    assert lmcache["resources"]["requests"]["memory"] == lmcache["resources"]["limits"]["memory"] == "68Gi"
    assert "nvidia.com/gpu" not in lmcache["resources"]["requests"]
    volumes = statefulset(objects)["spec"]["template"]["spec"]["volumes"]
    shm = next(v for v in volumes if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "4Gi"}  # 2Gi per TP rank
    for c in (vllm, lmcache):  # CUDA IPC between the two goes through the shared /dev/shm
        assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]


def test_in_process_memory_covers_the_cpu_tier_of_every_rank():
    _, _, objects = render_case("in-process-local-disk")  # TP 2: 48Gi + 2 x 64Gi + 2 x 2Gi
    vllm = container(objects, "vllm")
    assert vllm["resources"]["requests"]["memory"] == "180Gi"
    assert vllm["resources"]["requests"]["nvidia.com/gpu"] == "2"


def test_user_memory_limit_grows_by_what_kvtier_adds():
    body = make_deployment(tp=8, storage=False).to_wire()
    body["spec"]["engine"]["resources"] = {"requests": {"memory": "100Gi"}, "limits": {"memory": "120Gi", "cpu": "64"}}
    objects = render_deployment(InferenceDeployment.model_validate(body))
    resources = container(objects, "vllm")["resources"]
    assert resources["requests"]["memory"] == "116Gi" and resources["limits"]["memory"] == "136Gi"
    assert resources["limits"]["cpu"] == "64" and resources["limits"]["nvidia.com/gpu"] == "8"
    body["spec"]["engine"]["resources"]["limits"]["memory"] = "50Gi"  # below the request: the request wins
    objects = render_deployment(InferenceDeployment.model_validate(body))
    assert container(objects, "vllm")["resources"]["limits"]["memory"] == "116Gi"


def test_default_engine_memory_comes_from_the_options():
    body = make_deployment(mode="None").to_wire()
    body["spec"]["engine"]["resources"] = {}
    options = RenderOptions(default_engine_memory=10 * GiB)
    objects = render_deployment(InferenceDeployment.model_validate(body), options=options)
    assert container(objects, "vllm")["resources"]["requests"]["memory"] == "12Gi"


# --- identity: names, labels, owners, the config hash ------------------------------------------------------


@pytest.mark.parametrize("name", ["mp-nvmeof", "in-process-hostpath"])
def test_owner_references_and_labels(name):
    _, _, objects = render_case(name)
    expected_labels = {
        "app.kubernetes.io/name": "kvtier-engine",
        "app.kubernetes.io/instance": "chat",
        "app.kubernetes.io/managed-by": "kvtier",
        "app.kubernetes.io/part-of": "kvtier",
        "kvtier.io/deployment": "chat",
    }
    for obj in objects:
        metadata = obj["metadata"]
        assert expected_labels.items() <= metadata["labels"].items()
        if obj["kind"] == "PersistentVolume":
            assert "ownerReferences" not in metadata and "namespace" not in metadata
            assert metadata["labels"]["kvtier.io/deployment-namespace"] == "ml"
            continue
        assert metadata["namespace"] == "ml"
        assert metadata["ownerReferences"] == [
            {
                "apiVersion": "kvtier.io/v1alpha1",
                "kind": "InferenceDeployment",
                "name": "chat",
                "uid": UID,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]


def test_objects_read_from_files_carry_no_owner_reference():
    body = make_deployment().to_wire()
    del body["metadata"]["uid"]
    objects = render_deployment(InferenceDeployment.model_validate(body), make_pool(CSI_BLOCK))
    assert not [obj for obj in objects if "ownerReferences" in obj["metadata"]]


def _hash(deployment, pool=None, binding=None):
    template = statefulset(render_deployment(deployment, pool, binding=binding))["spec"]["template"]
    return template["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]


def _edited(deployment, edit):
    body = deployment.to_wire()
    edit(body["spec"])
    return InferenceDeployment.model_validate(body)


def test_config_hash_changes_with_the_spec_and_only_then():
    pool = make_pool(CSI_FILESYSTEM)
    base = make_deployment(mode="LMCacheInProcess")
    reference_hash = _hash(base, pool)
    assert _hash(make_deployment(mode="LMCacheInProcess"), pool) == reference_hash
    assert _hash(_edited(base, lambda s: s.update(replicas=7)), pool) == reference_hash
    edits = [
        lambda s: s["kvCache"]["cpu"].update(size="65Gi"),  # only in the ConfigMap
        lambda s: s["kvCache"].update(chunkSize=512),
        lambda s: s["engine"].update(image="vllm/vllm-openai:v0.34.0"),
        lambda s: s["engine"]["args"].append("--enforce-eager"),
    ]
    selector = statefulset(render_deployment(base, pool))["spec"]["selector"]
    for edit in edits:
        edited = _edited(base, edit)
        assert _hash(edited, pool) != reference_hash
        assert statefulset(render_deployment(edited, pool))["spec"]["selector"] == selector
    assert _hash(base, pool, StorageBinding(quota=512 * GiB)) != reference_hash  # new disk size: a rolling restart


def test_mp_quota_moves_do_not_roll_pods():
    pool = make_pool(CSI_BLOCK)
    base = make_deployment()
    assert _hash(base, pool, StorageBinding(quota=512 * GiB)) == _hash(base, pool, StorageBinding(quota=TiB))
