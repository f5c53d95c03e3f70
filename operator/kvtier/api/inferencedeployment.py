"""InferenceDeployment: vLLM + LMCache replicas whose KV cache is tiered into CPU memory and a KVPool."""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, ConfigDict, Field, WithJsonSchema, model_validator

from kvtier.api.common import (
    API_VERSION,
    DNS_SUBDOMAIN_PATTERN,
    Condition,
    KubeModel,
    ObjectMeta,
    Timestamp,
)
from kvtier.api.errors import FieldProblem
from kvtier.api.rules import Rule, cel_literal, cel_rules
from kvtier.api.units import MAX_QUANTITY_LENGTH, RESOURCE_QUANTITY_PATTERN, Duration, Quantity, quantity_value

#: StatefulSet pods carry a `controller-revision-hash` label of `<name>-<10 chars>`, at most 63 characters.
MAX_NAME_LENGTH = 52

#: Bytes per element of the KV cache for each dtype vLLM stores KV in.
KV_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}

KVCacheMode = Literal["LMCacheMP", "LMCacheInProcess", "None"]


def _owned_flags_pattern(long_flags: tuple[str, ...], short_flags: tuple[str, ...] = ()) -> str:
    """A regex matching any spelling vLLM's parser accepts (`--a-b`, `--a_b`, `--a-b=x`, `--a-b x`)."""
    names = [f"--{flag.replace('-', '[-_]')}" for flag in long_flags] + [f"-{flag}" for flag in short_flags]
    return rf"^({'|'.join(names)})([= ].*)?$"


#: vLLM flags the operator renders in every mode.
ALWAYS_OWNED_FLAGS = _owned_flags_pattern(
    (
        "port",
        "host",
        "model",
        "served-model-name",
        "tensor-parallel-size",
        "gpu-memory-utilization",
        "device-memory-utilization",  # vLLM 0.33's alias of --gpu-memory-utilization
        "max-model-len",
    ),
    ("tp",),
)
#: vLLM flags the operator renders when a KV connector is in use (mode other than None).
KV_OWNED_FLAGS = _owned_flags_pattern(("kv-transfer-config", "kv-offloading-size", "kv-offloading-backend"))
#: Environment the operator owns: the hash seed (cache keys must match across replicas and restarts).
OWNED_ENV = "PYTHONHASHSEED"
#: In-process mode renders LMCache's config file; LMCACHE_* variables would silently override it.
IN_PROCESS_OWNED_ENV_PREFIX = "LMCACHE_"

_NEGATIVE_RESOURCE = "must be a non-negative quantity such as 16, 500m or 64Gi"


def _check_resource_quantity(value: int | str) -> int | str:
    if isinstance(value, int) and value < 0:
        raise ValueError(_NEGATIVE_RESOURCE)
    if isinstance(value, str) and len(value) > MAX_QUANTITY_LENGTH:
        raise ValueError(f"may not be more than {MAX_QUANTITY_LENGTH} bytes")
    if isinstance(value, str) and not re.match(RESOURCE_QUANTITY_PATTERN, value):
        raise ValueError(f"{value!r} is not a non-negative Kubernetes quantity such as 16, 500m or 64Gi")
    if isinstance(value, str):
        quantity_value(value)  # in range (an exponent such as 1e99999999999 is not)
    return value


#: A non-negative Kubernetes resource quantity (`500m` CPU, `64Gi` memory), kept as written. The pattern
#: checks strings; the CEL rule checks integers too (a pattern does not apply to them).
ResourceQuantity = Annotated[
    int | str,
    AfterValidator(_check_resource_quantity),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "pattern": RESOURCE_QUANTITY_PATTERN,
            "maxLength": MAX_QUANTITY_LENGTH,
            **cel_rules(
                Rule(
                    f"string(self).matches({cel_literal(RESOURCE_QUANTITY_PATTERN)}) && isQuantity(string(self))",
                    _NEGATIVE_RESOURCE,
                )
            ),
        }
    ),
]
#: Most resource names in `engine.resources.requests` / `limits` (bounds the CEL rules' cost).
MAX_RESOURCE_NAMES = 32


