"""Conformance of the embedded API server: discovery, CRUD, resourceVersions, list and watch."""

from __future__ import annotations

import asyncio
import queue
import time
import urllib.parse

import aiohttp
import pytest
from apiserver_helpers import CONFIGMAPS, GADGETS, JSON_PATCH, MERGE, Api, WatchStream, configmap, wait_for, widget

from kvtier.testing.apiserver import APIServer, ThreadedAPIServer

# -- discovery ---------------------------------------------------------------------------------


def test_discovery_documents(api):
    version = api.ok("GET", "/version")
    assert version["major"] == "1" and version["gitVersion"].startswith("v1.")
    assert api.ok("GET", "/api")["versions"] == ["v1"]
    core = {r["name"]: r for r in api.ok("GET", "/api/v1")["resources"]}
    for name in (
        "namespaces",
        "pods",
        "pods/status",
        "services",
        "configmaps",
        "secrets",
        "events",
        "persistentvolumes",
        "persistentvolumeclaims",
        "nodes",
        "serviceaccounts",
        "endpoints",
    ):
        assert name in core, name
    assert core["pods"]["namespaced"] and not core["nodes"]["namespaced"] and not core["namespaces"]["namespaced"]
    assert "watch" in core["pods"]["verbs"]
    groups = {g["name"]: g for g in api.ok("GET", "/apis")["groups"]}
    for group in (
        "apps",
        "policy",
        "storage.k8s.io",
        "coordination.k8s.io",
        "apiextensions.k8s.io",
        "rbac.authorization.k8s.io",
        "autoscaling",
        "events.k8s.io",
    ):
        assert group in groups, group
    assert groups["autoscaling"]["preferredVersion"]["version"] == "v2"
    apps = {r["name"]: r for r in api.ok("GET", "/apis/apps/v1")["resources"]}
    assert apps["statefulsets/scale"]["kind"] == "Scale" and apps["statefulsets/scale"]["group"] == "autoscaling"
    assert apps["deployments"]["shortNames"] == ["deploy"]
    assert api.ok("GET", "/apis/apps")["preferredVersion"]["groupVersion"] == "apps/v1"
    assert api.get("/apis/nope.example.com/v1")[0] == 404


def test_discovery_follows_crds(api, widgets):
    group = {r["name"]: r for r in api.ok("GET", "/apis/test.kvtier.io/v1")["resources"]}
    assert group["widgets"]["namespaced"] and not group["gadgets"]["namespaced"]
    assert group["widgets"]["shortNames"] == ["wdg"] and group["widgets"]["categories"] == ["kvtier-test"]
    assert {"widgets/status", "widgets/scale"} <= set(group) and "gadgets/status" not in group
    assert "test.kvtier.io" in {g["name"] for g in api.ok("GET", "/apis")["groups"]}
    crd = api.ok("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.test.kvtier.io")
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions == {"NamesAccepted": "True", "Established": "True"}
    assert crd["status"]["acceptedNames"]["kind"] == "Widget" and crd["status"]["storedVersions"] == ["v1"]

    for name in ("widgets", "gadgets"):
        api.ok("DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}.test.kvtier.io")
    wait_for(lambda: api.get("/apis/test.kvtier.io/v1")[0] == 404)
    assert "test.kvtier.io" not in {g["name"] for g in api.ok("GET", "/apis")["groups"]}


def test_default_namespaces_exist(api):
    names = {ns["metadata"]["name"] for ns in api.ok("GET", "/api/v1/namespaces")["items"]}
    assert {"default", "kube-system"} <= names
    ns = api.ok("GET", "/api/v1/namespaces/default")
    assert ns["status"]["phase"] == "Active"


# -- create, get, update -----------------------------------------------------------------------


