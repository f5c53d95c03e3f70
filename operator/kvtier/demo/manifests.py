"""The demo's manifests: packaged jinja2 templates (``manifests/*.yaml.j2``) filled in for one run."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import jinja2
import yaml

from kvtier.api.units import format_duration
from kvtier.demo.workload import Workload

NAMESPACE = "kvtier-demo"
POOL = "demo-pool"
DEPLOYMENTS = ("chat", "code", "rag")
TEMPLATES = ("kvpool.yaml.j2", "deployments.yaml.j2")


@dataclass(frozen=True)
class DemoManifests:
    """What the templates need: where the trace and the pool live, the clock, and the sizes."""

    trace: str
    pool_path: str = "/var/lib/kvtier/demo-pool"
    speed: float = 10.0
    workload: Workload = field(default_factory=Workload)
    interval_seconds: float = 5.0
    cooldown_seconds: float = 5.0
    capacity: str = "96Gi"
    request: str = "32Gi"
    min: str = "8Gi"
    max: str = "64Gi"
    cpu_size: str = "16Gi"
    hbm_blocks: int = 256
    cpu_blocks: int = 512
    """16Gi of 32Mi chunks: kvsim sizes its CPU tier in chunks."""

    def values(self) -> dict[str, Any]:
        return {
            "namespace": NAMESPACE,
            "pool": POOL,
            "pool_path": self.pool_path,
            "trace": self.trace,
            "speed": f"{self.speed:g}",
            "phase_seconds": f"{self.workload.phase_seconds:g}",
            "interval": format_duration(self.interval_seconds),
            "cooldown": format_duration(self.cooldown_seconds),
            "capacity": self.capacity,
            "request": self.request,
            "min": self.min,
            "max": self.max,
            "cpu_size": self.cpu_size,
            "chunk_tokens": self.workload.block_tokens,
            "hbm_blocks": self.hbm_blocks,
            "cpu_blocks": self.cpu_blocks,
            "deployments": [
                {"name": name, "time_shift": f"{self.workload.time_shift(index):g}"}
                for index, name in enumerate(DEPLOYMENTS)
            ],
        }

    def render(self) -> str:
        """All the demo's objects as one multi-document YAML text (the pool first)."""
        environment = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
        package = resources.files("kvtier.demo") / "manifests"
        texts = [environment.from_string((package / name).read_text()).render(self.values()) for name in TEMPLATES]
        return "---\n".join(texts)

    def objects(self) -> list[dict[str, Any]]:
        return [document for document in yaml.safe_load_all(self.render()) if document]