class Architecture(KubeModel):
    """Enough of the model's shape to size its KV cache (for MLA models give kvBytesPerToken instead)."""

    layers: int = Field(ge=1, le=4096)
    """Transformer layers that keep a KV cache (`num_hidden_layers` in the model's config.json)."""
    kv_heads: int = Field(ge=1, le=4096)
    """Key/value heads (`num_key_value_heads`; fewer than attention heads under grouped-query attention)."""
    head_dim: int = Field(ge=1, le=16384)
    """Elements per attention head (`head_dim`, else hidden_size / num_attention_heads)."""
    dtype: Literal["float16", "bfloat16", "float32", "fp8", "fp8_e4m3", "fp8_e5m2"] = "bfloat16"
    """Element type of the KV cache (default bfloat16). Bytes per token = 2 x layers x kvHeads x headDim x
    the element's size (2 for 16-bit, 1 for fp8, 4 for float32)."""

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * KV_DTYPE_BYTES[self.dtype]


class ModelSpec(KubeModel):
    """The model the replicas serve, and how many bytes of KV cache one of its tokens takes."""

    name: str = Field(min_length=1, max_length=1024)
    """Model to serve: a Hugging Face id or a path inside the image or a mounted volume."""
    served_name: str | None = Field(default=None, min_length=1, max_length=253)
    """Name clients use in requests (default: `name`)."""
    kv_bytes_per_token: int | None = Field(default=None, ge=1, le=2**32)
    """KV cache bytes per token over all layers, keys and values (set this or `architecture`; use it for
    MLA and other models whose shape `architecture` cannot describe). Sizes every tier's capacity in tokens."""
    architecture: Architecture | None = None
    """The model's shape, from which kvtier computes the KV bytes per token (set this or `kvBytesPerToken`)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            Rule(
                "has(self.kvBytesPerToken) != has(self.architecture)",
                "set exactly one of kvBytesPerToken or architecture",
            ),
        )
    )

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if (self.kv_bytes_per_token is None) == (self.architecture is None):
            raise ValueError("set exactly one of kvBytesPerToken or architecture")
        return self

    @property
    def bytes_per_token(self) -> int:
        """KV cache bytes one token occupies, over all layers and TP ranks."""
        if self.kv_bytes_per_token is not None:
            return self.kv_bytes_per_token
        assert self.architecture is not None
        return self.architecture.kv_bytes_per_token


class EnvVar(KubeModel):
    """An environment variable of the vLLM container, as in a Pod's `env`."""

    name: str = Field(min_length=1, max_length=1024, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    """Variable name (not PYTHONHASHSEED; not LMCACHE_* in LMCacheInProcess mode)."""
    value: str | None = None
    """Value as written (default empty); `$(VAR)` references to earlier variables are expanded."""
    value_from: dict[str, Any] | None = Field(
        default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    """A Kubernetes EnvVarSource, passed through to the container as written."""


class ResourceRequirements(KubeModel):
    """Compute resources of the vLLM container, as in a Pod's `resources`."""

    requests: dict[str, ResourceQuantity] = Field(default_factory=dict, max_length=MAX_RESOURCE_NAMES)
    """What the engine needs, as quantities (`cpu: 8`, `memory: 64Gi`; never negative); kvtier adds `/dev/shm`
    and an in-process CPU tier to memory, and sets `nvidia.com/gpu` to tensorParallelSize."""
    limits: dict[str, ResourceQuantity] = Field(default_factory=dict, max_length=MAX_RESOURCE_NAMES)
    """Most the engine may use, as quantities (never negative); kvtier adds the same memory as to requests."""


class Toleration(KubeModel):
    """A taint the replicas tolerate, as in a Pod's `tolerations`."""

    key: str | None = None
    """Taint key to match (e.g. `nvidia.com/gpu`); empty with operator Exists matches every taint."""
    operator: Literal["Exists", "Equal"] | None = None
    """`Equal` (the default) matches key and value; `Exists` matches any value of the key."""
    value: str | None = None
    """Taint value to match with operator Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; empty matches every effect."""
    toleration_seconds: int | None = None
    """With effect NoExecute: seconds a replica stays on a node after the taint appears (default: forever)."""


#: Longest single `engine.args` entry (bounds the cost of the CEL rules that scan args).
MAX_ARG_LENGTH = 4096
#: Most replicas one InferenceDeployment may ask for (the CRD's maximum). Below it, replicas the cluster's
#: nodes cannot hold at all are refused with a `DoesNotFit` condition before any pod is created.
MAX_REPLICAS = 1024


class EngineSpec(KubeModel):
    """The vLLM container of every replica: image, parallelism, memory, extra arguments, placement."""

    image: str = Field(min_length=1, max_length=1024)
    """vLLM image, e.g. `vllm/vllm-openai:v0.33.0`."""
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    """GPUs per replica (`--tensor-parallel-size`, default 1); every rank of a replica runs on one node."""
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """Fraction of each GPU's memory vLLM may use for weights, activations and the HBM KV cache (default 0.9);
    what is left after weights and activations is the HBM tier."""
    max_model_len: int | None = Field(default=None, ge=1, le=2**24)
    """Longest request (prompt plus output) in tokens (`--max-model-len`); default: the model's context length."""
    args: list[Annotated[str, Field(max_length=MAX_ARG_LENGTH)]] = Field(default_factory=list, max_length=64)
    """Extra `vllm serve` arguments, appended after the operator's own (which they must not repeat). Bounded
    (64 of at most 4096 characters) so the CEL rules over them fit a real API server's cost budget."""
    env: list[EnvVar] = Field(default_factory=list, max_length=256)
    """Extra environment variables of the vLLM container (at most 256)."""
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    """Engine CPU and memory; the operator adds the CPU tier, `/dev/shm` and `nvidia.com/gpu`."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Labels a node must carry to run a replica (e.g. a GPU product label); copied to the pods."""
    tolerations: list[Toleration] = Field(default_factory=list)
    """Taints the replicas tolerate (e.g. the GPU nodes' `nvidia.com/gpu:NoSchedule`); copied to the pods."""


class CPUTier(KubeModel):
    """LMCache's CPU tier (L1) per replica."""

    size: Quantity
    """Host memory for KV chunks per replica, a quantity such as 64Gi (in-process mode: per TP rank); the pod's
    memory request and limit grow by it. Must be greater than zero."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            Rule(
                "quantity(string(self.size)).isGreaterThan(quantity('0'))",
                "size must be greater than zero",
                field_path=".size",
            ),
        )
    )

    @model_validator(mode="after")
    def _check(self) -> CPUTier:
        if self.size <= 0:
            raise FieldProblem("size", "size must be greater than zero")
        return self


_MIN_LE_REQUEST = "min must not exceed request"
_REQUEST_LE_MAX = "request must not exceed max"


class StorageTier(KubeModel):
    """A per-replica share of a KVPool; the rebalancer moves it between `min` and `max`."""

    pool_ref: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    """Name of the KVPool (cluster-scoped) to draw from."""
    request: Quantity
    """Storage quota each replica starts with, a quantity such as 200Gi; the rebalancer then moves it between
    `min` and `max`."""
    min: Quantity | None = None
    """Least quota the rebalancer may leave a replica, a quantity (default 0); the deployment is admitted only
    when the pool has `min` x replicas free. Must not exceed `request`."""
    max: Quantity | None = None
    """Most quota the rebalancer may give a replica, a quantity (default: `request`); each replica's volume is
    sized to it. Must not be less than `request`."""
    weight: float = Field(default=1.0, gt=0, le=1000)
    """Relative value of this deployment's hits when the pool is divided (default 1; 2 counts each of its hits
    twice against other deployments')."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            Rule(
                "!has(self.min) || quantity(string(self.min)).compareTo(quantity(string(self.request))) <= 0",
                _MIN_LE_REQUEST,
                field_path=".min",
            ),
            Rule(
                "!has(self.max) || quantity(string(self.request)).compareTo(quantity(string(self.max))) <= 0",
                _REQUEST_LE_MAX,
                field_path=".max",
            ),
        )
    )

    @model_validator(mode="after")
    def _check(self) -> StorageTier:
        if self.min is not None and self.min > self.request:
            raise FieldProblem("min", _MIN_LE_REQUEST)
        if self.max is not None and self.request > self.max:
            raise FieldProblem("max", _REQUEST_LE_MAX)
        return self

    @property
    def effective_min(self) -> int:
        return self.min if self.min is not None else 0

    @property
    def effective_max(self) -> int:
        return self.max if self.max is not None else self.request


