"""LMCache 0.5.6 as kvtier configures it: the vLLM connector, the MP server's flags, the in-process config.

Every flag and key written here is one `../shared/reference/lmcache-0.5.6-config.md` lists (the unit
tests check them against its tables), and the real package accepts (`tests/conformance`: LMCache's
own argument parser, config builders and config loader, and its MP server started from these flags).
Sizes go to LMCache as plain GiB numbers (`200`, `1.5`), never as Kubernetes quantities (`200Gi`),
which LMCache would fail to parse or misread.

LMCacheMP: an `lmcache server` beside vLLM with L1 = `cpu.size`, one L2 `raw_block` adapter on the
replica's volume (the block device, or a pre-sized file on a Filesystem volume) spanning the whole
volume, and eviction `IsolatedLRU` (always: 0.5.6 refuses `--l1-size-gb` without an eviction policy):
the live quota (`PUT /quota/_default`) is what bounds each deployment's use, so the rebalancer never
restarts anything. The server serves `/metrics` on its HTTP port (`--http-port`, beside `/quota`);
0.5.6 never opens `--prometheus-port`, so it is not rendered. The `raw_block` adapter imports
`lmcache_rust_raw_block_io`, which lmcache 0.5.6 does not depend on: the `lmcache` image must have
`lmcache-rust-raw-block-io` installed. When the pool rebalances from measured demand, the server also
writes its lookup-hash log for the probe.

LMCacheInProcess: LMCache inside vLLM, configured by a YAML file: `local_cpu` per TP rank, and either
`local_disk` on a Filesystem volume (wiped at every start: LMCache does not reload it, and leftover
files would push the volume past `max_local_disk_size`), or the `rust_raw_block` plugin on a block
device. The plugin needs one device per TP rank (`per_tp_device_paths`); a pool gives one volume per
replica, so in-process raw block works only with TP = 1 and anything else is `UnsupportedStorage`.
Sizes are the replica's quota, so a new quota takes a rolling restart.
"""

from __future__ import annotations

import json
from typing import Any

from kvtier.api.inferencedeployment import InferenceDeployment
from kvtier.api.units import gib
from kvtier.render.errors import UnsupportedStorage
from kvtier.render.options import RenderOptions
from kvtier.render.volumes import BLOCK_ALIGN, KVVolume, align_up

MP_CONNECTOR = "LMCacheMPConnector"
IN_PROCESS_CONNECTOR = "LMCacheConnectorV1"
#: Where the in-process config file is mounted, and its key in the ConfigMap.
CONFIG_DIR = "/etc/lmcache"
CONFIG_KEY = "lmcache.yaml"
#: The lookup-hash log, on an emptyDir the `lmcache` and `kvtier-probe` containers share.
LOOKUP_LOG_DIR = "/var/run/kvtier/lookup-hashes"
#: Ten-minute files, an hour kept: enough for the probe to catch up after a restart, bounded on disk.
LOOKUP_LOG_ROTATION_SECONDS = 600
LOOKUP_LOG_MAX_FILES = 6
#: LMCache's default number of parallel L2 readers; kvtier gives at least one per TP rank.
DEFAULT_LOAD_WORKERS = 4
#: The cache-key hash of in-process LMCache; its stability rests on PYTHONHASHSEED (same on every replica).
IN_PROCESS_HASH = "builtin"
RAW_BLOCK_PLUGIN = "rust_raw_block"
RAW_BLOCK_MODULE = "lmcache.v1.storage_backend.plugins.rust_raw_block_backend"
RAW_BLOCK_CLASS = "RustRawBlockBackend"
#: LMCache 0.5.6 requires an eviction policy whenever `--l1-size-gb` is given (it exits at start without
#: one); IsolatedLRU keeps one LRU per `cache_salt`, bounded by the live quota.
EVICTION_POLICY = "IsolatedLRU"
#: LMCache's raw-block slot header (the adapter's `header_bytes` default): a slot's payload is what is left.
RAW_BLOCK_HEADER_BYTES = 4096
#: Asynchronous, batched device I/O for the raw-block tiers.
IO_ENGINE = "io_uring"


def gib_text(value: int) -> str:
    """Bytes as the plain GiB number an LMCache flag takes: `200`, `1.5`, `0.25`."""
    text = repr(gib(value))
    return text.removesuffix(".0")


def _compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def kv_transfer_config(deployment: InferenceDeployment, options: RenderOptions) -> str | None:
    """vLLM's `--kv-transfer-config` for the mode, exactly as LMCache documents it (None: no connector)."""
    mode = deployment.spec.kv_cache.mode
    if mode == "LMCacheMP":
        return _compact_json(
            {
                "kv_connector": MP_CONNECTOR,
                "kv_role": "kv_both",
                "kv_connector_extra_config": {
                    "lmcache.mp.host": "tcp://localhost",
                    "lmcache.mp.port": options.lmcache_port,
                },
            }
        )
    if mode == "LMCacheInProcess":
        return _compact_json({"kv_connector": IN_PROCESS_CONNECTOR, "kv_role": "kv_both"})
    return None


