"""PATCH flavours, server-side apply, and the status and scale subresources."""

from __future__ import annotations

import json

from apiserver_helpers import APPLY, CONFIGMAPS, JSON_PATCH, MERGE, STRATEGIC, configmap, widget

DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
STATEFULSETS = "/apis/apps/v1/namespaces/default/statefulsets"


def deployment(name: str = "web") -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}, "finalizers": ["a.example.com/x"]},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "main:1",
                            "args": ["--a", "--b"],
                            "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                            "ports": [{"containerPort": 80, "name": "http"}],
                        },
                        {"name": "sidecar", "image": "side:1"},
                    ]
                },
            },
        },
    }


def test_json_merge_patch(api):
    api.ok(
        "POST", CONFIGMAPS, {"metadata": {"name": "a", "labels": {"x": "1", "y": "2"}}, "data": {"k": "v", "d": "x"}}
    )
    patched = api.ok(
        "PATCH",
        f"{CONFIGMAPS}/a",
        {"metadata": {"labels": {"y": None, "z": "3"}}, "data": {"d": None}},
        content_type=MERGE,
    )
    assert patched["metadata"]["labels"] == {"x": "1", "z": "3"} and patched["data"] == {"k": "v"}
    assert api.patch(f"{CONFIGMAPS}/missing", {"data": {}})[0] == 404


def test_json_patch(api):
    api.ok("POST", CONFIGMAPS, configmap("a", one="1", two="2"))
    ops = [
        {"op": "test", "path": "/data/one", "value": "1"},
        {"op": "add", "path": "/data/three", "value": "3"},
        {"op": "replace", "path": "/data/one", "value": "uno"},
        {"op": "remove", "path": "/data/two"},
        {"op": "copy", "from": "/data/three", "path": "/data/tres"},
        {"op": "move", "from": "/data/three", "path": "/data/drei"},
        {"op": "add", "path": "/metadata/labels", "value": {"a/b": "c"}},
        {"op": "add", "path": "/metadata/labels/a~1c", "value": "d"},
    ]
    patched = api.ok("PATCH", f"{CONFIGMAPS}/a", ops, content_type=JSON_PATCH)
    assert patched["data"] == {"one": "uno", "tres": "3", "drei": "3"}
    assert patched["metadata"]["labels"] == {"a/b": "c", "a/c": "d"}
    before = patched["metadata"]["resourceVersion"]
    status, body, _ = api.patch(
        f"{CONFIGMAPS}/a",
        json.dumps([{"op": "test", "path": "/data/one", "value": "1"}, {"op": "remove", "path": "/data/tres"}]),
        JSON_PATCH,
    )
    assert status == 422 and body["kind"] == "Status"
    assert api.ok("GET", f"{CONFIGMAPS}/a")["metadata"]["resourceVersion"] == before
    assert api.patch(f"{CONFIGMAPS}/a", json.dumps([{"op": "remove", "path": "/data/nope"}]), JSON_PATCH)[0] == 422