class KVCacheSpec(KubeModel):
    """The KV cache beyond GPU memory: LMCache's mode, its chunk size, its CPU tier and a share of a KVPool."""

    mode: KVCacheMode = "LMCacheMP"
    """`LMCacheMP`: an LMCache server container beside vLLM (live quotas); `LMCacheInProcess`:
    LMCache inside vLLM (sizes change by rolling restart); `None`: HBM prefix cache only. Default LMCacheMP."""
    chunk_size: int = Field(default=256, ge=16, le=65536, multiple_of=16)
    """Tokens per LMCache chunk, the unit LMCache stores and looks up (default 256; a multiple of vLLM's
    16-token block). Smaller chunks hit on shorter shared prefixes at more lookups per request."""
    cpu: CPUTier | None = None
    """LMCache's CPU tier (L1) per replica; required unless mode is None."""
    storage: StorageTier | None = None
    """A per-replica share of a KVPool as the storage tier (L2); omit it for no storage tier. Not with mode None."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            Rule(
                "(has(self.mode) && self.mode == 'None') || has(self.cpu)",
                "cpu is required: LMCache needs a CPU tier (cpu.size) in this mode",
                field_path=".cpu",
                reason="FieldValueRequired",
            ),
            Rule(
                "!has(self.mode) || self.mode != 'None' || !has(self.cpu)",
                "cpu must not be set when mode is None",
                field_path=".cpu",
                reason="FieldValueForbidden",
            ),
            Rule(
                "!has(self.mode) || self.mode != 'None' || !has(self.storage)",
                "storage must not be set when mode is None",
                field_path=".storage",
                reason="FieldValueForbidden",
            ),
        )
    )

    @model_validator(mode="after")
    def _check(self) -> KVCacheSpec:
        if self.mode != "None" and self.cpu is None:
            raise FieldProblem("cpu", "cpu is required: LMCache needs a CPU tier (cpu.size) in this mode")
        if self.mode == "None" and self.cpu is not None:
            raise FieldProblem("cpu", "cpu must not be set when mode is None")
        if self.mode == "None" and self.storage is not None:
            raise FieldProblem("storage", "storage must not be set when mode is None")
        return self


class SLOSpec(KubeModel):
    """Time-to-first-token objectives, for people and dashboards beside `status.kv.ttftP50Seconds`; this
    version's rebalancer does not read them (use `kvCache.storage.weight` to favour a deployment)."""

    ttft_p50: Duration | None = None
    """Median time to first token the deployment aims for, a duration such as 500ms or 1.5s."""
    ttft_p99: Duration | None = None
    """99th-percentile time to first token the deployment aims for, a duration such as 2s (at least ttftP50)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            Rule(
                "!has(self.ttftP50) || !has(self.ttftP99) || duration(self.ttftP50) <= duration(self.ttftP99)",
                "ttftP50 must not exceed ttftP99",
                field_path=".ttftP50",
            ),
        )
    )

    @model_validator(mode="after")
    def _check(self) -> SLOSpec:
        if self.ttft_p50 is not None and self.ttft_p99 is not None and self.ttft_p50 > self.ttft_p99:
            raise FieldProblem("ttftP50", "ttftP50 must not exceed ttftP99")
        return self


_ARGS_ALWAYS = (
    "args must not set --port, --host, --model, --served-model-name, --tensor-parallel-size, "
    "--gpu-memory-utilization or --max-model-len: use the spec's fields"
)
_ARGS_KV = (
    "args must not set --kv-transfer-config, --kv-offloading-size or --kv-offloading-backend: "
    "kvtier renders the KV connector for kvCache.mode"
)
_ENV_HASHSEED = "env must not set PYTHONHASHSEED: kvtier sets one seed on every replica so cache keys match"
_ENV_LMCACHE = "env must not set LMCACHE_* in LMCacheInProcess mode: kvtier renders LMCache's config file"
# Rules read the mode without relying on the API server's defaulting (absent means LMCacheMP).
_IN_PROCESS = "has(self.kvCache) && has(self.kvCache.mode) && self.kvCache.mode == 'LMCacheInProcess'"
_NO_CONNECTOR = "has(self.kvCache) && has(self.kvCache.mode) && self.kvCache.mode == 'None'"


class InferenceDeploymentSpec(KubeModel):
    """What to run: the model, the vLLM engine, how many replicas, and the KV cache tiers."""

    model: ModelSpec
    replicas: int = Field(default=1, ge=0, le=MAX_REPLICAS)
    """vLLM replicas (pods), default 1, at most 1024; each has its own CPU tier and storage quota. `kubectl
    scale` sets it. More than the nodes can hold at once is reported as DoesNotFit."""
    engine: EngineSpec
    kv_cache: KVCacheSpec
    """The KV cache tiers beyond GPU memory, sized per replica. Required: the default mode, LMCacheMP, needs
    `cpu.size`, so there is no default a real API server would accept; `{mode: None}` runs vLLM alone."""
    slo: SLOSpec | None = None

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            Rule(
                f"!has(self.engine.args) || self.engine.args.all(a, !a.matches({cel_literal(ALWAYS_OWNED_FLAGS)}))",
                _ARGS_ALWAYS,
                field_path=".engine.args",
                reason="FieldValueForbidden",
            ),
            Rule(
                f"!has(self.engine.args) || ({_NO_CONNECTOR}) || "
                f"self.engine.args.all(a, !a.matches({cel_literal(KV_OWNED_FLAGS)}))",
                _ARGS_KV,
                field_path=".engine.args",
                reason="FieldValueForbidden",
            ),
            Rule(
                f"!has(self.engine.env) || self.engine.env.all(e, e.name != '{OWNED_ENV}')",
                _ENV_HASHSEED,
                field_path=".engine.env",
                reason="FieldValueForbidden",
            ),
            Rule(
                f"!has(self.engine.env) || !({_IN_PROCESS}) || "
                f"self.engine.env.all(e, !e.name.startsWith('{IN_PROCESS_OWNED_ENV_PREFIX}'))",
                _ENV_LMCACHE,
                field_path=".engine.env",
                reason="FieldValueForbidden",
            ),
        )
    )

    @model_validator(mode="after")
    def _check(self) -> InferenceDeploymentSpec:
        for index, arg in enumerate(self.engine.args):
            if re.search(ALWAYS_OWNED_FLAGS, arg):
                raise FieldProblem(f"engine.args.{index}", _ARGS_ALWAYS)
            if self.kv_cache.mode != "None" and re.search(KV_OWNED_FLAGS, arg):
                raise FieldProblem(f"engine.args.{index}", _ARGS_KV)
        for index, var in enumerate(self.engine.env):
            if var.name == OWNED_ENV:
                raise FieldProblem(f"engine.env.{index}.name", _ENV_HASHSEED)
            if self.kv_cache.mode == "LMCacheInProcess" and var.name.startswith(IN_PROCESS_OWNED_ENV_PREFIX):
                raise FieldProblem(f"engine.env.{index}.name", _ENV_LMCACHE)
        return self

    @property
    def served_name(self) -> str:
        return self.model.served_name or self.model.name

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one LMCache chunk of KV over all layers and TP ranks."""
        return self.kv_cache.chunk_size * self.model.bytes_per_token

    @property
    def cpu_tier_memory_bytes(self) -> int:
        """Host memory one replica needs for the CPU tier: one L1 in MP mode, one buffer per TP rank in-process."""
        cpu = self.kv_cache.cpu
        if self.kv_cache.mode == "None" or cpu is None:
            return 0
        ranks = self.engine.tensor_parallel_size if self.kv_cache.mode == "LMCacheInProcess" else 1
        return cpu.size * ranks