def test_create_sets_server_fields(api):
    created = api.ok("POST", CONFIGMAPS, configmap("a", k="v"))
    meta = created["metadata"]
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z") and meta["generation"] == 1
    assert int(meta["resourceVersion"]) > 0 and meta["namespace"] == "default"
    assert created["kind"] == "ConfigMap" and created["apiVersion"] == "v1"
    assert api.ok("GET", f"{CONFIGMAPS}/a") == created

    generated = api.ok("POST", CONFIGMAPS, {"metadata": {"generateName": "cm-"}, "data": {}})
    assert generated["metadata"]["name"].startswith("cm-") and len(generated["metadata"]["name"]) == 8
    second = api.ok("POST", CONFIGMAPS, {"metadata": {"generateName": "cm-"}, "data": {}})
    assert int(second["metadata"]["resourceVersion"]) > int(generated["metadata"]["resourceVersion"])
    assert second["metadata"]["uid"] != generated["metadata"]["uid"]


def test_already_exists_and_not_found_are_status_objects(api):
    api.ok("POST", CONFIGMAPS, configmap("a"))
    status, body, _ = api.post(CONFIGMAPS, configmap("a"))
    assert status == 409
    assert body["kind"] == "Status" and body["status"] == "Failure" and body["reason"] == "AlreadyExists"
    assert body["code"] == 409 and body["details"]["name"] == "a" and body["details"]["kind"] == "configmaps"
    status, body, _ = api.get(f"{CONFIGMAPS}/missing")
    assert status == 404 and body["reason"] == "NotFound" and body["message"] == 'configmaps "missing" not found'
    status, body, _ = api.post("/api/v1/namespaces/nowhere/configmaps", configmap("a"))
    assert status == 404 and body["details"]["name"] == "nowhere"
    assert api.post(CONFIGMAPS, {"metadata": {}})[0] == 422
    assert api.post(CONFIGMAPS, configmap("Bad_Name"))[0] == 422


def test_bad_input_never_crashes_the_server(api):
    for raw in (b"{not json", b"[1, 2", b"\xff\xfe", b""):
        status, body, _ = api.request("POST", CONFIGMAPS, raw=raw)
        assert status == 400 and body["kind"] == "Status", raw
    protobuf = "application/vnd.kubernetes.protobuf"
    for raw in (b"not protobuf", b"k8s\x00\xff\xff", b"k8s\x00\x0a\x04\x0a\x02\xff\xfe\x12\x01\x01"):
        status, body, _ = api.request("POST", CONFIGMAPS, raw=raw, content_type=protobuf)
        assert status == 415 and body["reason"] == "UnsupportedMediaType", raw
    api.ok("POST", CONFIGMAPS, configmap("a"))
    assert api.patch(f"{CONFIGMAPS}/a", "{oops", MERGE)[0] == 400
    assert api.patch(f"{CONFIGMAPS}/a", "[1]", MERGE)[0] == 400
    assert api.patch(f"{CONFIGMAPS}/a", '{"op": "add"}', JSON_PATCH)[0] == 400
    assert api.patch(f"{CONFIGMAPS}/a?fieldManager=t", ": : :", "application/apply-patch+yaml")[0] == 400
    assert api.request("DELETE", f"{CONFIGMAPS}/a", raw=b"nope")[0] == 400
    assert api.get("/api/v1/namespaces/default/nothings")[0] == 404
    assert api.get(f"{CONFIGMAPS}/a/b/c/d")[0] == 404
    assert api.get(CONFIGMAPS + "?labelSelector=a%20in%20(b")[0] == 400
    assert api.get(CONFIGMAPS + "?watch=true&resourceVersion=abc")[0] == 400
    assert api.get(CONFIGMAPS + "?watch=true&timeoutSeconds=abc")[0] == 400
    assert api.get(CONFIGMAPS + "?limit=abc")[0] == 400
    assert api.get(CONFIGMAPS + "?limit=1&continue=bm9wZQ")[0] == 400
    assert api.ok("GET", f"{CONFIGMAPS}/a")["metadata"]["name"] == "a"  # still serving


