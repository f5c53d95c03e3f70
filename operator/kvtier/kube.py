"""A small asyncio Kubernetes client (aiohttp): the verbs kvtier uses, server-side apply included.

Connection settings come from a kubeconfig or the in-cluster service account, resolved by the
`kubernetes` package's own loaders, so TLS, tokens and client certificates work as kubectl's do.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import aiohttp
import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


@dataclass(frozen=True)
class Resource:
    """An API resource: where its objects live."""

    group: str
    version: str
    plural: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        """`/api/v1/namespaces/ns/pods/name/status`; no namespace on a namespaced resource lists all namespaces."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if subresource:
            base += f"/{subresource}"
        return base


NAMESPACES = Resource("", "v1", "namespaces", namespaced=False)
NODES = Resource("", "v1", "nodes", namespaced=False)
PODS = Resource("", "v1", "pods")
SERVICES = Resource("", "v1", "services")
CONFIGMAPS = Resource("", "v1", "configmaps")
SECRETS = Resource("", "v1", "secrets")
EVENTS = Resource("", "v1", "events")
PERSISTENT_VOLUMES = Resource("", "v1", "persistentvolumes", namespaced=False)
PERSISTENT_VOLUME_CLAIMS = Resource("", "v1", "persistentvolumeclaims")
STATEFULSETS = Resource("apps", "v1", "statefulsets")
DEPLOYMENTS = Resource("apps", "v1", "deployments")
JOBS = Resource("batch", "v1", "jobs")
PODDISRUPTIONBUDGETS = Resource("policy", "v1", "poddisruptionbudgets")
STORAGECLASSES = Resource("storage.k8s.io", "v1", "storageclasses", namespaced=False)
CUSTOMRESOURCEDEFINITIONS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)
PODMONITORS = Resource("monitoring.coreos.com", "v1", "podmonitors")
KVPOOLS = Resource("kvtier.io", "v1alpha1", "kvpools", namespaced=False)
INFERENCEDEPLOYMENTS = Resource("kvtier.io", "v1alpha1", "inferencedeployments")


class APIError(Exception):
    """A non-2xx answer; `status` is the HTTP code, `body` the decoded Status (or text)."""

    def __init__(self, status: int, body: Any, method: str, path: str):
        self.status = status
        self.body = body
        reason = body.get("message") if isinstance(body, dict) else str(body)[:200]
        super().__init__(f"{method} {path}: {status} {reason}")

    @property
    def retry_after(self) -> float | None:
        if isinstance(self.body, dict):
            seconds = (self.body.get("details") or {}).get("retryAfterSeconds")
            return float(seconds) if seconds else None
        return None


def load_configuration(path: str | None = None, context: str | None = None) -> k8s_client.Configuration:
    """Connection settings from a kubeconfig (None: $KUBECONFIG or ~/.kube/config), else the in-cluster account."""
    configuration = k8s_client.Configuration()
    try:
        k8s_config.load_kube_config(config_file=path, context=context, client_configuration=configuration)
    except k8s_config.ConfigException:
        if path is not None:
            raise
        k8s_config.load_incluster_config(client_configuration=configuration)
    return configuration


@dataclass(frozen=True)
class Connection:
    server: str
    headers: dict[str, str]
    ssl: ssl.SSLContext | bool

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, context: str | None = None) -> Connection:
        """From a kubeconfig file (None: $KUBECONFIG or ~/.kube/config), else the in-cluster account."""
        configuration = load_configuration(path, context)
        headers = {}
        token = configuration.api_key.get("authorization") or configuration.api_key.get("BearerToken")
        if token:
            headers["Authorization"] = token if token.startswith("Bearer ") else f"Bearer {token}"
        context_ssl: ssl.SSLContext | bool = False
        if configuration.host.startswith("https"):
            context_ssl = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
            if configuration.cert_file:
                context_ssl.load_cert_chain(configuration.cert_file, configuration.key_file)
            if not configuration.verify_ssl:
                context_ssl.check_hostname = False
                context_ssl.verify_mode = ssl.CERT_NONE
        return cls(configuration.host.rstrip("/"), headers, context_ssl)


