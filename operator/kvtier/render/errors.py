"""Why a spec cannot be rendered into working pods, in a shape a condition can carry."""

from __future__ import annotations


class RenderError(ValueError):
    """A spec that would render into pods that cannot work; never rendered half-way.

    `reason` is a CamelCase word for a condition's `reason`, `str(error)` its message, and `field`
    the spec field at fault (relative to the object, `spec.kvCache.storage`), when there is one.
    """

    reason = "RenderFailed"

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class UnsupportedStorage(RenderError):
    """The pool's volumes cannot serve this deployment's KV cache mode (e.g. one device for many TP ranks)."""

    reason = "UnsupportedStorage"


class InsufficientCapacity(RenderError):
    """A static pool has fewer free namespaces than the deployment has replicas."""

    reason = "InsufficientCapacity"
