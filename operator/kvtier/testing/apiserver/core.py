"""API semantics, independent of HTTP: create, update, patch, apply, delete, scale, garbage collection.

:class:`Cluster` owns the resource :class:`~.resources.Registry` and the :class:`~.store.Store`.
All mutations are synchronous (no awaits), so they are atomic on the event loop; only the garbage
collector runs as a task.  Returned objects are the stored dicts: treat them as read-only.

Lifecycle rules (simplifications are marked):

* Create sets `uid`, `creationTimestamp`, `generation: 1`, honours `generateName`, clears `status`
  of kinds with a status subresource except nodes (pods and volumes start `Pending`, namespaces
  `Active`, CRDs `Established`), allocates service cluster IPs (10.96.0.0/16).  Built-ins get the
  common defaults of :mod:`.defaults` on every write.
* `generation` grows when anything but `metadata` (and `status`, for kinds with a status
  subresource) changes, and when deletion starts.  Writes that change nothing keep the
  resourceVersion and send no event.
* Updates of built-ins (update, patch, apply) obey the immutability rules and the PVC resize
  admission of :mod:`.updates` (StatefulSet specs, PersistentVolumeClaim specs).
* Delete with finalizers only sets `deletionTimestamp`; the update removing the last finalizer
  deletes.  `propagationPolicy`: `Background` (default) deletes dependents after the owner is gone,
  `Foreground` adds the `foregroundDeletion` finalizer and removes it once no dependents remain
  (simplified: every dependent blocks, not only `blockOwnerDeletion` ones), `Orphan` adds the
  `orphan` finalizer and strips the owner reference from dependents.
* Namespaces and CRDs being deleted turn `Terminating`; the collector deletes their content
  (objects in the namespace / instances of the CRD, honouring finalizers) and then removes them.
"""

from __future__ import annotations

import copy
import json
import random
import uuid
from typing import Any

import yaml

from . import defaults, errors
from .apply import ListKeys, builtin_list_keys, record_update, schema_list_keys, server_side_apply
from .crds import crd_errors
from .deletion import Deletion
from .errors import FieldError, StatusError
from .meta import (
    APPLY_PATCH,
    CRD_KEY,
    JSON_PATCH,
    MERGE_PATCH,
    NS_KEY,
    PATCH_TYPES,
    STRATEGIC_PATCH,
    SVC_KEY,
    WriteOptions,
    check_metadata_types,
    crd_status,
    metadata_errors,
    now,
    spec_part,
    without_volatile,
)
from .patch import json_patch, merge_patch, strategic_merge_patch
from .resources import Registry, ResourceType, types_from_crd
from .scale import ScaleSubresource
from .schema import BuiltinValidator, dotted, drop_path, process_custom
from .selectors import Predicate
from .store import Key, Store, Stored, encode
from .updates import admit_update, update_errors

__all__ = ["APPLY_PATCH", "JSON_PATCH", "MERGE_PATCH", "PATCH_TYPES", "STRATEGIC_PATCH", "Cluster", "WriteOptions"]

_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"


