"""What a cache hit is worth: prefill compute time from a model's shape and its replica's GPUs.

Prefill of prompt tokens ``[a, b)`` with ``[0, a)`` already in the KV cache costs, in FLOPs,

- the matrix products of every token: ``2 x active_params x (b - a)`` (``active_params``: the
  parameters one token goes through; for a mixture of experts the active ones, not the total);
- attention: token ``i`` scores and mixes against ``i`` earlier tokens in every layer, ``4 x i x
  q_width`` FLOPs (``q_width = attention_heads x head_dim``: QK^T and AV, 2 FLOPs a
  multiply-add), so the span costs ``2 x layers x q_width x (b^2 - a^2)``: a block deep in a long
  prompt costs more than one at its start.

A replica's GPUs run them at ``count x flops_per_gpu x efficiency`` FLOP/s (efficiency: the share of
the peak prefill reaches). A hit of ``[0, h)`` loads ``h x kv_bytes_per_token`` bytes at the
replica's storage read bandwidth instead, before the missed tokens compute; the GPUs serve other
requests meanwhile (the replay's :class:`~kvtier.sim.replay.PrefillQueue` models the load, the
queues and that freedom).

The presets are public figures (docs/cost-model.md derives them): no parameter is fitted to the
seed's measurements.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """The parts of a model's architecture prefill cost depends on."""

    name: str
    active_params: float
    layers: int
    hidden: int
    """d_model (documentation: the query width below is what attention costs, which differs from
    it for models such as Qwen3-Coder-480B)."""
    attention_heads: int
    kv_heads: int
    head_dim: int
    kv_dtype_bytes: int = 2

    @property
    def q_width(self) -> int:
        return self.attention_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer's KV heads."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_dtype_bytes

    def hit_token_flops(self, prompt_tokens: float) -> float:
        """Prefill FLOPs one hit token saves, on average over a hit prefix of ``prompt_tokens``:
        ``(2 P_active P + 2 L w P^2) / P``. On the same GPUs, GPU seconds are proportional to it."""
        return 2 * self.active_params + 2 * self.layers * self.q_width * max(prompt_tokens, 1.0)


@dataclass(frozen=True)
class ReplicaGPUs:
    """One replica's accelerators (tensor parallel: all of them work on every prefill)."""

    name: str
    count: int
    flops_per_gpu: float
    """Peak dense FLOP/s of the matrix products (the weights' precision: FP8 weights run FP8 GEMMs)."""
    efficiency: float
    attention_flops_per_gpu: float | None = None
    """Peak dense FLOP/s of attention (the KV cache's precision, bf16); None: ``flops_per_gpu``."""

    @property
    def flops(self) -> float:
        return self.count * self.flops_per_gpu * self.efficiency

    @property
    def attention_flops(self) -> float:
        return self.count * (self.attention_flops_per_gpu or self.flops_per_gpu) * self.efficiency


@dataclass(frozen=True)
class CostModel:
    """Prefill and load times of one replica: :meth:`of` a model on GPUs, or :meth:`linear`."""

    flops_per_token: float
    """``2 x active_params``."""
    attention_flops: float
    """``2 x layers x q_width``: the coefficient of ``b^2 - a^2``."""
    flops_per_second: float
    """What the replica's GPUs deliver to the matrix products."""
    attention_flops_per_second: float
    """... and to attention."""
    kv_bytes_per_token: int
    storage_read_bytes_per_second: float

    def __post_init__(self) -> None:
        if min(self.flops_per_second, self.attention_flops_per_second, self.storage_read_bytes_per_second) <= 0:
            raise ValueError("FLOP/s and storage bandwidth must be > 0")

    @classmethod
    def of(cls, shape: ModelShape, gpus: ReplicaGPUs, storage_read_bytes_per_second: float) -> CostModel:
        return cls(
            2 * shape.active_params,
            2 * shape.layers * shape.q_width,
            gpus.flops,
            gpus.attention_flops,
            shape.kv_bytes_per_token,
            storage_read_bytes_per_second,
        )

    @classmethod
    def linear(
        cls,
        prefill_tokens_per_second: float,
        kv_bytes_per_token: int,
        storage_read_bytes_per_second: float,
    ) -> CostModel:
        """No attention term: every token at ``prefill_tokens_per_second`` (the scenario format's model)."""
        return cls(
            1.0,
            0.0,
            prefill_tokens_per_second,
            prefill_tokens_per_second,
            kv_bytes_per_token,
            storage_read_bytes_per_second,
        )

    def prefill_seconds(self, start: float, end: float) -> float:
        """GPU seconds to prefill tokens ``[start, end)`` on top of a cached ``[0, start)``."""
        if end <= start:
            return 0.0
        return (
            self.flops_per_token * (end - start) / self.flops_per_second
            + self.attention_flops * (end * end - start * start) / self.attention_flops_per_second
        )

    def load_seconds(self, tokens: float, bytes_per_second: float | None = None) -> float:
        """Seconds to read ``tokens`` of KV from storage (or at ``bytes_per_second``)."""
        return tokens * self.kv_bytes_per_token / (bytes_per_second or self.storage_read_bytes_per_second)

    def saved_per_hit_token(self, prefix_tokens: float) -> float:
        """GPU seconds one hit token saves, on average over a hit prefix of ``prefix_tokens``."""
        if prefix_tokens <= 1:
            return self.prefill_seconds(0, 1)
        return self.prefill_seconds(0, prefix_tokens) / prefix_tokens