def test_strategic_merge_patch_merges_keyed_lists(api):
    api.ok("POST", DEPLOYMENTS, deployment())
    patch = {
        "metadata": {"finalizers": ["b.example.com/y"]},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "main:2",
                            "args": ["--c"],
                            "env": [
                                {"name": "B", "value": "two"},
                                {"name": "C", "value": "3"},
                                {"name": "A", "$patch": "delete"},
                            ],
                        },
                        {"name": "new", "image": "new:1"},
                    ]
                }
            }
        },
    }
    patched = api.ok("PATCH", f"{DEPLOYMENTS}/web", patch, content_type=STRATEGIC)
    containers = patched["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["main", "sidecar", "new"]
    main = containers[0]
    assert main["image"] == "main:2" and main["args"] == ["--c"]  # args has no merge key: replaced
    assert main["env"] == [{"name": "B", "value": "two"}, {"name": "C", "value": "3"}]
    assert main["ports"] == [{"containerPort": 80, "name": "http", "protocol": "TCP"}]  # untouched fields stay
    assert {"name": "sidecar", "image": "side:1"}.items() <= containers[1].items()
    assert patched["metadata"]["finalizers"] == ["a.example.com/x", "b.example.com/y"]
    assert patched["metadata"]["generation"] == 2
    replaced = api.ok(
        "PATCH",
        f"{DEPLOYMENTS}/web",
        {"spec": {"template": {"spec": {"containers": [{"name": "only", "image": "o:1"}, {"$patch": "replace"}]}}}},
        content_type=STRATEGIC,
    )
    assert [c["name"] for c in replaced["spec"]["template"]["spec"]["containers"]] == ["only"]
    deleted = api.ok(
        "PATCH", f"{DEPLOYMENTS}/web", {"spec": {"strategy": {"$patch": "delete"}}}, content_type=STRATEGIC
    )
    assert deleted["spec"]["strategy"]["type"] == "RollingUpdate"  # removed, then defaulted again like the real server
    cm = api.ok("POST", CONFIGMAPS, {"metadata": {"name": "smp", "labels": {"a": "b"}}})
    cleared = api.ok(
        "PATCH", f"{CONFIGMAPS}/smp", {"metadata": {"labels": {"$patch": "delete"}}}, content_type=STRATEGIC
    )
    assert "labels" not in cleared["metadata"] and cm["metadata"]["labels"] == {"a": "b"}
    # kubectl apply's directives are accepted.
    api.ok(
        "PATCH",
        f"{DEPLOYMENTS}/web",
        {
            "$setElementOrder/finalizers": ["a.example.com/x"],
            "metadata": {"$deleteFromPrimitiveList/finalizers": ["b.example.com/y"]},
        },
        content_type=STRATEGIC,
    )
    assert api.ok("GET", f"{DEPLOYMENTS}/web")["metadata"]["finalizers"] == ["a.example.com/x"]


def test_strategic_merge_patch_is_refused_for_custom_resources(api, widgets):
    api.ok("POST", widgets, widget("w"))
    status, body, _ = api.patch(f"{widgets}/w", {"spec": {"size": "large"}}, STRATEGIC)
    assert status == 415 and body["reason"] == "UnsupportedMediaType"


def _managers(obj: dict) -> dict[str, str]:
    return {e["manager"]: e["operation"] for e in obj["metadata"].get("managedFields", [])}


def test_server_side_apply_creates_updates_and_removes_fields(api, widgets):
    config = {
        "apiVersion": "test.kvtier.io/v1",
        "kind": "Widget",
        "metadata": {"name": "w", "labels": {"a": "1"}},
        "spec": {"size": "small", "code": "abc", "engine": {"env": [{"name": "A", "value": "1"}]}},
    }
    status, created, _ = api.patch(f"{widgets}/w?fieldManager=alice", json.dumps(config), APPLY)
    assert status == 201 and created["spec"]["code"] == "abc" and created["spec"]["replicas"] == 1  # defaulted
    assert _managers(created) == {"alice": "Apply"}
    fields = next(e for e in created["metadata"]["managedFields"] if e["manager"] == "alice")["fieldsV1"]
    assert "f:code" in fields["f:spec"] and fields["f:metadata"]["f:labels"] == {"f:a": {}}
    assert 'k:{"name":"A"}' in fields["f:spec"]["f:engine"]["f:env"]

    # Another manager adds an env entry (list-type map: merged by key) and a label.
    bob = {
        "apiVersion": "test.kvtier.io/v1",
        "kind": "Widget",
        "metadata": {"name": "w", "labels": {"b": "2"}},
        "spec": {"size": "small", "engine": {"env": [{"name": "B", "value": "2"}]}},
    }
    merged = api.ok("PATCH", f"{widgets}/w?fieldManager=bob", json.dumps(bob), content_type=APPLY)
    assert [e["name"] for e in merged["spec"]["engine"]["env"]] == ["A", "B"]
    assert merged["metadata"]["labels"] == {"a": "1", "b": "2"}

    # Alice stops applying `code` and label `a`: they go; `size` is shared with bob and stays.
    config["spec"] = {"size": "small", "engine": {"env": [{"name": "A", "value": "1"}]}}
    config["metadata"]["labels"] = {}
    reapplied = api.ok("PATCH", f"{widgets}/w?fieldManager=alice", json.dumps(config), content_type=APPLY)
    assert "code" not in reapplied["spec"] and reapplied["metadata"]["labels"] == {"b": "2"}
    assert reapplied["spec"]["size"] == "small"
    # Alice drops her env entry: it is removed, bob's stays.
    config["spec"] = {"size": "small"}
    dropped = api.ok("PATCH", f"{widgets}/w?fieldManager=alice", json.dumps(config), content_type=APPLY)
    assert dropped["spec"]["engine"]["env"] == [{"name": "B", "value": "2"}]


def test_server_side_apply_conflicts_and_force(api):
    def apply(manager: str, data: dict, force: bool = False):
        body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": data})
        query = f"?fieldManager={manager}" + ("&force=true" if force else "")
        return api.patch(f"{CONFIGMAPS}/c{query}", body, APPLY)

    assert apply("alice", {"k": "1", "shared": "s"})[0] == 201
    assert apply("bob", {"shared": "s"})[0] == 200  # same value: shared ownership, no conflict
    status, body, _ = apply("bob", {"k": "2"})
    assert status == 409 and body["reason"] == "Conflict"
    assert body["details"]["causes"] == [
        {"reason": "FieldManagerConflict", "message": 'conflict with "alice"', "field": ".data.k"}
    ]
    assert api.ok("GET", f"{CONFIGMAPS}/c")["data"]["k"] == "1"
    status, forced, _ = apply("bob", {"k": "2"}, force=True)
    assert status == 200 and forced["data"]["k"] == "2"
    owners = {e["manager"]: e["fieldsV1"] for e in forced["metadata"]["managedFields"]}
    assert "f:k" in owners["bob"]["f:data"] and "f:k" not in owners["alice"]["f:data"]
    # An update by another manager (merge patch) takes the field; alice re-applying a different value conflicts.
    api.ok("PATCH", f"{CONFIGMAPS}/c?fieldManager=editor", {"data": {"shared": "edited"}}, content_type=MERGE)
    status, body, _ = apply("alice", {"k": "1", "shared": "s"})
    assert status == 409 and {c["message"] for c in body["details"]["causes"]} == {
        'conflict with "bob"',
        'conflict with "editor"',
    }
    # Apply requires a field manager.
    status, body, _ = api.patch(
        f"{CONFIGMAPS}/c", json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}), APPLY
    )
    assert status == 422 and "fieldManager" in body["message"]