def test_update_with_stale_resource_version_conflicts(api):
    created = api.ok("POST", CONFIGMAPS, configmap("a", k="1"))
    updated = api.ok("PUT", f"{CONFIGMAPS}/a", {**created, "data": {"k": "2"}})
    assert int(updated["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    status, body, _ = api.put(f"{CONFIGMAPS}/a", {**created, "data": {"k": "3"}})
    assert status == 409 and body["reason"] == "Conflict"
    assert "the object has been modified" in body["message"]
    # A PUT without resourceVersion is unconditional; a PUT for a missing object is 404.
    unconditional = {**created, "metadata": {"name": "a"}, "data": {"k": "4"}}
    assert api.ok("PUT", f"{CONFIGMAPS}/a", unconditional)["data"] == {"k": "4"}
    assert api.put(f"{CONFIGMAPS}/zz", configmap("zz"))[0] == 404
    assert api.put(f"{CONFIGMAPS}/a", configmap("other"))[0] == 400
    # A patch carrying a stale resourceVersion is a precondition too.
    stale = {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]}, "data": {"k": "5"}}
    assert api.patch(f"{CONFIGMAPS}/a", stale)[0] == 409


def test_uid_and_creation_timestamp_are_immutable(api):
    created = api.ok("POST", CONFIGMAPS, configmap("a"))
    tampered = {
        **created,
        "metadata": {**created["metadata"], "uid": "x", "creationTimestamp": "2000-01-01T00:00:00Z"},
        "data": {"n": "1"},
    }
    updated = api.ok("PUT", f"{CONFIGMAPS}/a", tampered)
    assert updated["metadata"]["uid"] == created["metadata"]["uid"]
    assert updated["metadata"]["creationTimestamp"] == created["metadata"]["creationTimestamp"]


