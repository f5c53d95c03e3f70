"""Hindsight for the oracle policies: exact per-tenant stack depths of the whole run.

:class:`Hindsight` holds, for every tenant and every epoch, the histogram of the effective LRU
stack distances of the epoch's accesses, computed on the tenant's whole stream (so a distance
reflects everything before it). An LRU partition of fixed quota q hits exactly the accesses of
distance <= q, so the whole-stream histogram values every static split exactly, and the epoch
histograms value a split per epoch "as if a growing partition instantly got its blocks back".

:class:`HindsightPool` makes the replay core serve that definition: its partitions keep the
tenant's whole LRU stack and hit a block when its stack depth is within the current quota, so a
replay of ``oracle-dynamic`` reports latency and prefill savings for exactly the hits the
epoch histograms predict.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Sequence

from kvtier.probe.stackdist import INFINITE, DistanceHistogram, StackDistanceTracker, epoch_histograms
from kvtier.sim.cache import IsolatedLRU
from kvtier.sim.replay import TenantWorkload


class Hindsight:
    """Per tenant, per epoch stack-distance histograms (all tenants padded to the same epochs)."""

    def __init__(self, workloads: Sequence[TenantWorkload], epoch_seconds: float) -> None:
        self.epoch_seconds = epoch_seconds
        epochs = {
            workload.name: epoch_histograms(((r.arrival, r.blocks) for r in workload.requests), epoch_seconds)
            for workload in workloads
        }
        #: Number of epochs: up to the last arrival of any tenant.
        self.count = max((len(histograms) for histograms in epochs.values()), default=0)
        for histograms in epochs.values():
            histograms.extend(DistanceHistogram() for _ in range(self.count - len(histograms)))
        self._epochs = epochs
        self._whole: dict[str, DistanceHistogram] = {}

    @property
    def tenants(self) -> list[str]:
        return list(self._epochs)

    def epoch(self, tenant: str, index: int) -> DistanceHistogram:
        """The tenant's accesses in epoch ``index`` (empty past its last request)."""
        return self._epochs[tenant][index]

    def whole(self, tenant: str) -> DistanceHistogram:
        """The tenant's whole run (the sum of its epochs)."""
        histogram = self._whole.get(tenant)
        if histogram is None:
            histogram = DistanceHistogram()
            for part in self._epochs[tenant]:
                histogram.merge(part)
            self._whole[tenant] = histogram
        return histogram


class _DepthTracker(StackDistanceTracker):
    """A stack-distance tracker that also answers one block's plain (not effective) depth."""

    __slots__ = ()

    def depth(self, block: Hashable) -> float:
        slot = self._last.get(block)
        return INFINITE if slot is None else self._depth_at(slot)


class DepthPartition:
    """A partition that keeps its tenant's whole LRU stack and holds the top ``capacity`` of it.

    It answers the calls an :class:`~kvtier.sim.engine.Engine` makes on a storage tier (an
    :class:`~kvtier.sim.cache.LRUCache` 's ``access``, ``prefix_hits``, ``touch``, ``in``,
    ``resize``). Resizing never evicts: a shrunk partition's blocks come back when it grows.
    """

    __slots__ = ("_stack", "_capacity", "evicted")

    def __init__(self, capacity: int = 0) -> None:
        self._stack = _DepthTracker()
        self._capacity = capacity
        self.evicted = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    def __len__(self) -> int:
        return min(len(self._stack), self._capacity)

    def __contains__(self, block: Hashable) -> bool:
        return self._stack.depth(block) <= self._capacity

    def resize(self, capacity: int) -> int:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self._capacity = capacity
        return 0

    def prefix_hits(self, blocks: Sequence[Hashable], start: int = 0) -> int:
        hits = 0
        for index in range(start, len(blocks)):
            if blocks[index] not in self:
                break
            hits += 1
        return hits

    def touch(self, blocks: Sequence[Hashable]) -> int:
        self._stack.access(blocks)
        return 0

    def access(self, blocks: Sequence[Hashable]) -> int:
        """Look a request up, then store it: hits are the blocks of effective depth <= capacity."""
        # Effective distances never decrease along a request, so the hits are a prefix.
        return bisect.bisect_right(self._stack.access(blocks), self._capacity)


class HindsightPool(IsolatedLRU):
    """An :class:`~kvtier.sim.cache.IsolatedLRU` whose partitions are :class:`DepthPartition` s."""

    __slots__ = ()

    def partition(self, salt: str) -> DepthPartition:  # type: ignore[override]  # a depth-aware partition
        cache = self._partitions.get(salt)
        if cache is None:
            cache = self._partitions[salt] = DepthPartition(self._quotas.get(salt, 0))  # type: ignore[assignment]  # a subclass of the base's
        return cache
