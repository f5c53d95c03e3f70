"""Pure rendering: an InferenceDeployment (and its KVPool) -> the Kubernetes objects that run it. No I/O.

The controller calls `render_deployment` for the children it applies, `check_fit` before creating
anything, and turns a `RenderError` (its `reason`, message and `field`) into a condition.
"""

from kvtier.render.errors import InsufficientCapacity, RenderError, UnsupportedStorage
from kvtier.render.fit import NodeResources, check_fit
from kvtier.render.meta import (
    headless_service_name,
    labels,
    owner_reference,
    selector,
    selector_labels,
)
from kvtier.render.options import RenderOptions
from kvtier.render.sizing import PodSizing, pod_sizing
from kvtier.render.volumes import StorageBinding, default_binding
from kvtier.render.workload import render_deployment

__all__ = [
    "InsufficientCapacity",
    "NodeResources",
    "PodSizing",
    "RenderError",
    "RenderOptions",
    "StorageBinding",
    "UnsupportedStorage",
    "check_fit",
    "default_binding",
    "headless_service_name",
    "labels",
    "owner_reference",
    "pod_sizing",
    "render_deployment",
    "selector",
    "selector_labels",
]