def test_generation_moves_on_spec_changes_only(api, widgets):
    created = api.ok("POST", widgets, widget("w"))
    assert created["metadata"]["generation"] == 1
    labelled = api.ok("PATCH", f"{widgets}/w", {"metadata": {"labels": {"a": "b"}}}, content_type=MERGE)
    assert labelled["metadata"]["generation"] == 1
    assert int(labelled["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    status = api.ok("PATCH", f"{widgets}/w/status", {"status": {"phase": "Ready"}}, content_type=MERGE)
    assert status["metadata"]["generation"] == 1 and status["status"]["phase"] == "Ready"
    spec = api.ok("PATCH", f"{widgets}/w", {"spec": {"size": "large"}}, content_type=MERGE)
    assert spec["metadata"]["generation"] == 2
    # A write that changes nothing keeps the resourceVersion.
    again = api.ok("PATCH", f"{widgets}/w", {"spec": {"size": "large"}}, content_type=MERGE)
    assert again["metadata"]["resourceVersion"] == spec["metadata"]["resourceVersion"]


def test_cluster_scoped_resources(api, widgets):
    gadget = {
        "apiVersion": "test.kvtier.io/v1",
        "kind": "Gadget",
        "metadata": {"name": "g", "namespace": "x", "labels": {"a": "b"}},
        "spec": {"capacity": "1Ti"},
    }
    created = api.ok("POST", GADGETS, gadget)
    assert "namespace" not in created["metadata"] and created["metadata"]["labels"] == {"a": "b"}
    assert api.get("/apis/test.kvtier.io/v1/namespaces/default/gadgets/g")[0] == 404
    assert api.ok("GET", f"{GADGETS}/g")["spec"]["capacity"] == "1Ti"
    node = api.ok("POST", "/api/v1/nodes", {"metadata": {"name": "n1"}, "status": {"capacity": {"cpu": "8"}}})
    assert node["kind"] == "Node" and "namespace" not in node["metadata"]
    assert node["status"] == {"capacity": {"cpu": "8"}}  # nodes register with their status
    pvc = api.ok(
        "POST",
        "/api/v1/namespaces/default/persistentvolumeclaims",
        {
            "metadata": {"name": "c"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
            "status": {"phase": "Bound"},
        },
    )
    assert pvc["status"] == {"phase": "Pending"}
    # Namespaced kinds have no cluster-wide item path.
    assert api.get("/api/v1/configmaps/x")[0] == 404


def test_builtin_defaults_and_service_ips(api):
    svc = api.ok(
        "POST",
        "/api/v1/namespaces/default/services",
        {"metadata": {"name": "s"}, "spec": {"selector": {"app": "a"}, "ports": [{"port": 80}]}},
    )
    assert svc["spec"]["type"] == "ClusterIP" and svc["spec"]["clusterIP"].startswith("10.96.")
    assert svc["spec"]["clusterIPs"] == [svc["spec"]["clusterIP"]]
    assert svc["spec"]["ports"] == [{"port": 80, "protocol": "TCP", "targetPort": 80}]
    other = api.ok(
        "POST", "/api/v1/namespaces/default/services", {"metadata": {"name": "t"}, "spec": {"ports": [{"port": 1}]}}
    )
    assert other["spec"]["clusterIP"] != svc["spec"]["clusterIP"]
    replaced = api.ok(
        "PUT", "/api/v1/namespaces/default/services/s", {"metadata": {"name": "s"}, "spec": {"ports": [{"port": 81}]}}
    )
    assert replaced["spec"]["clusterIP"] == svc["spec"]["clusterIP"]  # allocated once
    sts = api.ok(
        "POST",
        "/apis/apps/v1/namespaces/default/statefulsets",
        {
            "metadata": {"name": "db"},
            "spec": {
                "serviceName": "db",
                "selector": {"matchLabels": {"app": "db"}},
                "template": {
                    "metadata": {"labels": {"app": "db"}},
                    "spec": {"containers": [{"name": "db", "image": "db"}, {"name": "x", "image": "x:1.0"}]},
                },
            },
        },
    )
    spec = sts["spec"]
    assert spec["replicas"] == 1 and spec["podManagementPolicy"] == "OrderedReady"
    assert spec["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}
    pod_spec = spec["template"]["spec"]
    assert pod_spec["restartPolicy"] == "Always" and pod_spec["dnsPolicy"] == "ClusterFirst"
    assert [c["imagePullPolicy"] for c in pod_spec["containers"]] == ["Always", "IfNotPresent"]


# -- list --------------------------------------------------------------------------------------


def test_list_shape_and_cross_namespace(api):
    api.ok("POST", "/api/v1/namespaces", {"metadata": {"name": "other"}})
    api.ok("POST", CONFIGMAPS, configmap("a"))
    last = api.ok("POST", "/api/v1/namespaces/other/configmaps", configmap("b"))
    listed = api.ok("GET", CONFIGMAPS)
    assert listed["kind"] == "ConfigMapList" and listed["apiVersion"] == "v1"
    assert int(listed["metadata"]["resourceVersion"]) >= int(last["metadata"]["resourceVersion"])
    assert [i["metadata"]["name"] for i in listed["items"]] == ["a"]
    everywhere = api.ok("GET", "/api/v1/configmaps")
    assert {(i["metadata"]["namespace"], i["metadata"]["name"]) for i in everywhere["items"]} == {
        ("default", "a"),
        ("other", "b"),
    }
    sts = api.ok("GET", "/apis/apps/v1/statefulsets")
    assert sts["kind"] == "StatefulSetList" and sts["apiVersion"] == "apps/v1" and sts["items"] == []


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("tier=gpu", {"a", "b"}),
        ("tier==gpu", {"a", "b"}),
        ("tier!=gpu", {"c", "d"}),
        ("tier in (gpu, cpu)", {"a", "b", "c"}),
        ("tier notin (gpu)", {"c", "d"}),
        ("zone", {"a", "c"}),
        ("!zone", {"b", "d"}),
        ("tier=gpu,zone", {"a"}),
        ("tier=gpu,zone=x,!missing", {"a"}),
    ],
)
def test_label_selectors(api, selector, expected):
    labels = {"a": {"tier": "gpu", "zone": "x"}, "b": {"tier": "gpu"}, "c": {"tier": "cpu", "zone": "y"}, "d": {}}
    for name, lbl in labels.items():
        api.ok("POST", CONFIGMAPS, {"metadata": {"name": name, "labels": lbl}})
    found = api.ok("GET", f"{CONFIGMAPS}?labelSelector={urllib.parse.quote(selector)}")
    assert {i["metadata"]["name"] for i in found["items"]} == expected


def test_field_selectors(api):
    api.ok("POST", "/api/v1/namespaces", {"metadata": {"name": "other"}})
    for ns in ("default", "other"):
        for name in ("a", "b"):
            api.ok("POST", f"/api/v1/namespaces/{ns}/configmaps", configmap(name))

    def names(query: str) -> set[tuple[str, str]]:
        items = api.ok("GET", f"/api/v1/configmaps?fieldSelector={query}")["items"]
        return {(i["metadata"]["namespace"], i["metadata"]["name"]) for i in items}

    assert names("metadata.name=a") == {("default", "a"), ("other", "a")}
    assert names("metadata.namespace=other,metadata.name!=a") == {("other", "b")}
    assert names("metadata.namespace==default") == {("default", "a"), ("default", "b")}
    status, body, _ = api.get("/api/v1/configmaps?fieldSelector=data.x=1")
    assert status == 400 and "field label not supported" in body["message"]


def test_list_pagination(api):
    for i in range(7):
        api.ok("POST", CONFIGMAPS, configmap(f"cm-{i}"))
    page = api.ok("GET", f"{CONFIGMAPS}?limit=3")
    seen = [i["metadata"]["name"] for i in page["items"]]
    assert len(seen) == 3 and page["metadata"]["remainingItemCount"] == 4
    while page["metadata"].get("continue"):
        page = api.ok("GET", f"{CONFIGMAPS}?limit=3&continue={page['metadata']['continue']}")
        seen += [i["metadata"]["name"] for i in page["items"]]
    assert seen == [f"cm-{i}" for i in range(7)]


# -- watch -------------------------------------------------------------------------------------


def test_watch_replays_from_resource_version(api):
    first = api.ok("POST", CONFIGMAPS, configmap("a", v="1"))
    rv = first["metadata"]["resourceVersion"]
    api.ok("PATCH", f"{CONFIGMAPS}/a", {"data": {"v": "2"}}, content_type=MERGE)
    api.ok("POST", CONFIGMAPS, configmap("b"))
    api.ok("DELETE", f"{CONFIGMAPS}/b")
    events = WatchStream(api, f"{CONFIGMAPS}?watch=true&resourceVersion={rv}&timeoutSeconds=1").rest()
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("MODIFIED", "a"),
        ("ADDED", "b"),
        ("DELETED", "b"),
    ]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs) and rvs[0] > int(rv)
    assert events[0]["object"]["data"] == {"v": "2"}


