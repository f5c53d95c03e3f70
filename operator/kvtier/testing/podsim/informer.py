"""The pod simulator's reads: informers (list once, then watch) instead of a LIST of everything on every pass.

:class:`Informer` keeps one resource's objects current from a watch (a fresh list only when the watch
cannot resume, as client-go's reflector does). :class:`CachedClient` is the simulator's API client: its
`list` answers from a synced informer (in the API server's namespace/name order), and the objects its
own writes return are put in the cache at once, so a pass never acts on a state older than its own
last write. Everything else (gets, deletes, resources without an informer) goes to the API server.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp

from kvtier.kube import APIError, KubeClient, Resource

log = logging.getLogger(__name__)

Key = tuple[str, str]


def _key(obj: dict[str, Any]) -> Key:
    meta = obj["metadata"]
    return meta.get("namespace") or "", meta["name"]


def _rv(obj: dict[str, Any]) -> int:
    try:
        return int(obj["metadata"].get("resourceVersion") or 0)
    except ValueError:  # resourceVersions are opaque; both API servers here count up
        return 0


class Informer:
    """One resource's objects, kept current by a watch; `changed` is called after every change."""

    def __init__(self, kube: KubeClient, resource: Resource, changed: Callable[[], None]) -> None:
        self.kube = kube
        self.resource = resource
        self.changed = changed
        self.objects: dict[Key, dict[str, Any]] = {}
        self._gone: dict[Key, int] = {}  # deleted keys and the resourceVersion of their deletion
        self.synced = False
        self.relists = 0

    def offer(self, obj: dict[str, Any]) -> None:
        """Take `obj` unless the cache holds a newer state of it (or saw it deleted later)."""
        key, rv = _key(obj), _rv(obj)
        current = self.objects.get(key)
        if (current is not None and _rv(current) >= rv) or self._gone.get(key, -1) >= rv:
            return
        self.objects[key] = obj
        self._gone.pop(key, None)

    def items(self, namespace: str | None = None) -> list[dict[str, Any]]:
        keys = sorted(k for k in self.objects if not namespace or k[0] == namespace)
        return [self.objects[k] for k in keys]

    def _apply(self, event: dict[str, Any]) -> None:
        obj = event["object"]
        if event["type"] == "DELETED":
            key = _key(obj)
            self.objects.pop(key, None)
            self._gone[key] = _rv(obj)
        else:
            self.offer(obj)

    async def _list(self) -> str:
        listing = await self.kube.list(self.resource)
        self.objects = {_key(obj): obj for obj in listing["items"]}
        self._gone.clear()
        self.relists += 1
        self.synced = True
        self.changed()
        return str(listing["metadata"]["resourceVersion"])

    async def run(self) -> None:
        rv: str | None = None
        while True:
            try:
                if rv is None:
                    rv = await self._list()
                async for event in self._events(rv):
                    if event["type"] == "ERROR":  # 410 Expired: the history no longer reaches rv
                        rv = None
                        break
                    rv = str(event["object"]["metadata"]["resourceVersion"])
                    if event["type"] != "BOOKMARK":
                        self._apply(event)
                        self.changed()
            except (TimeoutError, APIError, aiohttp.ClientError) as error:
                log.debug("pod simulator watch of %s ended: %s", self.resource.plural, error)
                if isinstance(error, APIError) and error.status == 410:
                    rv = None
                await asyncio.sleep(0.5)

    def _events(self, rv: str) -> AsyncIterator[dict[str, Any]]:
        return self.kube.watch(self.resource, resource_version=rv, timeout_seconds=60)


class CachedClient:
    """A :class:`KubeClient` whose lists come from informers and whose writes refresh them."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.informers: dict[tuple[str, str], Informer] = {}

    def inform(self, resource: Resource, changed: Callable[[], None]) -> Informer:
        informer = Informer(self.kube, resource, changed)
        self.informers[(resource.group, resource.plural)] = informer
        return informer

    def _synced(self, resource: Resource) -> Informer | None:
        informer = self.informers.get((resource.group, resource.plural))
        return informer if informer is not None and informer.synced else None

    def _wrote(self, resource: Resource, result: Any) -> Any:
        informer = self._synced(resource)
        if informer is not None and isinstance(result, dict) and result.get("kind") not in (None, "Status"):
            informer.offer(result)
        return result

    async def list(
        self, resource: Resource, namespace: str | None = None, *, label_selector: str | None = None
    ) -> dict[str, Any]:
        informer = self._synced(resource)
        if informer is None or label_selector:
            return await self.kube.list(resource, namespace, label_selector=label_selector)
        return {"items": informer.items(namespace if resource.namespaced else None)}

    async def create(self, resource: Resource, body: dict[str, Any], namespace: str | None = None) -> Any:
        return self._wrote(resource, await self.kube.create(resource, body, namespace))

    async def patch(self, resource: Resource, namespace: str | None, name: str, patch: Any, **kwargs: Any) -> Any:
        return self._wrote(resource, await self.kube.patch(resource, namespace, name, patch, **kwargs))

    async def replace(self, resource: Resource, body: dict[str, Any], subresource: str | None = None) -> Any:
        return self._wrote(resource, await self.kube.replace(resource, body, subresource))

    async def apply(self, resource: Resource, body: dict[str, Any], **kwargs: Any) -> Any:
        return self._wrote(resource, await self.kube.apply(resource, body, **kwargs))

    def __getattr__(self, name: str) -> Any:  # get, get_or_none, delete, watch, request: straight through
        return getattr(self.kube, name)