#: LLaMA-3-70B (config.json of meta-llama/Meta-Llama-3-70B): 70.6e9 parameters, 80 layers, hidden
#: 8,192, 64 query heads and 8 KV heads of 128; fp16 KV: 327,680 bytes a token.
LLAMA3_70B = ModelShape(
    "llama-3-70b", active_params=70.6e9, layers=80, hidden=8192, attention_heads=64, kv_heads=8, head_dim=128
)
#: The seed's 480B MoE (Qwen3-Coder-480B-A35B-Instruct, config.json): 35e9 active parameters,
#: 62 layers, hidden 6,144, 96 query heads and 8 KV heads of 128; bf16 KV: 253,952 bytes a token.
QWEN3_CODER_480B = ModelShape(
    "qwen3-coder-480b-a35b", active_params=35e9, layers=62, hidden=6144, attention_heads=96, kv_heads=8, head_dim=128
)

#: LLaMA-3-8B / 3.1-8B (config.json): 8.03e9 parameters, 32 layers, hidden 4,096, 32 query heads
#: and 8 KV heads of 128.
LLAMA3_8B = ModelShape(
    "llama-3-8b", active_params=8.03e9, layers=32, hidden=4096, attention_heads=32, kv_heads=8, head_dim=128
)

#: Served models whose shape kvtier knows, by Hugging Face id (lower case; a local path matches by its
#: last component). The operator values a deployment's storage hits by the prefill they save when
#: every deployment of its pool runs one of these (docs/cost-model.md).
KNOWN_MODELS = {
    **dict.fromkeys(
        [
            "meta-llama/meta-llama-3-70b",
            "meta-llama/meta-llama-3-70b-instruct",
            "meta-llama/llama-3.1-70b",
            "meta-llama/llama-3.1-70b-instruct",
            "meta-llama/llama-3.3-70b-instruct",
        ],
        LLAMA3_70B,
    ),
    **dict.fromkeys(
        [
            "meta-llama/meta-llama-3-8b",
            "meta-llama/meta-llama-3-8b-instruct",
            "meta-llama/llama-3.1-8b",
            "meta-llama/llama-3.1-8b-instruct",
        ],
        LLAMA3_8B,
    ),
    **dict.fromkeys(
        ["qwen/qwen3-coder-480b-a35b-instruct", "qwen/qwen3-coder-480b-a35b-instruct-fp8"], QWEN3_CODER_480B
    ),
}


def known_shape(model: str) -> ModelShape | None:
    """The shape of a served model by its id or path (None when kvtier does not know it)."""
    name = model.strip().rstrip("/").lower()
    if name in KNOWN_MODELS:
        return KNOWN_MODELS[name]
    base = name.rsplit("/", 1)[-1]
    return next((shape for key, shape in KNOWN_MODELS.items() if key.rsplit("/", 1)[-1] == base), None)


#: Dense peaks from the vendors' data sheets (FLOP/s, without sparsity); efficiency 0.4, one stated
#: assumption for long, compute-bound prefills (docs/cost-model.md), not tuned.
H100_SXM_BF16 = 989e12
H20_FP8 = 296e12
H20_BF16 = 148e12
PREFILL_EFFICIENCY = 0.4
GPUS = {
    # bf16 weights and KV.
    "4xH100": ReplicaGPUs("4xH100", 4, H100_SXM_BF16, PREFILL_EFFICIENCY),
    # FP8 weights (the 450 GB checkpoint), bf16 KV: FP8 matrix products, bf16 attention.
    "8xH20": ReplicaGPUs("8xH20", 8, H20_FP8, PREFILL_EFFICIENCY, attention_flops_per_gpu=H20_BF16),
}
#: The seed's storage read bandwidth of one replica, with LMCache's parallel reads (R1).
SEED_READ_BYTES_PER_SECOND = 5.23e9

#: Presets: a model on its replica's GPUs.
PRESETS = {
    "llama-3-70b-4xh100": (LLAMA3_70B, GPUS["4xH100"]),
    "qwen3-coder-480b-8xh20": (QWEN3_CODER_480B, GPUS["8xH20"]),
}


def preset(name: str, storage_read_bytes_per_second: float = SEED_READ_BYTES_PER_SECOND) -> CostModel:
    """A preset's cost model (``KeyError`` naming the presets when unknown)."""
    if name not in PRESETS:
        raise KeyError(f"unknown cost model preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    shape, gpus = PRESETS[name]
    return CostModel.of(shape, gpus, storage_read_bytes_per_second)