class HitRatio(KubeModel):
    """Token-weighted fraction of prompt tokens served from each tier over the last window."""

    hbm: float | None = Field(default=None, ge=0, le=1)
    """Share of prompt tokens found in vLLM's GPU prefix cache (0-1)."""
    cpu: float | None = Field(default=None, ge=0, le=1)
    """Share of prompt tokens loaded from LMCache's CPU tier (0-1)."""
    storage: float | None = Field(default=None, ge=0, le=1)
    """Share of prompt tokens loaded from the pool's storage tier (0-1); this is what the quota buys."""
    total: float | None = Field(default=None, ge=0, le=1)
    """Share of prompt tokens served from any tier (0-1); the rest were prefilled on the GPU."""


class StorageUsage(KubeModel):
    """The storage tier's quota and how much of it holds KV chunks."""

    quota: Quantity | None = None
    """Per-replica storage quota currently applied."""
    used: Quantity | None = None
    """Bytes in use on the storage tier, summed over replicas."""


class DemandPoint(KubeModel):
    capacity: int = Field(ge=0)
    """Storage per replica, in the curve's unit (`bytes` or `chunks`)."""
    hit_ratio: float = Field(ge=0, le=1)
    """Share of the probe's lookups that an LRU cache of this capacity would hit."""


class DemandCurve(KubeModel):
    """A few points of the deployment's demand curve (hit ratio as a function of storage per replica)."""

    unit: Literal["bytes", "chunks"]
    """Unit of each point's capacity: `bytes`, or `chunks` of kvCache.chunkSize tokens."""
    points: list[DemandPoint] = Field(default_factory=list, max_length=16)
    """Up to 16 points, by increasing capacity."""