def check_supported(deployment: InferenceDeployment, volume: KVVolume | None) -> None:
    """Raise `UnsupportedStorage` for a mode the pool's volumes cannot serve."""
    tp = deployment.spec.engine.tensor_parallel_size
    if (
        deployment.spec.kv_cache.mode == "LMCacheInProcess"
        and volume is not None
        and volume.attachment.volume_mode == "Block"
        and tp > 1
    ):
        raise UnsupportedStorage(
            f"LMCacheInProcess on a block device needs one device per TP rank (LMCache's per_tp_device_paths), "
            f"but KVPool {volume.pool.metadata.name} gives each replica one volume and tensorParallelSize is {tp}: "
            "use mode LMCacheMP, tensorParallelSize 1, or a pool with volumeMode Filesystem",
            field="spec.kvCache.storage.poolRef",
        )


def slot_bytes(deployment: InferenceDeployment) -> int:
    """The raw-block slot of one stored object: one TP rank's share of a chunk plus LMCache's slot header,
    rounded up to the device alignment (O_DIRECT needs aligned slots).

    The MP server stores a chunk as one object per TP rank (each rank's KV heads), and a slot holds
    `slot_bytes - header_bytes` of payload: a slot of exactly the chunk's size takes nothing
    ("payload ... does not fit slot", every L2 store fails).
    """
    ranks = deployment.spec.engine.tensor_parallel_size
    return align_up(-(-deployment.spec.chunk_bytes // ranks) + RAW_BLOCK_HEADER_BYTES, BLOCK_ALIGN)


def chunk_storage_bytes(deployment: InferenceDeployment) -> int:
    """L2 bytes one chunk takes on the raw-block device: one slot per TP rank."""
    return slot_bytes(deployment) * deployment.spec.engine.tensor_parallel_size


def load_workers(deployment: InferenceDeployment) -> int:
    return max(DEFAULT_LOAD_WORKERS, deployment.spec.engine.tensor_parallel_size)


def raw_block_adapter(deployment: InferenceDeployment, volume: KVVolume) -> dict[str, Any]:
    """The MP server's L2 adapter on the replica's volume; the quota API, not its size, bounds usage."""
    return {
        "type": "raw_block",
        "device_path": volume.attachment.device_path,
        "slot_bytes": slot_bytes(deployment),
        "capacity_bytes": volume.usable_bytes,
        "use_odirect": True,
        "io_engine": IO_ENGINE,
        "num_load_workers": load_workers(deployment),
    }


def server_args(
    deployment: InferenceDeployment, volume: KVVolume | None, options: RenderOptions, lookup_log: bool
) -> list[str]:
    """Arguments of `lmcache server` (LMCacheMP)."""
    kv_cache = deployment.spec.kv_cache
    assert kv_cache.cpu is not None, "LMCacheMP has a CPU tier"
    args = [
        "--host", "localhost",
        "--port", str(options.lmcache_port),
        "--http-host", "0.0.0.0",
        "--http-port", str(options.lmcache_http_port),
        "--chunk-size", str(kv_cache.chunk_size),
        "--l1-size-gb", gib_text(kv_cache.cpu.size),
        "--eviction-policy", EVICTION_POLICY,
    ]  # fmt: skip
    if volume is not None:
        args += ["--l2-adapter", _compact_json(raw_block_adapter(deployment, volume))]
    if lookup_log:
        args += [
            "--lookup-hash-log-dir", LOOKUP_LOG_DIR,
            "--lookup-hash-log-rotation-interval", str(LOOKUP_LOG_ROTATION_SECONDS),
            "--lookup-hash-log-max-files", str(LOOKUP_LOG_MAX_FILES),
        ]  # fmt: skip
    return args


def in_process_config(deployment: InferenceDeployment, volume: KVVolume | None) -> dict[str, Any]:
    """LMCache's config file (LMCacheInProcess); sizes are per TP rank, in GiB."""
    kv_cache = deployment.spec.kv_cache
    assert kv_cache.cpu is not None, "LMCacheInProcess has a CPU tier"
    config: dict[str, Any] = {
        "chunk_size": kv_cache.chunk_size,
        "local_cpu": True,
        "max_local_cpu_size": gib(kv_cache.cpu.size),
        "pre_caching_hash_algorithm": IN_PROCESS_HASH,
    }
    if volume is None:
        return config
    if volume.attachment.volume_mode == "Filesystem":
        ranks = deployment.spec.engine.tensor_parallel_size
        return config | {
            "local_disk": f"file://{volume.attachment.path}/",
            "max_local_disk_size": gib(volume.quota // ranks),
        }
    return config | {
        "storage_plugins": [RAW_BLOCK_PLUGIN],
        "extra_config": {
            f"storage_plugin.{RAW_BLOCK_PLUGIN}.module_path": RAW_BLOCK_MODULE,
            f"storage_plugin.{RAW_BLOCK_PLUGIN}.class_name": RAW_BLOCK_CLASS,
            f"{RAW_BLOCK_PLUGIN}.device_path": volume.attachment.device_path,
            f"{RAW_BLOCK_PLUGIN}.capacity_bytes": volume.quota,
            f"{RAW_BLOCK_PLUGIN}.use_odirect": True,
            f"{RAW_BLOCK_PLUGIN}.io_engine": IO_ENGINE,
        },
    }
