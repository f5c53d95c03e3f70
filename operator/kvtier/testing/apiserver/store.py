"""Object storage with one global resourceVersion counter, an event history and watch fan-out.

Objects are plain dicts that are never mutated once stored (writers store a new dict), each kept
with its JSON encoding so lists and watch events are assembled from cached bytes.  Every write
appends a :class:`WatchEvent` to the collection's bounded history; watchers resume from any
resourceVersion still covered by it and get `410 Expired` for older ones.
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

Key = tuple[str, str]  # (namespace or "", name)


def encode(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass
class Stored:
    obj: dict[str, Any]
    raw: bytes
    rv: int

    @classmethod
    def of(cls, obj: dict[str, Any], rv: int) -> Stored:
        return cls(obj, encode(obj), rv)


@dataclass
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED
    rv: int
    new: Stored
    old: Stored | None  # the previous state, for selector transitions


class Watcher:
    """One open watch: a queue fed by the collection, filtered by namespace and selectors."""

    def __init__(self, namespace: str | None, predicate: Callable[[dict[str, Any]], bool] | None) -> None:
        self.namespace = namespace
        self.predicate = predicate
        self.queue: asyncio.Queue[tuple[str, Stored] | None] = asyncio.Queue()
        self.closed = False

    def _selects(self, stored: Stored | None) -> bool:
        if stored is None:
            return False
        if self.namespace and stored.obj["metadata"].get("namespace") != self.namespace:
            return False
        return self.predicate is None or self.predicate(stored.obj)

    def translate(self, event: WatchEvent) -> tuple[str, Stored] | None:
        """The event this watcher sees, following selector transitions like the real cacher."""
        now = self._selects(event.new)
        if event.type == "MODIFIED":
            before = self._selects(event.old)
            if now and before:
                return ("MODIFIED", event.new)
            if now:
                return ("ADDED", event.new)
            if before:
                return ("DELETED", event.new)
            return None
        return (event.type, event.new) if now else None

    def offer(self, event: WatchEvent) -> None:
        if self.closed:
            return
        seen = self.translate(event)
        if seen is not None:
            self.queue.put_nowait(seen)

    def close(self) -> None:
        """End the watch stream (the server side of a dropped connection)."""
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(None)


@dataclass
class Collection:
    """All objects of one group/resource, with their recent history and open watchers.

    Indexed by namespace, with the (namespace, name) order of a namespace (or of everything) kept
    until an object is created or deleted, so a list neither scans other namespaces nor sorts.
    """

    history_size: int
    objects: dict[Key, Stored] = field(default_factory=dict)
    history: collections.deque[WatchEvent] = field(default_factory=collections.deque)
    compacted_rv: int = 0  # events up to this resourceVersion are no longer in history
    watchers: set[Watcher] = field(default_factory=set)
    namespaces: dict[str, dict[str, Stored]] = field(default_factory=dict)
    _order: dict[str, list[Key]] = field(default_factory=dict)  # "" for everything

    def record(self, event: WatchEvent) -> None:
        self.history.append(event)
        while len(self.history) > self.history_size:
            self.compacted_rv = self.history.popleft().rv
        for watcher in list(self.watchers):
            watcher.offer(event)

    def since(self, rv: int) -> Iterator[WatchEvent]:
        for event in self.history:
            if event.rv > rv:
                yield event

    def set(self, key: Key, stored: Stored) -> Stored | None:
        """Store `stored` under `key`; the previous object, if any."""
        old = self.objects.get(key)
        self.objects[key] = stored
        self.namespaces.setdefault(key[0], {})[key[1]] = stored
        if old is None:
            self._order.clear()
        return old

    def pop(self, key: Key) -> Stored | None:
        old = self.objects.pop(key, None)
        if old is not None:
            members = self.namespaces[key[0]]
            del members[key[1]]
            if not members:
                del self.namespaces[key[0]]
            self._order.clear()
        return old

    def in_namespace(self, namespace: str | None) -> Iterable[Stored]:
        if not namespace:
            return self.objects.values()
        return self.namespaces.get(namespace, {}).values()

    def ordered(self, namespace: str | None) -> list[Stored]:
        """The objects of `namespace` (None or "": all), by namespace and name."""
        namespace = namespace or ""
        keys = self._order.get(namespace)
        if keys is None:
            if namespace:
                keys = [(namespace, name) for name in sorted(self.namespaces.get(namespace, {}))]
            else:
                keys = sorted(self.objects)
            self._order[namespace] = keys
        objects = self.objects
        return [objects[key] for key in keys]


class Store:
    """Collections keyed by (group, plural) sharing one resourceVersion counter."""

    def __init__(self, history_size: int = 10_000) -> None:
        self.history_size = history_size
        self.collections: dict[tuple[str, str], Collection] = {}
        self.rv = 1
        self._uids: dict[str, tuple[tuple[str, str], Key]] = {}  # where each uid is stored

    def collection(self, key: tuple[str, str]) -> Collection:
        coll = self.collections.get(key)
        if coll is None:
            coll = self.collections[key] = Collection(self.history_size)
        return coll

    def drop_collection(self, key: tuple[str, str]) -> None:
        coll = self.collections.pop(key, None)
        if coll:
            for watcher in list(coll.watchers):
                watcher.close()

    def next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def put(self, key: tuple[str, str], obj: dict[str, Any]) -> Stored:
        """Store (create or replace) an object, stamping a new resourceVersion."""
        coll = self.collection(key)
        rv = self.next_rv()
        obj["metadata"]["resourceVersion"] = str(rv)
        meta = obj["metadata"]
        okey = (meta.get("namespace", ""), meta["name"])
        stored = Stored.of(obj, rv)
        old = coll.set(okey, stored)
        if isinstance(meta.get("uid"), str):
            self._uids[meta["uid"]] = (key, okey)
        coll.record(WatchEvent("MODIFIED" if old else "ADDED", rv, stored, old))
        return stored

    def remove(self, key: tuple[str, str], okey: Key) -> Stored | None:
        """Delete an object; the DELETED event carries a fresh resourceVersion."""
        coll = self.collection(key)
        old = coll.pop(okey)
        if old is None:
            return None
        self._uids.pop(old.obj["metadata"].get("uid"), None)
        rv = self.next_rv()
        obj = dict(old.obj)
        obj["metadata"] = {**obj["metadata"], "resourceVersion": str(rv)}
        stored = Stored.of(obj, rv)
        coll.record(WatchEvent("DELETED", rv, stored, old))
        return stored

    def by_uid(self, uid: Any) -> Stored | None:
        """The stored object with this uid, if any."""
        where = self._uids.get(uid) if isinstance(uid, str) else None
        coll = self.collections.get(where[0]) if where else None
        stored = coll.objects.get(where[1]) if coll is not None and where else None
        return stored if stored is not None and stored.obj["metadata"].get("uid") == uid else None