def test_watch_without_resource_version_starts_with_current_state(api):
    api.ok("POST", CONFIGMAPS, configmap("a"))
    api.ok("POST", CONFIGMAPS, configmap("b"))
    stream = WatchStream(api, f"{CONFIGMAPS}?watch=1&timeoutSeconds=5")
    assert stream.status == 200
    initial = stream.take(2)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in initial] == [("ADDED", "a"), ("ADDED", "b")]
    api.ok("PATCH", f"{CONFIGMAPS}/a", {"data": {"x": "y"}}, content_type=MERGE)
    live = stream.next()
    assert live["type"] == "MODIFIED" and live["object"]["data"] == {"x": "y"}
    stream.close()


def test_watch_follows_label_selector_transitions(api):
    api.ok("POST", CONFIGMAPS, {"metadata": {"name": "a", "labels": {"app": "x"}}})
    rv = api.ok("GET", CONFIGMAPS)["metadata"]["resourceVersion"]
    stream = WatchStream(api, f"{CONFIGMAPS}?watch=true&labelSelector=app%3Dy&resourceVersion={rv}&timeoutSeconds=5")
    api.ok("POST", CONFIGMAPS, {"metadata": {"name": "b", "labels": {"app": "x"}}})  # never seen
    api.ok("PATCH", f"{CONFIGMAPS}/a", {"metadata": {"labels": {"app": "y"}}}, content_type=MERGE)
    api.ok("PATCH", f"{CONFIGMAPS}/a", {"data": {"k": "v"}}, content_type=MERGE)
    api.ok("PATCH", f"{CONFIGMAPS}/a", {"metadata": {"labels": {"app": "z"}}}, content_type=MERGE)
    events = stream.take(3)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "a"),
        ("MODIFIED", "a"),
        ("DELETED", "a"),
    ]
    with pytest.raises(queue.Empty):
        stream.next(timeout=0.3)
    stream.close()


