"""Real clients against the embedded API server (kubernetes python client, kopf), fault injection
and the request log."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import kopf
import kubernetes
import pytest
import yaml
from apiserver_helpers import CONFIGMAPS, CRDS, WatchStream, configmap, widget

from kvtier.testing.apiserver import APIServer


@pytest.fixture
def k8s(kubeconfig):
    client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
    yield client
    client.close()


def test_kubernetes_python_client(k8s, widgets):
    core = kubernetes.client.CoreV1Api(k8s)
    created = core.create_namespaced_config_map(
        "default",
        kubernetes.client.V1ConfigMap(
            metadata=kubernetes.client.V1ObjectMeta(name="a", labels={"app": "x"}), data={"k": "v"}
        ),
    )
    assert created.metadata.uid and created.metadata.resource_version
    with pytest.raises(kubernetes.client.ApiException) as exists:
        core.create_namespaced_config_map("default", {"metadata": {"name": "a"}})
    assert exists.value.status == 409
    created.data = {"k": "w"}
    core.replace_namespaced_config_map("a", "default", created)
    with pytest.raises(kubernetes.client.ApiException) as stale:
        core.replace_namespaced_config_map("a", "default", created)  # resourceVersion now stale
    assert stale.value.status == 409
    listed = core.list_namespaced_config_map("default", label_selector="app=x")
    assert [c.metadata.name for c in listed.items] == ["a"] and listed.metadata.resource_version

    custom = kubernetes.client.CustomObjectsApi(k8s)
    custom.create_namespaced_custom_object("test.kvtier.io", "v1", "default", "widgets", widget("w"))
    custom.patch_namespaced_custom_object_status(
        "test.kvtier.io", "v1", "default", "widgets", "w", {"status": {"replicas": 1}}
    )
    custom.patch_namespaced_custom_object_scale(
        "test.kvtier.io", "v1", "default", "widgets", "w", {"spec": {"replicas": 4}}
    )
    got = custom.get_namespaced_custom_object("test.kvtier.io", "v1", "default", "widgets", "w")
    assert got["spec"]["replicas"] == 4 and got["status"]["replicas"] == 1

    watch = kubernetes.watch.Watch()
    events = [
        (e["type"], e["object"].metadata.name)
        for e in watch.stream(core.list_namespaced_config_map, "default", timeout_seconds=1)
    ]
    assert events == [("ADDED", "a")]
    core.delete_namespaced_config_map("a", "default")
    with pytest.raises(kubernetes.client.ApiException) as gone:
        core.read_namespaced_config_map("a", "default")
    assert gone.value.status == 404


async def test_kopf_operator_handles_create_and_patches_status():
    """A trivial kopf operator: watch widgets, react to creation, write status, post an event."""
    registry = kopf.OperatorRegistry()
    seen: list[str] = []

    async with APIServer() as server:

        @kopf.on.login(registry=registry)
        def login(**_):
            return kopf.ConnectionInfo(server=server.url, scheme="Bearer", token="test")

        @kopf.on.startup(registry=registry)
        def configure(settings: kopf.OperatorSettings, **_):
            settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="test.kvtier.io")
            settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="test.kvtier.io")
            settings.watching.server_timeout = 10

        @kopf.on.create("test.kvtier.io", "v1", "widgets", registry=registry)
        def created(name, patch, logger, **_):
            seen.append(name)
            patch.status["phase"] = "Ready"
            kopf.info(
                {
                    "apiVersion": "test.kvtier.io/v1",
                    "kind": "Widget",
                    "metadata": {"name": name, "namespace": "default"},
                },
                reason="Created",
                message="hello from kopf",
            )

        async with aiohttp.ClientSession(server.url) as http:
            for crd in yaml.safe_load_all(CRDS.read_text()):
                async with http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd) as r:
                    assert r.status == 201
            stop = asyncio.Event()
            operator = asyncio.create_task(
                kopf.operator(registry=registry, standalone=True, namespaces=["default"], stop_flag=stop)
            )
            async with http.post("/apis/test.kvtier.io/v1/namespaces/default/widgets", json=widget("w")) as r:
                assert r.status == 201
            deadline = time.monotonic() + 20
            status: dict = {}
            while time.monotonic() < deadline:
                async with http.get("/apis/test.kvtier.io/v1/namespaces/default/widgets/w") as r:
                    status = (await r.json()).get("status", {})
                if status.get("phase") == "Ready":
                    break
                await asyncio.sleep(0.1)
            assert status.get("phase") == "Ready" and seen == ["w"]
            while time.monotonic() < deadline:
                async with http.get("/api/v1/namespaces/default/events") as r:
                    events = (await r.json())["items"]
                if events:
                    break
                await asyncio.sleep(0.1)
            assert any(e["reason"] == "Created" and e["involvedObject"]["name"] == "w" for e in events)
            stop.set()
            await asyncio.wait_for(operator, 20)
    verbs = {(r.verb, r.resource, r.subresource) for r in server.requests if r.resource == "widgets"}
    assert ("watch", "widgets", None) in verbs and ("patch", "widgets", "status") in verbs
    assert any(r.user_agent.startswith("kopf") for r in server.requests)


# -- faults and the request log ----------------------------------------------------------------


def test_fault_injection_answers_with_errors_n_times(apiserver, api):
    api.ok("POST", CONFIGMAPS, configmap("a"))
    rule = apiserver.faults.add(verb="patch", resource="configmaps", name="a", status=409, times=2)
    for _ in range(2):
        status, body, _ = api.patch(f"{CONFIGMAPS}/a", {"data": {"x": "1"}})
        assert status == 409 and body["reason"] == "Conflict" and body["kind"] == "Status"
    assert api.patch(f"{CONFIGMAPS}/a", {"data": {"x": "1"}})[0] == 200
    assert rule.hits == 2 and rule.exhausted
    throttle = apiserver.faults.add(verb="list", resource="configmaps", namespace="default", status=429, retry_after=3)
    status, body, headers = api.get(CONFIGMAPS)
    assert status == 429 and headers["Retry-After"] == "3" and body["details"]["retryAfterSeconds"] == 3
    assert body["reason"] == "TooManyRequests" and throttle.hits == 1
    assert api.get("/api/v1/namespaces/kube-system/configmaps")[0] == 200  # other namespace: no match
    apiserver.faults.add(verb="get", resource="configmaps", status=500, times=None)
    assert api.get(f"{CONFIGMAPS}/a")[0] == 500 and api.get(f"{CONFIGMAPS}/a")[0] == 500
    apiserver.faults.clear()
    assert api.get(f"{CONFIGMAPS}/a")[0] == 200


def test_fault_injection_delays_responses(apiserver, api):
    apiserver.faults.add(verb="get", resource="namespaces", name="default", delay=0.5)
    start = time.monotonic()
    assert api.get("/api/v1/namespaces/default")[0] == 200
    assert time.monotonic() - start >= 0.5
    start = time.monotonic()
    api.get("/api/v1/namespaces/default")
    assert time.monotonic() - start < 0.4


def test_fault_injection_drops_watches(apiserver, api):
    apiserver.faults.add(verb="watch", resource="configmaps", drop_watch_after=0.3)
    start = time.monotonic()
    assert WatchStream(api, f"{CONFIGMAPS}?watch=true&resourceVersion=1&timeoutSeconds=30").rest() == []
    assert time.monotonic() - start < 3
    stream = WatchStream(api, f"{CONFIGMAPS}?watch=true&resourceVersion=1&timeoutSeconds=30")
    api.ok("POST", CONFIGMAPS, configmap("a"))
    assert stream.next()["type"] == "ADDED"
    assert apiserver.close_watches("configmaps") == 1
    assert stream.next() is None  # the stream ended


def test_request_log(apiserver, api, widgets):
    apiserver.requests.clear()
    api.ok("POST", widgets, widget("w"))
    api.ok("PATCH", f"{widgets}/w/status", {"status": {"phase": "x"}}, content_type="application/merge-patch+json")
    api.get(f"{widgets}?watch=true&timeoutSeconds=1")
    api.get("/api/v1/nodes")
    api.get("/version")
    records = apiserver.requests.records
    assert [(r.verb, r.group, r.version, r.resource, r.subresource, r.namespace, r.name) for r in records[:4]] == [
        ("create", "test.kvtier.io", "v1", "widgets", None, "default", None),
        ("patch", "test.kvtier.io", "v1", "widgets", "status", "default", "w"),
        ("watch", "test.kvtier.io", "v1", "widgets", None, "default", None),
        ("list", "", "v1", "nodes", None, None, None),
    ]
    assert records[4].verb == "get" and records[4].path == "/version" and records[4].resource is None
    assert all(r.user_agent.startswith("python-urllib3") for r in records)
    assert [r.status for r in records] == [201, 200, 200, 200, 200]
    assert len(apiserver.requests.filter(verb="patch", subresource="status")) == 1
