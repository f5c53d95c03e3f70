"""Replay scenarios (format version 1 of ``scenarios/README.md``): a pool shared by tenants replaying traces.

Beyond the format's fields, a tenant may set the engine latency model's knobs (all optional):
``replicas``, ``cpuReadBytesPerSecond``, ``maxRunningRequests``, ``decodeSecondsPerToken``, and
``costModel``: a preset of :mod:`kvtier.rebalance.costmodel` (a model shape on its replica's
GPUs: prefill time with the attention term) instead of the flat ``prefillTokensPerSecond``.
``replicas: auto`` (the default) runs enough replicas that the trace's mean prefill demand, with
no cache hits, loads them to at most 70%; replicas only change latency, never hit ratios.
A scenario may also set the ``kvtier`` policy's ``rebalance`` settings: exactly a KVPool's
``spec.rebalance`` (:class:`~kvtier.api.kvpool.RebalanceSpec`: ``policy``, ``interval``,
``cooldown``, ``minGain``, ``maxStep``, ``dryRun``), with the same defaults, so a scenario without
the block replays what a KVPool gets by default. ``kvtier`` runs a round every ``interval``;
``epochSeconds`` only defines the epochs of ``oracle-dynamic`` (and the timeline of the others).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, model_validator
from pydantic.alias_generators import to_camel

from kvtier.api.kvpool import RebalanceSpec
from kvtier.api.units import parse_quantity
from kvtier.rebalance.costmodel import PRESETS, CostModel, preset
from kvtier.sim.engine import EngineParams
from kvtier.sim.replay import TenantWorkload
from kvtier.sim.trace import Request, TimestampUnit, load_trace

_ENGINE_DEFAULTS = EngineParams()

PolicyName = Literal["equal", "proportional", "shared", "oracle-static", "oracle-dynamic", "kvtier"]


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True, use_attribute_docstrings=True
    )


class ScenarioPool(_Model):
    capacity_blocks: int | None = Field(default=None, ge=0)
    capacity: Annotated[int, BeforeValidator(parse_quantity)] | None = None
    """Bytes; converted to blocks with the tenants' (common) block size."""

    @model_validator(mode="after")
    def _exactly_one_capacity(self) -> ScenarioPool:
        if (self.capacity_blocks is None) == (self.capacity is None):
            raise ValueError("pool needs exactly one of capacityBlocks and capacity")
        return self


class ScenarioTenant(_Model):
    name: str = Field(min_length=1)
    trace: str
    """Path of a Mooncake-format trace, relative to the scenario file."""
    timestamp_unit: TimestampUnit = "ms"
    time_scale: float = Field(default=1.0, gt=0)
    time_shift_seconds: float = 0.0
    kv_bytes_per_token: int = Field(gt=0)
    prefill_tokens_per_second: float = Field(gt=0)
    storage_read_bytes_per_second: float = Field(gt=0)
    hbm_blocks: int = Field(default=0, ge=0)
    cpu_blocks: int = Field(default=0, ge=0)
    weight: float = Field(default=1.0, ge=0)
    min_blocks: int = Field(default=0, ge=0)
    max_blocks: int | None = Field(default=None, ge=0)
    replicas: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    cpu_read_bytes_per_second: float = Field(default=_ENGINE_DEFAULTS.cpu_read_bytes_per_second, gt=0)
    max_running_requests: int = Field(default=_ENGINE_DEFAULTS.max_running_requests, ge=1)
    decode_seconds_per_token: float = Field(default=_ENGINE_DEFAULTS.decode_seconds_per_token, ge=0)
    cost_model: str | None = None
    """A preset of kvtier.rebalance.costmodel.PRESETS; its kvBytesPerToken must match."""

    @model_validator(mode="after")
    def _bounds_ordered(self) -> ScenarioTenant:
        if self.max_blocks is not None and self.max_blocks < self.min_blocks:
            raise ValueError(f"tenant {self.name}: maxBlocks < minBlocks")
        if self.cost_model is not None:
            if self.cost_model not in PRESETS:
                raise ValueError(
                    f"tenant {self.name}: costModel {self.cost_model!r} is not one of {', '.join(sorted(PRESETS))}"
                )
            kv_bytes = self.cost().kv_bytes_per_token
            if kv_bytes != self.kv_bytes_per_token:
                raise ValueError(
                    f"tenant {self.name}: kvBytesPerToken {self.kv_bytes_per_token} differs from "
                    f"costModel {self.cost_model}'s {kv_bytes}"
                )
        return self

    def cost(self) -> CostModel:
        """One replica's prefill and load times: the preset, else flat at prefillTokensPerSecond."""
        if self.cost_model is not None:
            return preset(self.cost_model, self.storage_read_bytes_per_second)
        return CostModel.linear(
            self.prefill_tokens_per_second, self.kv_bytes_per_token, self.storage_read_bytes_per_second
        )