def test_watch_field_selector_and_all_namespaces(api):
    api.ok("POST", "/api/v1/namespaces", {"metadata": {"name": "other"}})
    stream = WatchStream(
        api, "/api/v1/configmaps?watch=true&fieldSelector=metadata.name%3Dwanted&timeoutSeconds=5&resourceVersion=1"
    )
    api.ok("POST", "/api/v1/namespaces/other/configmaps", configmap("unwanted"))
    api.ok("POST", "/api/v1/namespaces/other/configmaps", configmap("wanted"))
    api.ok("POST", CONFIGMAPS, configmap("wanted"))
    events = stream.take(2)
    assert [e["object"]["metadata"]["namespace"] for e in events] == ["other", "default"]
    stream.close()


def test_watch_timeout_seconds_ends_the_stream(api):
    start = time.monotonic()
    events = WatchStream(api, f"{CONFIGMAPS}?watch=true&resourceVersion=1&timeoutSeconds=1").rest()
    assert events == [] and 0.9 < time.monotonic() - start < 5


def test_watch_too_old_resource_version_is_410():
    with ThreadedAPIServer(history_size=3) as server:
        api = Api(server.url)
        first = api.ok("POST", CONFIGMAPS, configmap("a"))
        for i in range(5):
            api.ok("PATCH", f"{CONFIGMAPS}/a", {"data": {"i": str(i)}}, content_type=MERGE)
        events = WatchStream(
            api, f"{CONFIGMAPS}?watch=true&resourceVersion={first['metadata']['resourceVersion']}"
        ).rest()
        assert len(events) == 1 and events[0]["type"] == "ERROR"
        status = events[0]["object"]
        assert status["kind"] == "Status" and status["code"] == 410 and status["reason"] == "Expired"
        # A resourceVersion still in the window replays fine.
        latest = api.ok("GET", CONFIGMAPS)["metadata"]["resourceVersion"]
        assert WatchStream(api, f"{CONFIGMAPS}?watch=true&resourceVersion={latest}&timeoutSeconds=1").rest() == []
        # An exact list at a compacted resourceVersion is gone too.
        code, body, _ = api.get(
            f"{CONFIGMAPS}?resourceVersion={first['metadata']['resourceVersion']}&resourceVersionMatch=Exact"
        )
        assert code == 410 and body["reason"] == "Expired"


def test_watch_bookmarks_and_initial_events():
    with ThreadedAPIServer(bookmark_interval=0.2) as server:
        api = Api(server.url)
        api.ok("POST", CONFIGMAPS, configmap("a"))
        stream = WatchStream(
            api,
            f"{CONFIGMAPS}?watch=true&allowWatchBookmarks=true&sendInitialEvents=true"
            "&resourceVersionMatch=NotOlderThan&timeoutSeconds=1",
        )
        events = stream.rest()
        assert events[0]["type"] == "ADDED"
        assert events[1]["type"] == "BOOKMARK"
        assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
        assert sum(e["type"] == "BOOKMARK" for e in events) >= 3  # periodic ones follow
        assert all(e["object"]["kind"] == "ConfigMap" for e in events)


async def test_a_client_going_away_ends_its_watch():
    async with APIServer() as server, aiohttp.ClientSession(server.url) as http:
        watchers = server.cluster.store.collection(("", "configmaps")).watchers
        response = await http.get(f"{CONFIGMAPS}?watch=true")
        for _ in range(100):
            if watchers:
                break
            await asyncio.sleep(0.01)
        assert len(watchers) == 1
        response.close()
        for _ in range(100):
            if not watchers:
                break
            await asyncio.sleep(0.01)
        assert not watchers