class KVShown(KubeModel):
    """The window's headline numbers written for people (the numbers above, for machines, stay numbers)."""

    hbm_watermark: str | None = None
    """Mean GPU KV cache use, e.g. `92%`."""
    hit_ratio: str | None = None
    """Prompt tokens served from any cache tier, e.g. `78%`."""
    storage_hit_ratio: str | None = None
    """Prompt tokens served from the storage tier, e.g. `21%`."""
    ttft_p50: str | None = None
    """Median time to first token, e.g. `850ms` or `1.5s`."""


class KVStatus(KubeModel):
    """The deployment's KV cache as the engines report it, over the operator's telemetry window."""

    hbm_watermark: float | None = Field(default=None, ge=0, le=1)
    """Mean fraction of the GPU KV cache in use over ready replicas."""
    hbm_watermark_max: float | None = Field(default=None, ge=0, le=1)
    """Highest fraction of the GPU KV cache in use by any replica in the window."""
    hit_ratio: HitRatio | None = None
    storage: StorageUsage | None = None
    ttft_p50_seconds: float | None = Field(default=None, ge=0)
    """Median time to first token over the window, in seconds."""
    ttft_p99_seconds: float | None = Field(default=None, ge=0)
    """99th-percentile time to first token over the window, in seconds."""
    preemptions_per_second: float | None = Field(default=None, ge=0)
    """Requests vLLM preempted per second (its GPU KV cache was full), over all replicas."""
    prompt_tokens_per_second: float | None = Field(default=None, ge=0)
    """Prompt tokens the replicas received per second, summed; x hitRatio.storage = tokens per second the
    storage tier served (prefill the quota saved)."""
    demand: DemandCurve | None = None
    sampled_at: Timestamp | None = None
    """When the numbers were last written (they change only on a material change)."""
    shown: KVShown | None = None
    """The headline numbers with their units, as `kubectl get infd` shows them."""


