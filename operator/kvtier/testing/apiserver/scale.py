"""The scale subresource (autoscaling/v1 Scale) of kinds that declare one."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from . import errors
from .errors import FieldError
from .meta import WriteOptions, get_path, set_path
from .resources import ResourceType
from .selectors import selector_to_string
from .store import Stored


class ScaleSubresource:
    """Reading and writing `/scale` (the :class:`~.core.Cluster`'s part)."""

    if TYPE_CHECKING:  # provided by Cluster

        def _commit(
            self,
            rt: ResourceType,
            old: Stored,
            new: dict[str, Any],
            opts: WriteOptions,
            subresource: str | None,
            *,
            track_fields: bool = True,
        ) -> dict[str, Any]: ...

    def scale_of(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """The autoscaling/v1 Scale view of a scalable object."""
        spec = rt.scale
        if spec is None:
            raise errors.not_found(rt.group, f"{rt.plural}/scale", obj["metadata"]["name"])
        if spec.selector_from_spec:
            selector = selector_to_string(get_path(obj, ".spec.selector"))
        else:
            selector = get_path(obj, spec.label_selector_path) if spec.label_selector_path else None
        meta = obj["metadata"]
        scale: dict[str, Any] = {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if k in meta
            },
            "spec": {"replicas": get_path(obj, spec.spec_replicas_path) or 0},
            "status": {"replicas": get_path(obj, spec.status_replicas_path) or 0},
        }
        if selector:
            scale["status"]["selector"] = selector
        return scale

    def _write_scale(self, rt: ResourceType, old: Stored, scale: Any, opts: WriteOptions) -> dict[str, Any]:
        if rt.scale is None:
            raise errors.not_found(rt.group, f"{rt.plural}/scale", old.obj["metadata"]["name"])
        replicas = get_path(scale, ".spec.replicas") if isinstance(scale, dict) else None
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise errors.invalid(
                "autoscaling",
                "Scale",
                old.obj["metadata"]["name"],
                [FieldError("spec.replicas", "Invalid value", "must be greater than or equal to 0", replicas)],
            )
        new = copy.deepcopy(old.obj)
        expected = get_path(scale, ".metadata.resourceVersion")
        new["metadata"]["resourceVersion"] = expected or old.obj["metadata"]["resourceVersion"]
        set_path(new, rt.scale.spec_replicas_path, replicas)
        return self.scale_of(rt, self._commit(rt, old, new, opts, None))
