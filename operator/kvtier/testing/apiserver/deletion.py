"""Deletion and garbage collection (the lifecycle rules are in :mod:`.core`'s docstring).

Deletes honour preconditions, finalizers, the propagation policy and a pod's grace period; the
collector, a task woken by writes that change owners or deletion state, deletes dependents whose
owners are gone, runs the `orphan` and `foregroundDeletion` finalizers and empties terminating
namespaces and CRDs.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import TYPE_CHECKING, Any

from . import errors
from .meta import CRD_KEY, NS_KEY, WriteOptions, now
from .resources import Registry, ResourceType
from .selectors import Predicate
from .store import Key, Store, Stored

log = logging.getLogger(__name__)


class Deletion:
    """The :class:`~.core.Cluster`'s deletes and its garbage collector."""

    registry: Registry
    store: Store
    _gc_wakeup: asyncio.Event | None
    _gc_task: asyncio.Task[None] | None

    if TYPE_CHECKING:  # provided by Cluster

        def _key(self, rt: ResourceType, namespace: str | None, name: str) -> Key: ...
        def find(self, rt: ResourceType, namespace: str | None, name: str) -> Stored | None: ...
        def get(self, rt: ResourceType, namespace: str | None, name: str) -> Stored: ...
        def list(
            self, rt: ResourceType, namespace: str | None, predicate: Predicate | None = None
        ) -> tuple[list[Stored], int]: ...
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
        def _unregister_crd(self, crd: dict[str, Any]) -> None: ...

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
        if rt.storage_key == NS_KEY:
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
        return rt.storage_key in (NS_KEY, CRD_KEY)

    def _remove(self, rt: ResourceType, old: dict[str, Any], final: dict[str, Any]) -> dict[str, Any]:
        meta = old["metadata"]
        stored = self.store.remove(rt.storage_key, self._key(rt, meta.get("namespace"), meta["name"]))
        if rt.storage_key == CRD_KEY:
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
        if rt.storage_key == NS_KEY:
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
