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

import asyncio
import copy
import datetime as dt
import json
import logging
import random
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

import yaml

from . import defaults, errors
from .apply import ListKeys, builtin_list_keys, record_update, schema_list_keys, server_side_apply
from .crds import crd_errors
from .errors import FieldError, StatusError
from .patch import json_patch, merge_patch, strategic_merge_patch
from .resources import Registry, ResourceType, types_from_crd
from .schema import BuiltinValidator, dotted, drop_path, name_errors, process_custom
from .selectors import Predicate, selector_to_string
from .store import Key, Store, Stored, encode
from .updates import admit_update, update_errors

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
PATCH_TYPES = [JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, APPLY_PATCH]

_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
_CRD_KEY = ("apiextensions.k8s.io", "customresourcedefinitions")
_NS_KEY = ("", "namespaces")
_SVC_KEY = ("", "services")
_SERVER_FINALIZERS = ("orphan", "foregroundDeletion")


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class WriteOptions:
    """Per-request options of a write (query parameters and derived values)."""

    manager: str = "unknown"
    dry_run: bool = False
    field_validation: str = "Warn"  # Ignore | Warn | Strict
    force: bool = False
    warnings: list[str] = field(default_factory=list)


def _spec_part(rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
    skip = {"metadata", "status"} if rt.status else {"metadata"}
    return {k: v for k, v in obj.items() if k not in skip}


def _set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    parts = [p for p in path.strip(".").split(".") if p]
    node = obj
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _get_path(obj: Any, path: str) -> Any:
    for part in [p for p in path.strip(".").split(".") if p]:
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


_META_TYPES: dict[str, type] = {
    "name": str,
    "generateName": str,
    "namespace": str,
    "uid": str,
    "resourceVersion": str,
    "generation": int,
    "creationTimestamp": str,
    "deletionTimestamp": str,
    "deletionGracePeriodSeconds": int,
    "labels": dict,
    "annotations": dict,
    "finalizers": list,
    "ownerReferences": list,
    "managedFields": list,
}


_GO_TYPES: dict[type, str] = {str: "string", int: "int64", dict: "map[string]string", list: "[]"}


def _json_type(value: Any) -> str:
    """encoding/json's name of a JSON value's type."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), "value")


def _check_metadata_types(meta: dict[str, Any]) -> None:
    """Reject what the real server could not even decode into an ObjectMeta (400)."""
    for key, kind in _META_TYPES.items():
        value = meta.get(key)
        if value is None:
            continue
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if ok and kind is dict:
            ok = all(isinstance(v, str) for v in value.values())
        elif ok and key == "finalizers":
            ok = all(isinstance(v, str) for v in value)
        elif ok and key in ("ownerReferences", "managedFields"):
            ok = all(isinstance(v, dict) for v in value)
        if not ok:
            # As kube-apiserver words it (encoding/json's error on ObjectMeta), found on the real control plane.
            raise errors.bad_request(
                f"json: cannot unmarshal {_json_type(value)} into Go struct field "
                f"ObjectMeta.{key} of type {_GO_TYPES[kind]}"
            )
    for ref in meta.get("ownerReferences") or []:
        if not all(isinstance(ref.get(k), str) for k in ("apiVersion", "kind", "name", "uid")):
            raise errors.bad_request("metadata.ownerReferences: apiVersion, kind, name and uid must be strings")


def _without_volatile(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in obj["metadata"].items() if k not in ("resourceVersion", "managedFields")}
    return {**obj, "metadata": meta}


class Cluster:
    """The emulated API: registry, storage, semantics and the garbage collector."""

    def __init__(self, *, validate_builtins: bool = True, history_size: int = 10_000) -> None:
        self.registry = Registry()
        self.store = Store(history_size)
        self.builtin_validator = BuiltinValidator() if validate_builtins else None
        self._gc_wakeup: asyncio.Event | None = None
        self._gc_task: asyncio.Task[None] | None = None
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
        coll = self.store.collection(rt.storage_key)
        items = [
            s for s in coll.in_namespace(namespace if rt.namespaced else None) if predicate is None or predicate(s.obj)
        ]
        items.sort(key=lambda s: (s.obj["metadata"].get("namespace", ""), s.obj["metadata"]["name"]))
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
        _check_metadata_types(meta)
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
        ns = self.store.collection(_NS_KEY).objects.get(("", namespace))
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
        if rt.storage_key == _NS_KEY:
            obj["status"] = {"phase": "Active"}
            obj.setdefault("spec", {})["finalizers"] = ["kubernetes"]
            obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
        elif rt.storage_key == _CRD_KEY:
            obj["status"] = self._crd_status(obj)
        elif rt.storage_key == ("", "pods"):
            obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        elif rt.storage_key in (("", "persistentvolumes"), ("", "persistentvolumeclaims")):
            obj["status"] = {"phase": "Pending"}
        elif rt.status and rt.storage_key != ("", "nodes"):  # kubelets register nodes with their status
            obj.pop("status", None)
        if rt.storage_key == _SVC_KEY and isinstance(obj.get("spec"), dict):
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
        if rt.storage_key == _SVC_KEY and isinstance(new.get("spec"), dict):  # allocated on create, then immutable
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
        if rt.storage_key == _CRD_KEY:
            new["status"] = self._crd_status(new, old_obj.get("status"))
        new = self._validate(rt, new, old_obj, opts)
        if subresource is None and not rt.custom:
            self._check_update(rt, new, old_obj)
        if _spec_part(rt, new) != _spec_part(rt, old_obj):
            new["metadata"]["generation"] = old_meta.get("generation", 1) + 1
        if track_fields and subresource is None:
            record_update(old_obj, new, opts.manager, self._list_keys(rt), now())
        elif "managedFields" not in new["metadata"] and "managedFields" in old_meta:
            new["metadata"]["managedFields"] = old_meta["managedFields"]
        if _without_volatile(new) == _without_volatile(old_obj):
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
        problems = self._metadata_errors(rt, meta)
        unknown: list[str] = []
        if not rt.custom:
            defaults.apply(rt.storage_key, obj)
        if rt.custom:
            obj, schema_errors, unknown = process_custom(rt.schema, obj, old, problems)
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
        if rt.storage_key == _CRD_KEY:
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
    def _metadata_errors(rt: ResourceType, meta: dict[str, Any]) -> list[FieldError]:
        problems = (
            name_errors(meta["name"], label=rt.storage_key == _NS_KEY)
            if meta.get("name")
            else [FieldError("metadata.name", "Required value", "name or generateName is required")]
        )
        for value in (meta.get("labels") or {}).values():
            if isinstance(value, str) and (
                len(value) > 63 or not re.match(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$", value)
            ):
                problems.append(
                    FieldError(
                        "metadata.labels",
                        "Invalid value",
                        "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.'",
                        value,
                    )
                )
        return problems

    @staticmethod
    def _list_keys(rt: ResourceType) -> ListKeys:
        return schema_list_keys(rt.schema) if rt.custom else builtin_list_keys

    # -- delete --------------------------------------------------------------------------------

    def delete(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        options: dict[str, Any] | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        options = options or {}
        old = self.get(rt, namespace, name)
        obj, meta = old.obj, old.obj["metadata"]
        pre = options.get("preconditions") or {}
        if pre.get("uid") not in (None, meta["uid"]) or pre.get("resourceVersion") not in (
            None,
            meta["resourceVersion"],
        ):
            raise errors.conflict(rt.group, rt.plural, name, "Precondition failed")
        policy = options.get("propagationPolicy") or ("Orphan" if options.get("orphanDependents") else "Background")
        if policy not in ("Background", "Foreground", "Orphan"):
            raise errors.bad_request(f"invalid propagationPolicy {policy!r}")
        finalizers = list(meta.get("finalizers") or [])
        extra = {"Foreground": "foregroundDeletion", "Orphan": "orphan"}.get(policy)
        if extra and extra not in finalizers and not meta.get("deletionTimestamp"):
            finalizers.append(extra)
        if dry_run:
            return obj
        grace = self._grace_seconds(rt, obj, options)
        if grace:  # a running pod: its kubelet stops it, then deletes it with grace 0
            if meta.get("deletionTimestamp") and grace >= meta.get("deletionGracePeriodSeconds", grace):
                return obj
            new = copy.deepcopy(obj)
            new["metadata"].update(deletionTimestamp=now(), deletionGracePeriodSeconds=grace)
            if finalizers:
                new["metadata"]["finalizers"] = finalizers
            return self.store.put(rt.storage_key, new).obj
        if not finalizers and not self._has_cleanup(rt):
            return self._remove(rt, obj, obj)
        if meta.get("deletionTimestamp"):
            return obj
        new = copy.deepcopy(obj)
        new["metadata"].update(
            deletionTimestamp=now(), deletionGracePeriodSeconds=0, generation=meta.get("generation", 1) + 1
        )
        if finalizers:
            new["metadata"]["finalizers"] = finalizers
        if rt.storage_key == _NS_KEY:
            new["status"] = {"phase": "Terminating"}
        stored = self.store.put(rt.storage_key, new)
        self._wake_gc()
        return stored.obj

    @staticmethod
    def _grace_seconds(rt: ResourceType, obj: dict[str, Any], options: dict[str, Any]) -> int:
        """A pod's graceful-deletion period (kube-apiserver's): 0 unless it is bound to a node and not finished."""
        if (rt.group, rt.plural) != ("", "pods"):
            return 0
        spec, phase = obj.get("spec") or {}, (obj.get("status") or {}).get("phase")
        if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
            return 0
        try:
            return max(0, int(options.get("gracePeriodSeconds", spec.get("terminationGracePeriodSeconds", 30))))
        except (TypeError, ValueError):
            raise errors.bad_request("gracePeriodSeconds must be an integer") from None

    @staticmethod
    def _has_cleanup(rt: ResourceType) -> bool:
        """Kinds whose deletion first empties them (namespaces, CRDs), done by the collector."""
        return rt.storage_key in (_NS_KEY, _CRD_KEY)

    def _remove(self, rt: ResourceType, old: dict[str, Any], final: dict[str, Any]) -> dict[str, Any]:
        meta = old["metadata"]
        stored = self.store.remove(rt.storage_key, self._key(rt, meta.get("namespace"), meta["name"]))
        if rt.storage_key == _CRD_KEY:
            self._unregister_crd(old)
        self._wake_gc()
        result = {
            **final,
            "metadata": {
                **final["metadata"],
                "resourceVersion": stored.obj["metadata"]["resourceVersion"] if stored else meta["resourceVersion"],
            },
        }
        return result

    def delete_collection(
        self,
        rt: ResourceType,
        namespace: str | None,
        predicate: Predicate | None,
        options: dict[str, Any] | None = None,
        dry_run: bool = False,
    ) -> list[dict[str, Any]]:
        items, _ = self.list(rt, namespace, predicate)
        return [
            self.delete(rt, s.obj["metadata"].get("namespace"), s.obj["metadata"]["name"], options, dry_run)
            for s in items
        ]

    # -- scale ---------------------------------------------------------------------------------

    def scale_of(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """The autoscaling/v1 Scale view of a scalable object."""
        spec = rt.scale
        if spec is None:
            raise errors.not_found(rt.group, f"{rt.plural}/scale", obj["metadata"]["name"])
        if spec.selector_from_spec:
            selector = selector_to_string(_get_path(obj, ".spec.selector"))
        else:
            selector = _get_path(obj, spec.label_selector_path) if spec.label_selector_path else None
        meta = obj["metadata"]
        scale: dict[str, Any] = {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if k in meta
            },
            "spec": {"replicas": _get_path(obj, spec.spec_replicas_path) or 0},
            "status": {"replicas": _get_path(obj, spec.status_replicas_path) or 0},
        }
        if selector:
            scale["status"]["selector"] = selector
        return scale

    def _write_scale(self, rt: ResourceType, old: Stored, scale: Any, opts: WriteOptions) -> dict[str, Any]:
        if rt.scale is None:
            raise errors.not_found(rt.group, f"{rt.plural}/scale", old.obj["metadata"]["name"])
        replicas = _get_path(scale, ".spec.replicas") if isinstance(scale, dict) else None
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise errors.invalid(
                "autoscaling",
                "Scale",
                old.obj["metadata"]["name"],
                [FieldError("spec.replicas", "Invalid value", "must be greater than or equal to 0", replicas)],
            )
        new = copy.deepcopy(old.obj)
        expected = _get_path(scale, ".metadata.resourceVersion")
        new["metadata"]["resourceVersion"] = expected or old.obj["metadata"]["resourceVersion"]
        _set_path(new, rt.scale.spec_replicas_path, replicas)
        return self.scale_of(rt, self._commit(rt, old, new, opts, None))

    # -- CRDs ----------------------------------------------------------------------------------

    @staticmethod
    def _crd_status(crd: dict[str, Any], old_status: dict[str, Any] | None = None) -> dict[str, Any]:
        spec = crd.get("spec") if isinstance(crd.get("spec"), dict) else {}
        stamp = now()
        previous = {c.get("type"): c for c in (old_status or {}).get("conditions") or []}

        def condition(kind: str, reason: str, message: str) -> dict[str, Any]:
            before = previous.get(kind)
            when = before["lastTransitionTime"] if before and before.get("status") == "True" else stamp
            return {"type": kind, "status": "True", "reason": reason, "message": message, "lastTransitionTime": when}

        versions = spec.get("versions") if isinstance(spec.get("versions"), list) else []
        stored = [
            v["name"] for v in versions if isinstance(v, dict) and v.get("storage") and isinstance(v.get("name"), str)
        ]
        return {
            "acceptedNames": spec.get("names") or {},
            "conditions": [
                condition("NamesAccepted", "NoConflicts", "no conflicts found"),
                condition("Established", "InitialNamesAccepted", "the initial names have been accepted"),
            ],
            "storedVersions": sorted(set((old_status or {}).get("storedVersions", [])) | set(stored)),
        }

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
        if rt.storage_key == _CRD_KEY and not meta.get("deletionTimestamp"):
            self._register_crd(stored.obj)
        # The collector only has work when owners or deletion state change, not on every write.
        old_meta = (old or {}).get("metadata", {})
        if meta.get("ownerReferences") != old_meta.get("ownerReferences") or (
            meta.get("deletionTimestamp") and meta.get("finalizers") != old_meta.get("finalizers")
        ):
            self._wake_gc()

    # -- garbage collection --------------------------------------------------------------------

    def start(self) -> None:
        self._gc_wakeup = asyncio.Event()
        self._gc_task = asyncio.create_task(self._gc_loop(), name="kvtier-apiserver-gc")

    async def stop(self) -> None:
        if self._gc_task:
            self._gc_task.cancel()
            try:
                await self._gc_task
            except asyncio.CancelledError:
                pass
            self._gc_task = None
        for coll in self.store.collections.values():
            for watcher in list(coll.watchers):
                watcher.close()

    def _wake_gc(self) -> None:
        if self._gc_wakeup is not None:
            self._gc_wakeup.set()

    async def _gc_loop(self) -> None:
        assert self._gc_wakeup is not None
        while True:
            await self._gc_wakeup.wait()
            self._gc_wakeup.clear()
            try:
                self.collect_garbage()
            except Exception:  # the collector must survive anything a test throws at it
                log.exception("garbage collection pass failed")
            await asyncio.sleep(0)

    def _all(self) -> list[tuple[ResourceType, Stored]]:
        result = []
        for rt in self.registry.storage_types():
            coll = self.store.collections.get(rt.storage_key)
            if coll:
                result.extend((rt, s) for s in list(coll.objects.values()))
        return result

    def collect_garbage(self) -> None:
        """One pass of the garbage collector and the namespace/CRD cleanup; repeats until stable."""
        for _ in range(100):
            if not self._gc_pass():
                return

    def _gc_pass(self) -> bool:
        everything = self._all()
        alive = {s.obj["metadata"]["uid"] for _, s in everything}
        dependents: dict[str, list[tuple[ResourceType, Stored]]] = {}
        for rt, s in everything:
            for ref in s.obj["metadata"].get("ownerReferences") or []:
                dependents.setdefault(ref.get("uid"), []).append((rt, s))
        changed = False
        for rt, s in everything:
            if self.find(rt, s.obj["metadata"].get("namespace"), s.obj["metadata"]["name"]) is not s:
                continue  # changed earlier in this pass
            meta = s.obj["metadata"]
            refs = meta.get("ownerReferences") or []
            if refs and not meta.get("deletionTimestamp") and not any(r.get("uid") in alive for r in refs):
                self.delete(rt, meta.get("namespace"), meta["name"])
                changed = True
            elif meta.get("deletionTimestamp"):
                changed |= self._finalize(rt, s, dependents.get(meta["uid"], []))
        return changed

    def _finalize(self, rt: ResourceType, s: Stored, dependents: list[tuple[ResourceType, Stored]]) -> bool:
        meta = s.obj["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        if "orphan" in finalizers:
            for drt, d in dependents:
                new = copy.deepcopy(d.obj)
                new["metadata"]["ownerReferences"] = [
                    r for r in new["metadata"]["ownerReferences"] if r.get("uid") != meta["uid"]
                ]
                if not new["metadata"]["ownerReferences"]:
                    del new["metadata"]["ownerReferences"]
                self._commit(drt, d, new, WriteOptions(manager="garbage-collector"), None, track_fields=False)
            finalizers.remove("orphan")
        elif "foregroundDeletion" in finalizers:
            for drt, d in dependents:
                if not d.obj["metadata"].get("deletionTimestamp"):
                    self.delete(
                        drt,
                        d.obj["metadata"].get("namespace"),
                        d.obj["metadata"]["name"],
                        {"propagationPolicy": "Foreground"},
                    )
            if dependents:
                return bool([d for _, d in dependents if not d.obj["metadata"].get("deletionTimestamp")])
            finalizers.remove("foregroundDeletion")
        elif self._has_cleanup(rt):
            return self._cleanup(rt, s)
        else:
            return False
        new = copy.deepcopy(s.obj)
        new["metadata"]["finalizers"] = finalizers
        if not finalizers:
            del new["metadata"]["finalizers"]
        self._commit(rt, s, new, WriteOptions(manager="garbage-collector"), None, track_fields=False)
        return True

    def _cleanup(self, rt: ResourceType, s: Stored) -> bool:
        """Delete the content of a terminating namespace or CRD; remove it once empty and unfinalized."""
        meta = s.obj["metadata"]
        if rt.storage_key == _NS_KEY:
            content = [
                (crt, item)
                for crt in self.registry.storage_types()
                if crt.namespaced
                for item in self.store.collection(crt.storage_key).in_namespace(meta["name"])
            ]
        else:
            key = (s.obj["spec"]["group"], s.obj["spec"]["names"]["plural"])
            content = [
                (crt, item)
                for crt in self.registry.storage_types()
                if crt.storage_key == key
                for item in self.store.collection(crt.storage_key).objects.values()
            ]
        issued = False
        for crt, item in content:
            if not item.obj["metadata"].get("deletionTimestamp"):
                self.delete(crt, item.obj["metadata"].get("namespace"), item.obj["metadata"]["name"])
                issued = True
        if content or meta.get("finalizers"):
            return issued
        self._remove(rt, s.obj, s.obj)
        return True