def test_status_subresource(api, widgets):
    created = api.ok("POST", widgets, {**widget("w"), "status": {"phase": "Bogus"}})
    assert "status" not in created  # create ignores status when the kind has a status subresource
    with_status = api.ok(
        "PUT", f"{widgets}/w/status", {**created, "spec": {"size": "large"}, "status": {"phase": "Ready"}}
    )
    assert with_status["status"] == {"phase": "Ready"} and with_status["spec"]["size"] == "small"
    main = api.ok("PUT", f"{widgets}/w", {**with_status, "spec": {"size": "medium"}, "status": {"phase": "Hacked"}})
    assert main["status"] == {"phase": "Ready"} and main["spec"]["size"] == "medium"
    patched = api.ok("PATCH", f"{widgets}/w", {"status": {"phase": "Nope"}}, content_type=MERGE)
    assert patched["status"] == {"phase": "Ready"}
    assert api.ok("GET", f"{widgets}/w/status")["status"] == {"phase": "Ready"}
    stale = api.put(f"{widgets}/w/status", {**created, "status": {"phase": "Old"}})
    assert stale[0] == 409
    # Kinds without a status subresource keep status on the main endpoint and have no /status.
    assert api.get("/apis/test.kvtier.io/v1/gadgets/x/status")[0] == 404


def test_scale_subresource_of_custom_resource(api, widgets):
    api.ok("POST", widgets, widget("w", replicas=2))
    api.ok("PATCH", f"{widgets}/w/status", {"status": {"replicas": 1, "selector": "app=w"}}, content_type=MERGE)
    scale = api.ok("GET", f"{widgets}/w/scale")
    assert scale["kind"] == "Scale" and scale["apiVersion"] == "autoscaling/v1"
    assert scale["spec"] == {"replicas": 2} and scale["status"] == {"replicas": 1, "selector": "app=w"}
    updated = api.ok("PUT", f"{widgets}/w/scale", {**scale, "spec": {"replicas": 5}})
    assert updated["spec"]["replicas"] == 5
    assert api.ok("GET", f"{widgets}/w")["spec"]["replicas"] == 5
    patched = api.ok("PATCH", f"{widgets}/w/scale", {"spec": {"replicas": 7}}, content_type=MERGE)
    assert patched["spec"]["replicas"] == 7 and api.ok("GET", f"{widgets}/w")["metadata"]["generation"] == 3
    assert api.put(f"{widgets}/w/scale", {**scale, "spec": {"replicas": 1}})[0] == 409  # stale resourceVersion
    assert api.patch(f"{widgets}/w/scale", {"spec": {"replicas": -1}})[0] == 422
    assert api.patch(f"{widgets}/w/scale", {"spec": {"replicas": 101}})[0] == 422  # the CRD's maximum


def test_scale_subresource_of_statefulset(api):
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "db"},
        "spec": {
            "replicas": 1,
            "serviceName": "db",
            "selector": {
                "matchLabels": {"app": "db"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}],
            },
            "template": {
                "metadata": {"labels": {"app": "db", "tier": "a"}},
                "spec": {"containers": [{"name": "db", "image": "db:1"}]},
            },
        },
    }
    api.ok("POST", STATEFULSETS, sts)
    scale = api.ok("GET", f"{STATEFULSETS}/db/scale")
    assert scale["spec"]["replicas"] == 1 and scale["status"]["selector"] == "app=db,tier in (a,b)"
    api.ok("PATCH", f"{STATEFULSETS}/db/scale", {"spec": {"replicas": 3}}, content_type=MERGE)
    assert api.ok("GET", f"{STATEFULSETS}/db")["spec"]["replicas"] == 3
    api.ok("PATCH", f"{STATEFULSETS}/db/status", {"status": {"replicas": 3, "readyReplicas": 2}}, content_type=MERGE)
    assert api.ok("GET", f"{STATEFULSETS}/db/scale")["status"]["replicas"] == 3
    assert api.get(f"{CONFIGMAPS}/x/scale")[0] == 404
