"""The HTTP face of the emulator: routing, request parsing, list/watch streaming, faults, logging.

Paths follow the real server: `/api/v1/...` and `/apis/{group}/{version}/...`, then
`[namespaces/{ns}/]{resource}[/{name}[/{subresource}]]`.  Lists are answered from the current state
(any `resourceVersion` is treated as NotOlderThan; `resourceVersionMatch=Exact` of an older
version and continue tokens older than the history window answer 410); `limit`/`continue` paginate
by name.  Request bodies are JSON or YAML (protobuf only for the kinds :mod:`.protobuf` knows);
responses are always JSON, which every client accepts.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import yaml
from aiohttp import web

from . import errors, openapi, protobuf, table
from .core import APPLY_PATCH, Cluster, WriteOptions
from .errors import StatusError
from .faults import FaultInjector, FaultRule, RequestLog, RequestRecord
from .resources import ResourceType
from .selectors import Predicate, combine, parse_field_selector, parse_label_selector
from .store import Stored, Watcher, encode

log = logging.getLogger(__name__)

KUBERNETES_VERSION = {
    "major": "1",
    "minor": "37",
    "gitVersion": "v1.37.0-kvtier",
    "gitCommit": "kvtier-embedded",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.25",
    "compiler": "gc",
    "platform": "linux/amd64",
}
JSON = "application/json"
DEFAULT_WATCH_TIMEOUT = 1800.0


@dataclass
class Route:
    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None


def _json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=encode(data), status=status, content_type=JSON, headers=headers)


def _status_response(error: StatusError) -> web.Response:
    headers = {"Retry-After": str(int(error.retry_after))} if error.retry_after is not None else None
    return _json_response(error.to_status(), error.code, headers)


def _number(query: Any, name: str, default: float, kind: type) -> Any:
    """A numeric query parameter; 400 when it is not a number."""
    text = query.get(name)
    if not text:
        return default
    try:
        return kind(text)
    except ValueError:
        raise errors.bad_request(f"invalid value for {name}: {text!r}") from None


def _flag(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


class APIHandler:
    """aiohttp request handler bound to one :class:`~.core.Cluster`."""

    def __init__(
        self, cluster: Cluster, faults: FaultInjector, requests: RequestLog, bookmark_interval: float = 60.0
    ) -> None:
        self.cluster = cluster
        self.faults = faults
        self.requests = requests
        self.bookmark_interval = bookmark_interval
        self.server_address = "127.0.0.1:0"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    # -- dispatch ------------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        record = RequestRecord(
            verb=request.method.lower(),
            path=request.path,
            user_agent=request.headers.get("User-Agent", ""),
            query=dict(request.query),
            content_type=request.headers.get("Content-Type", ""),
        )
        self.requests.append(record)
        try:
            route = self._route(request, record)
            fault = self.faults.take(record)
            if fault is not None:
                if fault.delay:
                    await asyncio.sleep(fault.delay)
                if fault.status is not None:
                    raise StatusError(
                        fault.status,
                        fault.status_reason,
                        fault.message or f"injected fault: {fault.status_reason}",
                        retry_after=fault.retry_after,
                    )
            if route is None:
                response = self._non_resource(request)
            else:
                response = await self._resource(request, route, record, fault)
        except StatusError as exc:
            response = _status_response(exc)
        except Exception as exc:  # never let a bad request take the server down
            log.exception("internal error serving %s %s", request.method, request.path_qs)
            response = _status_response(StatusError(500, "InternalError", f"internal error: {exc!r}"))
        record.status = response.status
        return response

    def _route(self, request: web.Request, record: RequestRecord) -> Route | None:
        """Resolve a resource path (None for non-resource paths); fills in the request record."""
        segs = [s for s in request.path.split("/") if s]
        if len(segs) >= 3 and segs[0] == "api":
            group, version, rest = "", segs[1], segs[2:]
        elif len(segs) >= 4 and segs[0] == "apis":
            group, version, rest = segs[1], segs[2], segs[3:]
        else:
            return None
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces" and not (len(rest) == 3 and rest[2] == "status"):
            namespace, rest = rest[1], rest[2:]
        if len(rest) > 3:
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        plural, name, sub = rest[0], rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None
        record.group, record.version, record.resource = group, version, plural
        record.namespace, record.name, record.subresource = namespace, name, sub
        method = request.method
        if method == "GET":
            record.verb = "get" if name else ("watch" if _flag(request.query.get("watch")) else "list")
        else:
            record.verb = {
                "POST": "create",
                "PUT": "update",
                "PATCH": "patch",
                "DELETE": "delete" if name else "deletecollection",
            }.get(method, method.lower())
        rt = self.cluster.resource(group, version, plural)
        if namespace is not None and not rt.namespaced:
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        if rt.namespaced and namespace is None and (name or method == "POST"):
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        if (
            sub not in (None, "status", "scale")
            or (sub == "status" and not rt.status)
            or (sub == "scale" and not rt.scale)
        ):
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        return Route(rt, namespace, name, sub)

    def _non_resource(self, request: web.Request) -> web.Response:
        path = request.path.rstrip("/") or "/"
        registry = self.cluster.registry
        if request.method != "GET":
            raise errors.method_not_allowed()
        if path == "/version":
            return _json_response(KUBERNETES_VERSION)
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        if path == "/api":
            return _json_response(registry.api_versions(self.server_address))
        if path == "/apis":
            return _json_response(registry.group_list())
        if path == "/openapi/v3":
            return _json_response(openapi.index(registry, KUBERNETES_VERSION["gitVersion"]))
        segs = [s for s in path.split("/") if s]
        doc: Any = None
        if segs[:2] == ["openapi", "v3"] and len(segs) in (4, 5):
            group, version = (segs[3], segs[4]) if segs[2] == "apis" and len(segs) == 5 else ("", segs[3])
            doc = openapi.group_version_document(registry, group, version, KUBERNETES_VERSION["gitVersion"])
        elif len(segs) == 2 and segs[0] == "api":
            doc = registry.resource_list("", segs[1])
        elif len(segs) == 2 and segs[0] == "apis":
            group_doc = registry.group_document(segs[1])
            doc = {"kind": "APIGroup", "apiVersion": "v1", **group_doc} if group_doc else None
        elif len(segs) == 3 and segs[0] == "apis":
            doc = registry.resource_list(segs[1], segs[2])
        if doc is None:
            raise StatusError(404, "NotFound", "the server could not find the requested resource")
        return _json_response(doc)

    # -- resources -----------------------------------------------------------------------------

    async def _resource(
        self, request: web.Request, route: Route, record: RequestRecord, fault: FaultRule | None
    ) -> web.StreamResponse:
        verb = record.verb
        if verb == "watch":
            return await self._watch(request, route, fault)
        if verb == "list":
            return self._list(request, route)
        if verb == "get":
            return self._get(request, route)
        if verb in ("create", "update", "patch"):
            response = await self._write(request, route, verb)
            if verb == "patch" and response.status == 201:
                # A patch that creates (server-side apply of a new object) is authorized as `create` too,
                # as kube-apiserver does: the audit sees both checks.
                self.requests.append(dataclasses.replace(record, verb="create", status=201))
            return response
        if verb in ("delete", "deletecollection"):
            return await self._delete(request, route, verb)
        raise errors.method_not_allowed()

    def _wants_table(self, request: web.Request) -> bool:
        return "as=Table" in request.headers.get("Accept", "")

    def _get(self, request: web.Request, route: Route) -> web.Response:
        stored = self.cluster.get(route.rt, route.namespace, route.name or "")
        if route.subresource == "scale":
            return _json_response(self.cluster.scale_of(route.rt, stored.obj))
        if self._wants_table(request):
            obj = json.loads(self.cluster.render(route.rt, stored))
            return _json_response(
                table.table(route.rt, [obj], str(stored.rv), request.query.get("includeObject", "Metadata"))
            )
        return web.Response(body=self.cluster.render(route.rt, stored), content_type=JSON)

    @staticmethod
    def _predicate(request: web.Request, rt: ResourceType) -> Predicate | None:
        return combine(
            parse_label_selector(request.query.get("labelSelector")),
            parse_field_selector(request.query.get("fieldSelector"), rt.plural),
        )

    def _list(self, request: web.Request, route: Route) -> web.Response:
        rt, query = route.rt, request.query
        coll = self.cluster.store.collection(rt.storage_key)
        requested = query.get("resourceVersion", "")
        if (
            query.get("resourceVersionMatch") == "Exact"
            and requested.isdigit()
            and int(requested) != self.cluster.store.rv
            and int(requested) <= coll.compacted_rv
        ):
            raise errors.gone(f"too old resource version: {requested} ({coll.compacted_rv + 1})")
        items, rv = self.cluster.list(rt, route.namespace, self._predicate(request, rt))
        list_meta: dict[str, Any] = {"resourceVersion": str(rv)}
        token = query.get("continue")
        if token:
            try:
                state = json.loads(base64.urlsafe_b64decode(token.encode()))
                start = tuple(state["start"])
                token_rv = int(state["rv"])
            except (ValueError, KeyError, TypeError):
                raise errors.bad_request("invalid continue token") from None
            if token_rv < coll.compacted_rv:
                raise errors.gone("The provided continue parameter is too old to display a consistent list result.")
            items = [s for s in items if (s.obj["metadata"].get("namespace", ""), s.obj["metadata"]["name"]) > start]
        limit = _number(query, "limit", 0, int)
        if 0 < limit < len(items):
            last = items[limit - 1].obj["metadata"]
            state = {"rv": rv, "start": [last.get("namespace", ""), last["name"]]}
            list_meta["continue"] = base64.urlsafe_b64encode(json.dumps(state).encode()).decode()
            list_meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        if self._wants_table(request):
            objects = [json.loads(self.cluster.render(rt, s)) for s in items]
            body = table.table(
                rt,
                objects,
                str(rv),
                query.get("includeObject", "Metadata"),
                {k: v for k, v in list_meta.items() if k != "resourceVersion"},
            )
            return _json_response(body)
        head = encode({"kind": rt.list_kind, "apiVersion": rt.api_version, "metadata": list_meta})
        payload = head[:-1] + b',"items":[' + b",".join(self.cluster.render(rt, s) for s in items) + b"]}"
        return web.Response(body=payload, content_type=JSON)

    def _parse(self, raw: bytes, content_type: str) -> Any:
        if "protobuf" in content_type:
            try:
                return protobuf.decode(raw)
            except protobuf.ProtobufError:
                raise errors.unsupported_media_type(content_type, [JSON, "application/yaml"]) from None
        try:
            if "yaml" in content_type:
                return yaml.safe_load(raw)
            return json.loads(raw, parse_int=_json_int)
        except (ValueError, yaml.YAMLError) as exc:
            raise errors.bad_request(f"the request body could not be decoded: {exc}") from None

    def _options(self, request: web.Request) -> WriteOptions:
        query = request.query
        manager = query.get("fieldManager") or ""
        if not manager and request.content_type != APPLY_PATCH:  # apply needs an explicit manager
            manager = request.headers.get("User-Agent", "").split("/")[0] or "unknown"
        validation = query.get("fieldValidation") or "Warn"
        if validation not in ("Ignore", "Warn", "Strict"):
            raise errors.bad_request(f"fieldValidation must be one of Ignore, Warn, Strict, got {validation!r}")
        return WriteOptions(
            manager=manager,
            dry_run=bool(query.get("dryRun")),
            field_validation=validation,
            force=_flag(query.get("force")),
        )

    async def _write(self, request: web.Request, route: Route, verb: str) -> web.Response:
        raw = await request.read()
        opts = self._options(request)
        rt, cluster = route.rt, self.cluster
        status = 200
        if verb == "create":
            if route.name:
                raise errors.method_not_allowed()
            result = cluster.create(rt, route.namespace, self._parse(raw, request.content_type), opts)
            status = 201
        elif verb == "update":
            result = cluster.update(
                rt, route.namespace, route.name or "", self._parse(raw, request.content_type), opts, route.subresource
            )
        else:
            if request.content_type == APPLY_PATCH and cluster.find(rt, route.namespace, route.name or "") is None:
                status = 201
            result = cluster.patch(
                rt, route.namespace, route.name or "", request.content_type, raw, opts, route.subresource
            )
        if result.get("apiVersion") != rt.api_version and result.get("kind") == rt.kind:
            result = {**result, "apiVersion": rt.api_version}
        response = _json_response(result, status)
        for warning in opts.warnings:
            response.headers.add("Warning", '299 - "' + warning.replace('"', '\\"') + '"')
        return response

    async def _delete(self, request: web.Request, route: Route, verb: str) -> web.Response:
        raw = await request.read()
        options = self._parse(raw, JSON) if raw.strip() else {}
        if not isinstance(options, dict):
            raise errors.bad_request("DeleteOptions must be an object")
        for key in ("propagationPolicy", "gracePeriodSeconds"):
            if key in request.query:
                options.setdefault(key, request.query[key])
        dry_run = bool(request.query.get("dryRun") or options.get("dryRun"))
        if verb == "delete":
            result = self.cluster.delete(route.rt, route.namespace, route.name or "", options, dry_run)
            return _json_response(result)
        items = self.cluster.delete_collection(
            route.rt, route.namespace, self._predicate(request, route.rt), options, dry_run
        )
        return _json_response(
            {
                "kind": route.rt.list_kind,
                "apiVersion": route.rt.api_version,
                "metadata": {"resourceVersion": str(self.cluster.store.rv)},
                "items": items,
            }
        )

    # -- watch ---------------------------------------------------------------------------------

    def _event_bytes(self, request: web.Request, rt: ResourceType, kind: str, stored: Stored, as_table: bool) -> bytes:
        if as_table:
            obj = json.loads(self.cluster.render(rt, stored))
            body = encode(table.table(rt, [obj], str(stored.rv), request.query.get("includeObject", "Metadata")))
        else:
            body = self.cluster.render(rt, stored)
        return b'{"type":"' + kind.encode() + b'","object":' + body + b"}\n"

    def _bookmark(self, rt: ResourceType, initial_end: bool = False) -> bytes:
        meta: dict[str, Any] = {"resourceVersion": str(self.cluster.store.rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return (
            encode({"type": "BOOKMARK", "object": {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}})
            + b"\n"
        )

    async def _watch(self, request: web.Request, route: Route, fault: FaultRule | None) -> web.StreamResponse:
        rt, query = route.rt, request.query
        predicate = self._predicate(request, rt)
        as_table = self._wants_table(request)
        bookmarks = _flag(query.get("allowWatchBookmarks"))
        timeout = _number(query, "timeoutSeconds", DEFAULT_WATCH_TIMEOUT, float)
        if fault is not None and fault.drop_watch_after is not None:
            timeout = min(timeout, fault.drop_watch_after)
        coll = self.cluster.store.collection(rt.storage_key)
        watcher = Watcher(route.namespace if rt.namespaced else None, predicate)
        requested = query.get("resourceVersion", "")
        initial: list[bytes] = []
        # Everything up to registering the watcher is synchronous: no event can slip in between.
        if requested in ("", "0") or _flag(query.get("sendInitialEvents")):
            items, _ = self.cluster.list(rt, watcher.namespace, predicate)
            initial = [self._event_bytes(request, rt, "ADDED", s, as_table) for s in items]
            if _flag(query.get("sendInitialEvents")):
                initial.append(self._bookmark(rt, initial_end=True))
        elif not requested.isdigit():
            raise errors.bad_request(f"invalid resourceVersion {requested!r}")
        elif int(requested) < coll.compacted_rv:
            message = f"too old resource version: {requested} ({coll.compacted_rv + 1})"
            initial = [encode({"type": "ERROR", "object": errors.gone(message).to_status()}) + b"\n"]
            watcher.close()
        else:
            for event in coll.since(int(requested)):
                seen = watcher.translate(event)
                if seen:
                    initial.append(self._event_bytes(request, rt, seen[0], seen[1], as_table))
        if not watcher.closed:
            coll.watchers.add(watcher)
        response = web.StreamResponse(headers={"Content-Type": JSON, "Cache-Control": "no-cache, private"})
        try:
            await response.prepare(request)
            if initial:
                await response.write(b"".join(initial))
            deadline = time.monotonic() + timeout
            next_bookmark = time.monotonic() + self.bookmark_interval
            while not watcher.closed:
                now = time.monotonic()
                wait = deadline - now
                if bookmarks:
                    wait = min(wait, next_bookmark - now)
                if wait <= 0:
                    if now >= deadline:
                        break
                    await response.write(self._bookmark(rt))
                    next_bookmark = now + self.bookmark_interval
                    continue
                try:
                    async with asyncio.timeout(wait):  # not wait_for: on 3.11 it can swallow a cancellation
                        item = await watcher.queue.get()
                except TimeoutError:
                    continue
                chunks = []
                while item is not None:
                    chunks.append(self._event_bytes(request, rt, item[0], item[1], as_table))
                    if watcher.queue.empty():
                        break
                    item = watcher.queue.get_nowait()
                if chunks:
                    await response.write(b"".join(chunks))
                if item is None:
                    break
        except ConnectionResetError:
            pass
        finally:
            watcher.closed = True
            coll.watchers.discard(watcher)
        return response


def _json_int(text: str) -> int | float:
    """A JSON integer as the API server decodes it into an object: int64, else float64."""
    value = int(text)
    if -(2**63) <= value < 2**63:
        return value
    try:
        return float(value)
    except OverflowError:  # beyond float64: Go's decoder refuses the body too
        raise ValueError(f"number {text[:20]}... is out of range") from None