class KubeClient:
    """`async with KubeClient(connection) as kube:` then `await kube.get(PODS, "ns", "name")`."""

    def __init__(self, connection: Connection, *, user_agent: str = "kvtier"):
        self.connection = connection
        self.user_agent = user_agent
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> KubeClient:
        return await self.open()

    async def open(self) -> KubeClient:
        """Open the connection pool (what `async with` does)."""
        self._session = aiohttp.ClientSession(
            headers={**self.connection.headers, "User-Agent": self.user_agent},
            connector=aiohttp.TCPConnector(ssl=self.connection.ssl, limit=64),
        )
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        assert self._session is not None, "use KubeClient as an async context manager"
        url = self.connection.server + path + (f"?{urlencode(params)}" if params else "")
        data = None
        if body is not None:
            data = yaml.safe_dump(body) if content_type == APPLY_PATCH else json.dumps(body)
        async with self._session.request(method, url, data=data, headers={"Content-Type": content_type}) as reply:
            text = await reply.text()
            try:
                decoded = json.loads(text) if text else None
            except ValueError:
                decoded = text
            if reply.status >= 400:
                raise APIError(reply.status, decoded, method, path)
            return decoded

    async def get(self, resource: Resource, namespace: str | None, name: str) -> dict[str, Any]:
        return await self.request("GET", resource.path(namespace, name))

    async def get_or_none(self, resource: Resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return await self.get(resource, namespace, name)
        except APIError as error:
            if error.status == 404:
                return None
            raise

    async def list(
        self, resource: Resource, namespace: str | None = None, *, label_selector: str | None = None
    ) -> dict[str, Any]:
        params = {"labelSelector": label_selector} if label_selector else None
        return await self.request("GET", resource.path(namespace), params=params)

    async def create(self, resource: Resource, body: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        namespace = namespace or body.get("metadata", {}).get("namespace")
        return await self.request("POST", resource.path(namespace), body)

    async def replace(self, resource: Resource, body: dict[str, Any], subresource: str | None = None) -> Any:
        metadata = body["metadata"]
        return await self.request("PUT", resource.path(metadata.get("namespace"), metadata["name"], subresource), body)

    async def patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        subresource: str | None = None,
        content_type: str = MERGE_PATCH,
    ) -> dict[str, Any]:
        return await self.request(
            "PATCH", resource.path(namespace, name, subresource), patch, content_type=content_type
        )

    async def apply(
        self,
        resource: Resource,
        body: dict[str, Any],
        *,
        field_manager: str = "kvtier",
        force: bool = True,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """Server-side apply: the fields in `body` become `field_manager`'s."""
        metadata = body["metadata"]
        params = {"fieldManager": field_manager, "force": "true" if force else "false"}
        path = resource.path(metadata.get("namespace"), metadata["name"], subresource)
        return await self.request("PATCH", path, body, params=params, content_type=APPLY_PATCH)

    async def delete(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        *,
        propagation: str = "Background",
        grace_period_seconds: int | None = None,
    ) -> dict[str, Any] | None:
        """Delete; a missing object is not an error (returns None)."""
        options: dict[str, Any] = {"propagationPolicy": propagation}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        try:
            return await self.request("DELETE", resource.path(namespace, name), options)
        except APIError as error:
            if error.status == 404:
                return None
            raise

    async def watch(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        timeout_seconds: int = 300,
        label_selector: str | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Watch events (`{"type", "object"}`) until the server ends the stream."""
        assert self._session is not None, "use KubeClient as an async context manager"
        params: dict[str, Any] = {"watch": "true", "timeoutSeconds": timeout_seconds, "allowWatchBookmarks": "true"}
        if resource_version:
            params["resourceVersion"] = resource_version
        if label_selector:
            params["labelSelector"] = label_selector
        url = self.connection.server + resource.path(namespace) + "?" + urlencode(params)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=timeout_seconds + 30)
        async with self._session.get(url, timeout=timeout) as reply:
            if reply.status >= 400:
                raise APIError(reply.status, await reply.text(), "WATCH", resource.path(namespace))
            buffer = b""
            async for chunk in reply.content.iter_any():  # lines may exceed aiohttp's readline limit
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
