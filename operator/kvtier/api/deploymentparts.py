"""The parts of an InferenceDeployment's spec: the model, the vLLM engine, the KV cache tiers, the SLO."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, WithJsonSchema, model_validator

from kvtier.api.common import (
    DNS_SUBDOMAIN_PATTERN,
    KubeModel,
)
from kvtier.api.errors import FieldProblem
from kvtier.api.rules import Rule, cel_literal, cel_rules
from kvtier.api.units import (
    MAX_QUANTITY_LENGTH,
    RESOURCE_QUANTITY_PATTERN,
    Duration,
    Quantity,
    quantity_value,
    unless_malformed,
)

#: Bytes per element of the KV cache for each dtype vLLM stores KV in.
KV_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}

KVCacheMode = Literal["LMCacheMP", "LMCacheInProcess", "None"]


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
                unless_malformed("quantity(string(self.size)).isGreaterThan(quantity('0'))", quantities=("self.size",)),
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
                "!has(self.min) || "
                + unless_malformed(
                    "quantity(string(self.min)).compareTo(quantity(string(self.request))) <= 0",
                    quantities=("self.min", "self.request"),
                ),
                _MIN_LE_REQUEST,
                field_path=".min",
            ),
            Rule(
                "!has(self.max) || "
                + unless_malformed(
                    "quantity(string(self.request)).compareTo(quantity(string(self.max))) <= 0",
                    quantities=("self.request", "self.max"),
                ),
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
                "!has(self.ttftP50) || !has(self.ttftP99) || "
                + unless_malformed(
                    "duration(self.ttftP50) <= duration(self.ttftP99)", durations=("self.ttftP50", "self.ttftP99")
                ),
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
