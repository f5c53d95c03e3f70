"""When the InferenceDeployment controller applies a child again, and when it leaves it alone."""

from __future__ import annotations

import copy

from kvtier.controllers.children import DIGEST_ANNOTATION, Applied, annotated, digest, project

KEY = ("ns", "d", "Service", "ns", "d")


def service(port: int = 80) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "d", "namespace": "ns", "labels": {"kvtier.io/deployment": "d"}},
        "spec": {"selector": {"app": "d"}, "ports": [{"name": "http", "port": port}]},
    }


def served(child: dict, resource_version: str = "7", **changes) -> dict:
    """`child` as the API server returns it: defaults and server fields added."""
    body = copy.deepcopy(child)
    body["metadata"].update(
        resourceVersion=resource_version, uid="u", labels={**body["metadata"]["labels"], "other": "x"}
    )
    body["spec"]["ports"][0]["protocol"] = "TCP"
    body["spec"]["clusterIP"] = "10.0.0.1"
    body["status"] = {"loadBalancer": {}}
    body["spec"].update(changes)
    return body


def test_the_digest_is_of_the_rendered_manifest_and_lands_in_an_annotation():
    child = annotated(service())
    assert child["metadata"]["annotations"][DIGEST_ANNOTATION] == digest(service())
    assert digest(service()) != digest(service(81))
    assert DIGEST_ANNOTATION not in service()["metadata"].get("annotations", {}), "the input is not mutated"


def test_the_projection_keeps_only_the_rendered_fields():
    child = service()
    assert project(served(child), child) == child
    assert project(served(child, selector={"app": "other"}), child)["spec"]["selector"] == {"app": "other"}


def test_a_missing_or_changed_child_is_applied_and_an_unchanged_one_is_not():
    applied = Applied()
    child = annotated(service())
    assert applied.needs_apply(KEY, child, None), "missing"
    applied.applied(KEY, child, served(child))
    assert not applied.needs_apply(KEY, child, served(child)), "as applied, server fields aside"
    changed = annotated(service(81))
    assert applied.needs_apply(KEY, changed, served(child)), "a new rendering"


def test_drift_of_an_owned_field_is_applied_again_but_not_status_or_foreign_fields():
    applied = Applied()
    child = annotated(service())
    applied.applied(KEY, child, served(child))
    moved = served(child)
    moved["status"] = {"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}}
    moved["metadata"]["labels"]["someone-elses"] = "y"
    moved["metadata"]["resourceVersion"] = "8"
    assert not applied.needs_apply(KEY, child, moved)
    assert applied.needs_apply(KEY, child, served(child, "9", selector={"app": "hijacked"}))


def test_an_object_at_the_resource_version_last_compared_is_not_projected_again(monkeypatch):
    from kvtier.controllers import children

    applied = Applied()
    child = annotated(service())
    applied.applied(KEY, child, served(child))
    projected = []
    seen = children._seen
    monkeypatch.setattr(children, "_seen", lambda child, observed: projected.append(1) or seen(child, observed))
    assert not applied.needs_apply(KEY, child, served(child))
    assert projected == [], "the same resourceVersion is the same object"
    moved = served(child, "8")
    moved["status"] = {"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}}
    assert not applied.needs_apply(KEY, child, moved) and projected == [1]
    assert not applied.needs_apply(KEY, child, moved) and projected == [1], "version 8 is remembered"
    assert applied.needs_apply(KEY, child, served(child, "10", selector={"app": "hijacked"}))


def test_a_restarted_operator_trusts_the_annotation_and_then_watches_for_drift():
    child = annotated(service())
    restarted = Applied()
    assert not restarted.needs_apply(KEY, child, served(child)), "coming back applies nothing unchanged"
    assert restarted.needs_apply(KEY, child, served(child, "8", selector={"app": "hijacked"})), "drift from then on"
    stale = served(annotated(service(81)))
    assert Applied().needs_apply(KEY, child, stale), "an object rendered from another spec"


def test_forgetting_a_deployment_drops_only_its_records():
    applied = Applied()
    child = annotated(service())
    other = ("ns", "e", "Service", "ns", "e")
    applied.applied(KEY, child, served(child))
    applied.applied(other, child, served(child))
    applied.forget("ns", "d")
    drifted = served(child, "8", selector={"app": "hijacked"})
    assert not applied.needs_apply(KEY, child, drifted), "no record: the annotation is trusted again"
    assert applied.needs_apply(other, child, drifted)
