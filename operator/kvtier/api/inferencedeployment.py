"""InferenceDeployment: vLLM + LMCache replicas whose KV cache is tiered into CPU memory and a KVPool."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from kvtier.api.common import (
    API_VERSION,
    Condition,
    KubeModel,
    ObjectMeta,
    Timestamp,
)
from kvtier.api.deploymentparts import MAX_REPLICAS, EngineSpec, KVCacheSpec, ModelSpec, SLOSpec
from kvtier.api.errors import FieldProblem
from kvtier.api.ownedargs import (
    ALWAYS_OWNED,
    ALWAYS_OWNED_FLAGS,
    ARGS_ALWAYS_MESSAGE,
    ARGS_KV_MESSAGE,
    ENV_HASHSEED_MESSAGE,
    ENV_LMCACHE_MESSAGE,
    IN_PROCESS_OWNED_ENV_PREFIX,
    KV_OWNED,
    KV_OWNED_FLAGS,
    OWNED_ENV,
    owned_flag_problem,
)
from kvtier.api.rules import Rule, cel_literal, cel_rules
from kvtier.api.units import Quantity

#: StatefulSet pods carry a `controller-revision-hash` label of `<name>-<10 chars>`, at most 63 characters.
MAX_NAME_LENGTH = 52

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
                ARGS_ALWAYS_MESSAGE,
                field_path=".engine.args",
                reason="FieldValueForbidden",
            ),
            Rule(
                f"!has(self.engine.args) || ({_NO_CONNECTOR}) || "
                f"self.engine.args.all(a, !a.matches({cel_literal(KV_OWNED_FLAGS)}))",
                ARGS_KV_MESSAGE,
                field_path=".engine.args",
                reason="FieldValueForbidden",
            ),
            *(
                Rule(
                    f"!has(self.engine.args) || self.engine.args.all(a, !a.matches({cel_literal(o.abbreviations)}))",
                    o.abbreviation_message,
                    field_path=".engine.args",
                    reason="FieldValueForbidden",
                )
                for o in ALWAYS_OWNED
            ),
            *(
                Rule(
                    f"!has(self.engine.args) || ({_NO_CONNECTOR}) || "
                    f"self.engine.args.all(a, !a.matches({cel_literal(o.abbreviations)}))",
                    o.abbreviation_message,
                    field_path=".engine.args",
                    reason="FieldValueForbidden",
                )
                for o in KV_OWNED
            ),
            Rule(
                f"!has(self.engine.env) || self.engine.env.all(e, e.name != '{OWNED_ENV}')",
                ENV_HASHSEED_MESSAGE,
                field_path=".engine.env",
                reason="FieldValueForbidden",
            ),
            Rule(
                f"!has(self.engine.env) || !({_IN_PROCESS}) || "
                f"self.engine.env.all(e, !e.name.startsWith('{IN_PROCESS_OWNED_ENV_PREFIX}'))",
                ENV_LMCACHE_MESSAGE,
                field_path=".engine.env",
                reason="FieldValueForbidden",
            ),
        )
    )

    @model_validator(mode="after")
    def _check(self) -> InferenceDeploymentSpec:
        for index, arg in enumerate(self.engine.args):
            if problem := owned_flag_problem(arg, connector=self.kv_cache.mode != "None"):
                raise FieldProblem(f"engine.args.{index}", problem)
        for index, var in enumerate(self.engine.env):
            if var.name == OWNED_ENV:
                raise FieldProblem(f"engine.env.{index}.name", ENV_HASHSEED_MESSAGE)
            if self.kv_cache.mode == "LMCacheInProcess" and var.name.startswith(IN_PROCESS_OWNED_ENV_PREFIX):
                raise FieldProblem(f"engine.env.{index}.name", ENV_LMCACHE_MESSAGE)
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