class Cluster(ScaleSubresource, Deletion):
    """The emulated API: registry, storage, semantics and the garbage collector."""

    def __init__(self, *, validate_builtins: bool = True, history_size: int = 10_000) -> None:
        self.registry = Registry()
        self.store = Store(history_size)
        self.builtin_validator = BuiltinValidator() if validate_builtins else None
        self._gc_wakeup = None
        self._gc_task = None
        self._service_ips = 0
        for name in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.create(self.resource("", "v1", "namespaces"), None, {"metadata": {"name": name}})

    # -- lookup --------------------------------------------------------------------------------

    def resource(self, group: str, version: str, plural: str) -> ResourceType:
        rt = self.registry.get(group, version, plural)
        if rt is None:
            raise StatusError(
                404,
                "NotFound",
                "the server could not find the requested resource",
                details={"group": group, "kind": plural},
            )
        return rt

    def _key(self, rt: ResourceType, namespace: str | None, name: str) -> Key:
        return ((namespace or "") if rt.namespaced else "", name)

    def find(self, rt: ResourceType, namespace: str | None, name: str) -> Stored | None:
        return self.store.collection(rt.storage_key).objects.get(self._key(rt, namespace, name))

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> Stored:
        stored = self.find(rt, namespace, name)
        if stored is None:
            raise errors.not_found(rt.group, rt.plural, name)
        return stored

    def list(
        self, rt: ResourceType, namespace: str | None, predicate: Predicate | None = None
    ) -> tuple[list[Stored], int]:
        ordered = self.store.collection(rt.storage_key).ordered(namespace if rt.namespaced else None)
        items = ordered if predicate is None else [s for s in ordered if predicate(s.obj)]
        return items, self.store.rv

    def render(self, rt: ResourceType, stored: Stored) -> bytes:
        """The object's JSON as served at `rt`'s version."""
        if stored.obj.get("apiVersion") == rt.api_version:
            return stored.raw
        return encode({**stored.obj, "apiVersion": rt.api_version})

    # -- create --------------------------------------------------------------------------------

    def create(
        self,
        rt: ResourceType,
        namespace: str | None,
        body: Any,
        opts: WriteOptions | None = None,
        *,
        track_fields: bool = True,
    ) -> dict[str, Any]:
        opts = opts or WriteOptions()
        obj = self._check_body(rt, namespace, body, None)
        meta = obj["metadata"]
        if not meta.get("name"):
            generate = meta.get("generateName")
            meta["name"] = (
                generate + "".join(random.choices(_NAME_CHARS, k=5)) if isinstance(generate, str) and generate else ""
            )
        namespace = meta.get("namespace")
        if meta.get("name"):  # without one, validation reports it with every other error, as the real server
            if rt.namespaced:
                self._check_namespace(rt, namespace or "", meta["name"])
            if self.find(rt, namespace, meta["name"]) is not None:
                raise errors.already_exists(rt.group, rt.plural, meta["name"])
        for volatile in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
            meta.pop(volatile, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now()
        meta["generation"] = 1
        self._prepare_create(rt, obj)
        obj = self._validate(rt, obj, None, opts)
        if track_fields:
            obj["metadata"].pop("managedFields", None)
            record_update(None, obj, opts.manager, self._list_keys(rt), now())
        if opts.dry_run:
            return obj
        stored = self.store.put(rt.storage_key, obj)
        self._after_write(rt, None, stored)
        return stored.obj

    def _check_body(self, rt: ResourceType, namespace: str | None, body: Any, name: str | None) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise errors.bad_request(f"the body of the request must be a {rt.kind} object")
        obj = copy.deepcopy(body)
        if obj.get("kind") not in (None, rt.kind) or obj.get("apiVersion") not in (None, rt.api_version):
            raise errors.bad_request(
                f"the API version in the data ({obj.get('apiVersion')}) does not match the expected API version "
                f"({rt.api_version}) or kind ({obj.get('kind')} vs {rt.kind})"
            )
        obj = {
            "apiVersion": rt.api_version,
            "kind": rt.kind,
            **{k: v for k, v in obj.items() if k not in ("apiVersion", "kind")},
        }
        meta = obj.get("metadata")
        if meta is None:
            meta = obj["metadata"] = {}
        if not isinstance(meta, dict):
            raise errors.bad_request("metadata must be an object")
        check_metadata_types(meta)
        if rt.namespaced:
            if namespace and meta.get("namespace") not in (None, "", namespace):
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace or meta.get("namespace")
            if not meta["namespace"]:
                raise errors.bad_request(f"{rt.plural} are namespaced: a namespace is required")
        else:
            meta.pop("namespace", None)
        if name is not None and meta.get("name") not in (None, name):
            raise errors.bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
            )
        return obj

    def _check_namespace(self, rt: ResourceType, namespace: str, name: str) -> None:
        ns = self.store.collection(NS_KEY).objects.get(("", namespace))
        if ns is None:
            raise errors.not_found("", "namespaces", namespace)
        if ns.obj["metadata"].get("deletionTimestamp"):
            raise errors.forbidden(
                rt.group,
                rt.plural,
                name,
                f'{rt.plural} "{name}" is forbidden: unable to create new content in namespace '
                f"{namespace} because it is being terminated",
            )

    def _prepare_create(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        """Initial status and the built-in defaults the emulator applies."""
        if rt.storage_key == ("", "secrets"):
            obj.setdefault("type", "Opaque")
        if rt.storage_key == NS_KEY:
            obj["status"] = {"phase": "Active"}
            obj.setdefault("spec", {})["finalizers"] = ["kubernetes"]
            obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
        elif rt.storage_key == CRD_KEY:
            obj["status"] = crd_status(obj)
        elif rt.storage_key == ("", "pods"):
            obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        elif rt.storage_key in (("", "persistentvolumes"), ("", "persistentvolumeclaims")):
            obj["status"] = {"phase": "Pending"}
        elif rt.status and rt.storage_key != ("", "nodes"):  # kubelets register nodes with their status
            obj.pop("status", None)
        if rt.storage_key == SVC_KEY and isinstance(obj.get("spec"), dict):
            spec = obj["spec"]
            if spec.get("type") != "ExternalName" and not spec.get("clusterIP"):
                self._service_ips += 1
                spec["clusterIP"] = f"10.96.{self._service_ips // 254}.{self._service_ips % 254 + 1}"
            if spec.get("clusterIP"):
                spec.setdefault("clusterIPs", [spec["clusterIP"]])

    # -- update, patch, apply ------------------------------------------------------------------

    def update(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        opts: WriteOptions | None = None,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        opts = opts or WriteOptions()
        old = self.get(rt, namespace, name)
        if subresource == "scale":
            return self._write_scale(rt, old, body, opts)
        new = self._check_body(rt, namespace, body, name)
        return self._commit(rt, old, new, opts, subresource)

    def patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        patch_type: str,
        body: bytes,
        opts: WriteOptions | None = None,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        opts = opts or WriteOptions()
        if patch_type == APPLY_PATCH:
            return self.apply(rt, namespace, name, body, opts, subresource)
        if patch_type not in PATCH_TYPES or (patch_type == STRATEGIC_PATCH and rt.custom):
            accepted = [t for t in PATCH_TYPES if not (rt.custom and t == STRATEGIC_PATCH)]
            raise errors.unsupported_media_type(patch_type, accepted)
        try:
            patch = json.loads(body)
        except ValueError as exc:
            raise errors.bad_request(f"error decoding patch: {exc}") from None
        old = self.get(rt, namespace, name)
        target: dict[str, Any] = self.scale_of(rt, old.obj) if subresource == "scale" else copy.deepcopy(old.obj)
        if patch_type == MERGE_PATCH:
            if not isinstance(patch, dict):
                raise errors.bad_request("merge patch must be a JSON object")
            new = merge_patch(target, patch)
        elif patch_type == JSON_PATCH:
            new = json_patch(target, patch)
        else:
            new = strategic_merge_patch(target, patch)
        if not isinstance(new, dict):
            raise errors.bad_request("patch result must be an object")
        if subresource == "scale":
            return self._write_scale(rt, old, new, opts)
        new = self._check_body(rt, namespace, new, name)
        return self._commit(rt, old, new, opts, subresource)

    def apply(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: bytes,
        opts: WriteOptions,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        if not opts.manager:
            raise StatusError(
                422,
                "Invalid",
                'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch',
            )
        try:
            config = yaml.safe_load(body)
        except yaml.YAMLError as exc:
            raise errors.bad_request(f"error decoding YAML: {exc}") from None
        if not isinstance(config, dict) or not config.get("apiVersion") or not config.get("kind"):
            raise errors.bad_request("apply patch must be an object with apiVersion and kind")
        config = self._check_body(rt, namespace, config, name)
        config["metadata"]["name"] = name
        old = self.find(rt, namespace, name)
        list_keys = self._list_keys(rt)
        if subresource == "status":
            if old is None:
                raise errors.not_found(rt.group, rt.plural, name)
            new = copy.deepcopy(old.obj)
            new["status"] = merge_patch(new.get("status") or {}, config.get("status") or {})
            return self._commit(rt, old, new, opts, "status")
        if subresource == "scale":
            raise errors.method_not_allowed("apply is not supported on the scale subresource")
        expected_rv = config["metadata"].pop("resourceVersion", None)
        if old is not None and expected_rv not in (None, old.obj["metadata"]["resourceVersion"]):
            raise errors.stale_conflict(rt.group, rt.plural, name)
        merged = server_side_apply(old.obj if old else None, config, opts.manager, opts.force, list_keys, now())
        if old is None:
            return self.create(rt, namespace, merged, opts, track_fields=False)
        return self._commit(rt, old, merged, opts, None, track_fields=False)

    def _commit(
        self,
        rt: ResourceType,
        old: Stored,
        new: dict[str, Any],
        opts: WriteOptions,
        subresource: str | None,
        *,
        track_fields: bool = True,
    ) -> dict[str, Any]:
        """Turn a requested new state into the stored one (preconditions, subresource rules, validation)."""
        old_obj = old.obj
        old_meta, meta = old_obj["metadata"], new["metadata"]
        expected = meta.get("resourceVersion")
        if expected not in (None, "") and expected != old_meta["resourceVersion"]:
            raise errors.stale_conflict(rt.group, rt.plural, old_meta["name"])
        if subresource == "status":
            status = new.get("status")
            new = copy.deepcopy(old_obj)
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
            meta = new["metadata"]
        elif rt.status:
            if "status" in old_obj:
                new["status"] = copy.deepcopy(old_obj["status"])
            else:
                new.pop("status", None)
        if rt.storage_key == SVC_KEY and isinstance(new.get("spec"), dict):  # allocated on create, then immutable
            for allocated in ("clusterIP", "clusterIPs"):
                if allocated in (old_obj.get("spec") or {}):
                    new["spec"].setdefault(allocated, old_obj["spec"][allocated])
        for fixed in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
            if fixed in old_meta:
                meta[fixed] = old_meta[fixed]
            else:
                meta.pop(fixed, None)
        meta["resourceVersion"] = old_meta["resourceVersion"]
        if old_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
            if added:
                raise errors.invalid(
                    rt.group,
                    rt.kind,
                    old_meta["name"],
                    [
                        FieldError(
                            "metadata.finalizers",
                            "Forbidden",
                            f"no new finalizers can be added if the object is being deleted, found new finalizers {sorted(added)!r}",
                        )
                    ],
                )
        if rt.storage_key == CRD_KEY:
            new["status"] = crd_status(new, old_obj.get("status"))
        new = self._validate(rt, new, old_obj, opts)
        if subresource is None and not rt.custom:
            self._check_update(rt, new, old_obj)
        if spec_part(rt, new) != spec_part(rt, old_obj):
            new["metadata"]["generation"] = old_meta.get("generation", 1) + 1
        if track_fields and subresource is None:
            record_update(old_obj, new, opts.manager, self._list_keys(rt), now())
        elif "managedFields" not in new["metadata"] and "managedFields" in old_meta:
            new["metadata"]["managedFields"] = old_meta["managedFields"]
        if without_volatile(new) == without_volatile(old_obj):
            return old_obj
        if opts.dry_run:
            return new
        if (
            new["metadata"].get("deletionTimestamp")
            and not new["metadata"].get("finalizers")
            and not self._has_cleanup(rt)
        ):
            return self._remove(rt, old_obj, new)
        stored = self.store.put(rt.storage_key, new)
        self._after_write(rt, old_obj, stored)
        return stored.obj

    def _validate(
        self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None, opts: WriteOptions
    ) -> dict[str, Any]:
        meta = obj["metadata"]
        problems = metadata_errors(rt, meta)
        unknown: list[str] = []
        if not rt.custom:
            defaults.apply(rt.storage_key, obj)
        if rt.custom:
            replicas_path = rt.scale.spec_replicas_path if rt.scale else None
            obj, schema_errors, unknown = process_custom(rt.schema, obj, old, problems, replicas_path)
            problems += schema_errors
        elif self.builtin_validator is not None and not problems:
            schema_errors, unknown_paths = self.builtin_validator.validate(obj)
            problems += schema_errors
            for path in unknown_paths:
                drop_path(obj, path)
            unknown = [dotted(p) for p in unknown_paths]
        if unknown and opts.field_validation == "Strict":
            raise errors.bad_request("strict decoding error: " + ", ".join(f'unknown field "{u}"' for u in unknown))
        if unknown and opts.field_validation == "Warn":
            opts.warnings.extend(f'unknown field "{u}"' for u in unknown)
        if rt.storage_key == CRD_KEY:
            problems += crd_errors(obj)
        if problems:
            raise errors.invalid(rt.group, rt.kind, meta.get("name", ""), problems)
        return obj

    def _check_update(self, rt: ResourceType, new: dict[str, Any], old: dict[str, Any]) -> None:
        """Immutable parts of built-in specs (422), then the validating admission plugins (403): see `.updates`."""
        problems = update_errors(rt.storage_key, new, old)
        if problems:
            raise errors.invalid(rt.group, rt.kind, old["metadata"]["name"], problems)
        classes = self.resource("storage.k8s.io", "v1", "storageclasses")

        def storage_class(name: str) -> dict[str, Any] | None:
            found = self.find(classes, None, name)
            return found.obj if found else None

        admit_update(rt.storage_key, new, old, storage_class)

    @staticmethod
    def _list_keys(rt: ResourceType) -> ListKeys:
        return schema_list_keys(rt.schema) if rt.custom else builtin_list_keys

    # -- CRDs ----------------------------------------------------------------------------------

    def _register_crd(self, crd: dict[str, Any]) -> None:
        spec = crd["spec"]
        self.registry.remove_group_resource(spec["group"], spec["names"]["plural"])
        for rt in types_from_crd(crd):
            self.registry.add(rt)

    def _unregister_crd(self, crd: dict[str, Any]) -> None:
        spec = crd["spec"]
        self.registry.remove_group_resource(spec["group"], spec["names"]["plural"])
        self.store.drop_collection((spec["group"], spec["names"]["plural"]))

    def _after_write(self, rt: ResourceType, old: dict[str, Any] | None, stored: Stored) -> None:
        meta = stored.obj["metadata"]
        if rt.storage_key == CRD_KEY and not meta.get("deletionTimestamp"):
            self._register_crd(stored.obj)
        # The collector only has work when deletion state changes, or owners change and one of them (before or
        # after) is missing or being deleted.
        old_meta = (old or {}).get("metadata", {})
        owners = [*(meta.get("ownerReferences") or []), *(old_meta.get("ownerReferences") or [])]
        if (meta.get("ownerReferences") != old_meta.get("ownerReferences") and not self._owners_live(owners)) or (
            meta.get("deletionTimestamp") and meta.get("finalizers") != old_meta.get("finalizers")
        ):
            self._wake_gc()

    def _owners_live(self, refs: list[Any]) -> bool:
        """Every owner these references name exists and is not being deleted."""
        for ref in refs:
            owner = self.store.by_uid(ref.get("uid") if isinstance(ref, dict) else None)
            if owner is None or owner.obj["metadata"].get("deletionTimestamp"):
                return False
        return True