class InferenceDeploymentStatus(KubeModel):
    """What the operator observed; written by kvtier through the status subresource, never by users."""

    observed_generation: int | None = None
    """The `metadata.generation` this status describes; while it lags, the operator has not acted on the
    latest spec yet."""
    replicas: int | None = None
    """Replicas (pods) that exist."""
    ready_replicas: int | None = None
    """Replicas that are Ready: the engine serves and its storage quota is set."""
    selector: str | None = None
    """Label selector of the pods, for the scale subresource (HorizontalPodAutoscaler)."""
    conditions: list[Condition] = Field(default_factory=list)
    """Ready, Progressing, StorageBound, MetricsAvailable and Degraded, each with a reason and a message."""
    kv: KVStatus | None = None


class InferenceDeployment(KubeModel):
    """vLLM + LMCache replicas whose KV cache is tiered from HBM into CPU memory and a KVPool."""

    KIND: ClassVar[str] = "InferenceDeployment"
    PLURAL: ClassVar[str] = "inferencedeployments"
    #: `metadata.name` bound in the CRD schema (a CEL rule may not point into metadata on a real API server).
    MAX_NAME_LENGTH: ClassVar[int] = MAX_NAME_LENGTH

    api_version: Literal["kvtier.io/v1alpha1"] = API_VERSION
    kind: Literal["InferenceDeployment"] = "InferenceDeployment"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: InferenceDeploymentSpec
    status: InferenceDeploymentStatus | None = None
    """What the operator observed: replicas, conditions and the KV cache's numbers."""

    @model_validator(mode="after")
    def _check(self) -> InferenceDeployment:
        name = self.metadata.name or ""
        if len(name) > MAX_NAME_LENGTH:
            raise FieldProblem(
                "metadata.name",
                f"name must be at most {MAX_NAME_LENGTH} characters (StatefulSet pod labels add a suffix)",
            )
        return self
