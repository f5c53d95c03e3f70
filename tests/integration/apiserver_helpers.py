"""Helpers for the embedded API server tests (imported by conftest and the test modules)."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import urllib3

HERE = pathlib.Path(__file__).parent
CRDS = HERE / "widgets-crd.yaml"
WIDGETS = "/apis/test.kvtier.io/v1/namespaces/default/widgets"
GADGETS = "/apis/test.kvtier.io/v1/gadgets"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"


class Api:
    """Plain HTTP against the server: `api.get(path)`, `api.post(path, body)`, ...; JSON in and out."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = urllib3.PoolManager()

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> tuple[int, Any, urllib3.HTTPHeaderDict]:
        if isinstance(body, str):
            raw = body.encode()
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        all_headers = {"Content-Type": content_type, **(headers or {})}
        response = self.http.request(method, self.url + path, body=data, headers=all_headers, retries=False, timeout=30)
        text = response.data
        try:
            decoded = json.loads(text) if text else None
        except ValueError:
            decoded = text.decode()
        return response.status, decoded, response.headers

    def get(self, path: str, **kw: Any) -> tuple[int, Any, Any]:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any, **kw: Any) -> tuple[int, Any, Any]:
        return self.request("POST", path, body, **kw)

    def put(self, path: str, body: Any, **kw: Any) -> tuple[int, Any, Any]:
        return self.request("PUT", path, body, **kw)

    def patch(
        self, path: str, body: Any, content_type: str = "application/merge-patch+json", **kw: Any
    ) -> tuple[int, Any, Any]:
        return self.request("PATCH", path, body, content_type=content_type, **kw)

    def delete(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any, Any]:
        return self.request("DELETE", path, body, **kw)

    def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        """Like request(), but asserts a 2xx answer and returns only the decoded body."""
        status, data, _ = self.request(method, path, body, **kw)
        assert 200 <= status < 300, (status, data)
        return data


def widget(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "test.kvtier.io/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"size": "small", **spec},
    }


def configmap(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


class WatchStream:
    """A watch request read on a background thread: `events` fills up as the server sends them."""

    def __init__(self, api: Api, path: str, headers: dict[str, str] | None = None) -> None:
        import queue
        import threading

        self.events: list[dict[str, Any]] = []
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._response = api.http.request(
            "GET", api.url + path, headers=headers, preload_content=False, retries=False, timeout=30
        )
        self.status = self._response.status
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        buffer = b""
        try:
            for chunk in self._response.stream(1024):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        self._queue.put(json.loads(line))
        except Exception:  # the connection was closed under us: the stream simply ends
            pass
        self._queue.put(None)

    def next(self, timeout: float = 5.0) -> dict[str, Any] | None:
        """The next event, or None when the stream ended; raises queue.Empty on timeout."""
        event = self._queue.get(timeout=timeout)
        if event is not None:
            self.events.append(event)
        return event

    def take(self, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        return [self.next(timeout) for _ in range(count)]

    def rest(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        """All remaining events until the stream ends."""
        found = []
        while (event := self.next(timeout)) is not None:
            found.append(event)
        return found

    def close(self) -> None:
        self._response.shutdown()  # unblocks the reader thread without draining the stream
        self._response.release_conn()


def wait_for(predicate: Any, timeout: float = 5.0, interval: float = 0.02) -> Any:
    """Poll until `predicate()` is truthy; return its value or fail."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval)