class Scenario(_Model):
    version: Literal[1]
    name: str
    block_tokens: int = Field(default=512, ge=1)
    epoch_seconds: float = Field(gt=0)
    scrape_seconds: float = Field(gt=0)
    pool: ScenarioPool
    tenants: list[ScenarioTenant] = Field(min_length=1)
    policies: list[PolicyName] = Field(min_length=1)
    rebalance: RebalanceSpec = Field(default_factory=RebalanceSpec)
    """The ``kvtier`` policy's settings: a KVPool's ``spec.rebalance``, defaults included."""
    _base_dir: Path = PrivateAttr(default=Path("."))

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        names = [tenant.name for tenant in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError(f"tenant names must be unique: {names}")
        if self.pool.capacity is not None and len({t.kv_bytes_per_token for t in self.tenants}) > 1:
            raise ValueError("pool.capacity in bytes needs one kvBytesPerToken for all tenants; use capacityBlocks")
        if sum(tenant.min_blocks for tenant in self.tenants) > self.capacity_blocks:
            raise ValueError("the tenants' minBlocks add up to more than the pool")
        return self

    @property
    def capacity_blocks(self) -> int:
        """The pool's capacity in blocks."""
        if self.pool.capacity_blocks is not None:
            return self.pool.capacity_blocks
        assert self.pool.capacity is not None
        return self.pool.capacity // (self.block_tokens * self.tenants[0].kv_bytes_per_token)

    def trace_path(self, tenant: ScenarioTenant) -> Path:
        return self._base_dir / tenant.trace

    def engine_params(self, tenant: ScenarioTenant) -> EngineParams:
        return EngineParams(
            block_tokens=self.block_tokens,
            kv_bytes_per_token=tenant.kv_bytes_per_token,
            prefill_tokens_per_second=tenant.prefill_tokens_per_second,
            hbm_blocks=tenant.hbm_blocks,
            cpu_blocks=tenant.cpu_blocks,
            cpu_read_bytes_per_second=tenant.cpu_read_bytes_per_second,
            storage_read_bytes_per_second=tenant.storage_read_bytes_per_second,
            max_running_requests=tenant.max_running_requests,
            decode_seconds_per_token=tenant.decode_seconds_per_token,
        )

    def workloads(self) -> list[TenantWorkload]:
        """Load every tenant's trace (blocks namespaced by tenant position); salts are the tenant names."""
        workloads = []
        for index, tenant in enumerate(self.tenants):
            requests = load_trace(
                self.trace_path(tenant),
                timestamp_unit=tenant.timestamp_unit,
                time_scale=tenant.time_scale,
                time_shift_seconds=tenant.time_shift_seconds,
                namespace=index,
            )
            cost = tenant.cost()
            replicas = tenant.replicas
            if replicas == "auto":
                replicas = auto_replicas(requests, cost)
            workloads.append(
                TenantWorkload(tenant.name, requests, self.engine_params(tenant), replicas=replicas, cost=cost)
            )
        return workloads


def auto_replicas(requests: list[Request], cost: CostModel, utilisation: float = 0.7) -> int:
    """Replicas whose GPUs the requests' mean prefill demand (no hits) loads to ``utilisation``."""
    if len(requests) < 2:
        return 1
    span = requests[-1].arrival - requests[0].arrival
    if span <= 0:
        return 1
    seconds = sum(cost.prefill_seconds(0, request.input_tokens) for request in requests)
    return max(1, math.ceil(seconds / span / utilisation))


def load_scenario(path: str | os.PathLike[str]) -> Scenario:
    """Read and validate a scenario file; its traces resolve relative to the file."""
    path = Path(path)
    with open(path, encoding="utf-8") as stream:
        data = yaml.safe_load(stream)
    scenario = Scenario.model_validate(data)
    scenario._base_dir = path.parent
    return scenario
