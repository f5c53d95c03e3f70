"""Deletion: finalizers, deletionTimestamp, propagation policies, garbage collection, namespaces, CRDs."""

from __future__ import annotations

import yaml
from apiserver_helpers import CONFIGMAPS, CRDS, MERGE, WatchStream, configmap, wait_for, widget


def owner_ref(obj: dict, **extra) -> dict:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        **extra,
    }


def exists(api, path: str) -> bool:
    return api.get(path)[0] == 200


def test_delete_without_finalizers_removes_and_notifies(api):
    created = api.ok("POST", CONFIGMAPS, configmap("a"))
    stream = WatchStream(
        api, f"{CONFIGMAPS}?watch=true&resourceVersion={created['metadata']['resourceVersion']}&timeoutSeconds=5"
    )
    deleted = api.ok("DELETE", f"{CONFIGMAPS}/a")
    assert deleted["metadata"]["name"] == "a"
    assert not exists(api, f"{CONFIGMAPS}/a")
    event = stream.next()
    assert event["type"] == "DELETED" and event["object"]["metadata"]["uid"] == created["metadata"]["uid"]
    assert int(event["object"]["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    stream.close()
    assert api.delete(f"{CONFIGMAPS}/a")[0] == 404


def test_finalizers_hold_deletion_until_removed(api, widgets):
    api.ok("POST", widgets, {**widget("w"), "metadata": {"name": "w", "finalizers": ["test.kvtier.io/hold"]}})
    marked = api.ok("DELETE", f"{widgets}/w")
    assert marked["metadata"]["deletionTimestamp"] and marked["metadata"]["generation"] == 2
    still = api.ok("GET", f"{widgets}/w")
    assert still["metadata"]["deletionTimestamp"] == marked["metadata"]["deletionTimestamp"]
    # Deleting again changes nothing; adding a finalizer while deleting is forbidden.
    assert api.ok("DELETE", f"{widgets}/w")["metadata"]["resourceVersion"] == still["metadata"]["resourceVersion"]
    status, body, _ = api.patch(f"{widgets}/w", {"metadata": {"finalizers": ["test.kvtier.io/hold", "x/y"]}})
    assert status == 422 and body["details"]["causes"][0]["field"] == "metadata.finalizers"
    # Other updates still work while the finalizer holds the object.
    api.ok("PATCH", f"{widgets}/w/status", {"status": {"phase": "Terminating"}}, content_type=MERGE)
    api.ok("PATCH", f"{widgets}/w", {"metadata": {"finalizers": None}}, content_type=MERGE)
    assert not exists(api, f"{widgets}/w")


def test_preconditions_on_delete(api):
    created = api.ok("POST", CONFIGMAPS, configmap("a"))
    status, body, _ = api.delete(f"{CONFIGMAPS}/a", {"preconditions": {"uid": "nope"}})
    assert status == 409 and body["reason"] == "Conflict"
    api.ok("DELETE", f"{CONFIGMAPS}/a", {"preconditions": {"uid": created["metadata"]["uid"]}})


def test_background_garbage_collection_is_transitive(api, widgets):
    owner = api.ok("POST", widgets, widget("owner"))
    child = api.ok(
        "POST", CONFIGMAPS, {**configmap("child"), "metadata": {"name": "child", "ownerReferences": [owner_ref(owner)]}}
    )
    api.ok(
        "POST",
        CONFIGMAPS,
        {**configmap("grandchild"), "metadata": {"name": "grandchild", "ownerReferences": [owner_ref(child)]}},
    )
    other = api.ok("POST", CONFIGMAPS, configmap("other-owner"))
    api.ok(
        "POST",
        CONFIGMAPS,
        {
            **configmap("shared"),
            "metadata": {"name": "shared", "ownerReferences": [owner_ref(owner), owner_ref(other)]},
        },
    )
    api.ok("DELETE", f"{widgets}/owner", {"propagationPolicy": "Background"})
    wait_for(lambda: not exists(api, f"{CONFIGMAPS}/child") and not exists(api, f"{CONFIGMAPS}/grandchild"))
    assert exists(api, f"{CONFIGMAPS}/shared")  # one owner is still alive
    api.ok("DELETE", f"{CONFIGMAPS}/other-owner")
    wait_for(lambda: not exists(api, f"{CONFIGMAPS}/shared"))


def test_dependents_of_a_missing_owner_are_collected(api):
    ghost = {"apiVersion": "v1", "kind": "ConfigMap", "name": "ghost", "uid": "00000000-0000-0000-0000-000000000000"}
    api.ok("POST", CONFIGMAPS, {"metadata": {"name": "orphan", "ownerReferences": [ghost]}})
    wait_for(lambda: not exists(api, f"{CONFIGMAPS}/orphan"))


def test_dependent_finalizers_are_honoured_by_the_collector(api):
    owner = api.ok("POST", CONFIGMAPS, configmap("owner"))
    api.ok(
        "POST", CONFIGMAPS, {"metadata": {"name": "held", "finalizers": ["x/y"], "ownerReferences": [owner_ref(owner)]}}
    )
    api.ok("DELETE", f"{CONFIGMAPS}/owner")
    wait_for(lambda: api.ok("GET", f"{CONFIGMAPS}/held")["metadata"].get("deletionTimestamp"))
    api.ok("PATCH", f"{CONFIGMAPS}/held", {"metadata": {"finalizers": []}}, content_type=MERGE)
    assert not exists(api, f"{CONFIGMAPS}/held")


def test_orphan_propagation_keeps_dependents(api):
    owner = api.ok("POST", CONFIGMAPS, configmap("owner"))
    api.ok("POST", CONFIGMAPS, {"metadata": {"name": "dep", "ownerReferences": [owner_ref(owner)]}})
    api.ok("DELETE", f"{CONFIGMAPS}/owner?propagationPolicy=Orphan")
    wait_for(lambda: not exists(api, f"{CONFIGMAPS}/owner"))
    dep = api.ok("GET", f"{CONFIGMAPS}/dep")
    assert "ownerReferences" not in dep["metadata"]


def test_foreground_propagation_deletes_dependents_first(api):
    owner = api.ok("POST", CONFIGMAPS, configmap("owner"))
    api.ok(
        "POST",
        CONFIGMAPS,
        {
            "metadata": {
                "name": "dep",
                "finalizers": ["x/y"],
                "ownerReferences": [owner_ref(owner, blockOwnerDeletion=True)],
            }
        },
    )
    marked = api.ok("DELETE", f"{CONFIGMAPS}/owner", {"propagationPolicy": "Foreground"})
    assert "foregroundDeletion" in marked["metadata"]["finalizers"]
    wait_for(lambda: api.ok("GET", f"{CONFIGMAPS}/dep")["metadata"].get("deletionTimestamp"))
    assert exists(api, f"{CONFIGMAPS}/owner")  # waits for its dependent
    api.ok("PATCH", f"{CONFIGMAPS}/dep", {"metadata": {"finalizers": None}}, content_type=MERGE)
    wait_for(lambda: not exists(api, f"{CONFIGMAPS}/owner"))


def test_namespace_deletion_empties_the_namespace(api):
    api.ok("POST", "/api/v1/namespaces", {"metadata": {"name": "doomed"}})
    api.ok("POST", "/api/v1/namespaces/doomed/configmaps", configmap("a"))
    api.ok("POST", "/api/v1/namespaces/doomed/configmaps", {"metadata": {"name": "held", "finalizers": ["x/y"]}})
    marked = api.ok("DELETE", "/api/v1/namespaces/doomed")
    assert marked["status"]["phase"] == "Terminating"
    wait_for(lambda: not exists(api, "/api/v1/namespaces/doomed/configmaps/a"))
    status, body, _ = api.post("/api/v1/namespaces/doomed/configmaps", configmap("late"))
    assert status == 403 and "being terminated" in body["message"]
    assert exists(api, "/api/v1/namespaces/doomed")  # the finalizer of `held` keeps it
    api.ok("PATCH", "/api/v1/namespaces/doomed/configmaps/held", {"metadata": {"finalizers": None}}, content_type=MERGE)
    wait_for(lambda: not exists(api, "/api/v1/namespaces/doomed"))


def test_crd_deletion_removes_instances(api, widgets):
    api.ok("POST", widgets, widget("a"))
    api.ok("DELETE", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.test.kvtier.io")
    wait_for(lambda: not exists(api, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.test.kvtier.io"))
    assert api.get(f"{widgets}/a")[0] == 404
    # Recreating the CRD starts empty.
    crd = next(yaml.safe_load_all(CRDS.read_text()))
    api.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    assert api.ok("GET", widgets)["items"] == []


def test_delete_collection(api):
    for name, tier in (("a", "x"), ("b", "x"), ("c", "y")):
        api.ok("POST", CONFIGMAPS, {"metadata": {"name": name, "labels": {"tier": tier}}})
    api.ok("DELETE", f"{CONFIGMAPS}?labelSelector=tier%3Dx")
    assert [i["metadata"]["name"] for i in api.ok("GET", CONFIGMAPS)["items"]] == ["c"]
