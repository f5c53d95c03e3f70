"""kvtier: a Kubernetes operator that tiers LLM KV cache into CPU memory and NVMe-oF arrays."""

__version__ = "0.1.0"
