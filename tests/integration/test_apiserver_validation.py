"""Custom resource schema validation (with CEL), built-in validation, tables and OpenAPI."""

from __future__ import annotations

import re

import pytest
import yaml
from apiserver_helpers import CONFIGMAPS, CRDS, MERGE, Api, WatchStream, widget

from kvtier.testing.apiserver import ThreadedAPIServer
from kvtier.testing.apiserver.table import jsonpath

TABLE = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)


RULES_NOT_CHECKED = (
    "Invalid value: null: some validation rules were not checked because the object was invalid; "
    "correct the existing errors to complete validation"
)


def causes(body: dict) -> dict[str, str]:
    """The 422's causes by field, less the server's fieldless note that the CEL rules were skipped
    (the widgets' CRD has rules, so it comes with every schema error, as from a real server)."""
    found = {c["field"]: c["message"] for c in body["details"]["causes"]}
    if found.get("<nil>") == RULES_NOT_CHECKED:
        del found["<nil>"]
    return found


def test_defaults_are_applied_including_nested(api, widgets):
    created = api.ok("POST", widgets, widget("w", replicas=None))
    assert created["spec"]["replicas"] == 1  # null of a non-nullable field is dropped, then defaulted
    assert created["spec"]["engine"] == {"image": "vllm/vllm-openai:latest"}  # default {} then its own defaults
    kept = api.ok("POST", widgets, widget("v", replicas=3, engine={"image": "mine"}, note=None))
    assert kept["spec"]["replicas"] == 3 and kept["spec"]["engine"] == {"image": "mine"}
    assert kept["spec"]["note"] is None  # nullable


def test_unknown_fields_are_pruned_with_a_warning(api, widgets):
    body = widget("w", bogus=1, extra={"anything": {"goes": True}}, tags={"a": "b"})
    body["spec"]["engine"] = {"image": "x", "surprise": "y"}
    body["unknownTop"] = 1
    status, created, headers = api.post(widgets, body)
    assert status == 201
    assert "bogus" not in created["spec"] and "surprise" not in created["spec"]["engine"]
    assert "unknownTop" not in created
    assert created["spec"]["extra"] == {"anything": {"goes": True}} and created["spec"]["tags"] == {"a": "b"}
    assert 'unknown field \\"spec.bogus\\"' in headers.get("Warning", "")
    status, body, _ = api.post(f"{widgets}?fieldValidation=Strict", widget("s", bogus=1))
    assert status == 400 and 'unknown field "spec.bogus"' in body["message"]


#: What the scale subresource says of a replica count, by the count written (as kube-apiserver says it).
SCALE_CHECK = {
    "'two'": "Invalid value: 0: .spec.replicas accessor error: two is of the type string, expected int64",
    "-1": "Invalid value: -1: should be a non-negative integer",
}


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        ({"size": "huge"}, "spec.size", 'Unsupported value: "huge": supported values: "small", "medium", "large"'),
        (
            {"replicas": "two"},
            "spec.replicas",
            'Invalid value: "string": spec.replicas in body must be of type integer: "string"',
        ),
        (
            {"replicas": 101},
            "spec.replicas",
            "Invalid value: 101: spec.replicas in body should be less than or equal to 100",
        ),
        (
            {"replicas": -1},
            "spec.replicas",
            "Invalid value: -1: spec.replicas in body should be greater than or equal to 0",
        ),
        ({"code": "ABC"}, "spec.code", "Invalid value: \"ABC\": spec.code in body should match '^[a-z]+$'"),
        ({"code": "abcdefghij"}, "spec.code", "Too long: may not be more than 8 bytes"),
        (
            {"owner": "nobody"},
            "spec.owner",
            'Invalid value: "nobody": spec.owner in body must be of type email: "nobody"',
        ),
        (
            {"since": "yesterday"},
            "spec.since",
            'Invalid value: "yesterday": spec.since in body must be of type date-time: "yesterday"',
        ),
        (
            {"port": True},
            "spec.port",
            'Invalid value: "boolean": spec.port in body must be of type integer,string: "boolean"',
        ),
        ({"engine": {"env": [{"value": "x"}]}}, "spec.engine.env[0].name", "Required value"),
        (
            {"tags": {"a": 1}},
            "spec.tags.a",
            'Invalid value: "integer": spec.tags.a in body must be of type string: "integer"',
        ),
    ],
)
def test_schema_violations_are_422_naming_the_field(api, widgets, spec, field, message):
    status, body, _ = api.post(widgets, widget("w", **spec))
    assert status == 422 and body["reason"] == "Invalid" and body["kind"] == "Status"
    # The scale subresource checks its replica count on every write too, after the schema (ValidateScaleSpec).
    scale = SCALE_CHECK.get(repr(spec.get("replicas")))
    assert causes(body) == {field: message, **({".spec.replicas": scale} if scale else {})}
    # A type, enum, required or size error keeps the server from evaluating the CEL rules, and it says so;
    # a bound, a pattern or a duplicate does not (apiextensions-apiserver's hasBlockingErr).
    blocking = not re.search(r"should be (less|greater)|should match", message)
    listed = [f"{field}: {message}", *([f".spec.replicas: {scale}"] if scale else [])]
    if blocking:
        listed.append(f"<nil>: {RULES_NOT_CHECKED}")
    shown = f"[{', '.join(listed)}]" if len(listed) > 1 else listed[0]
    assert body["message"] == f'Widget.test.kvtier.io "w" is invalid: {shown}'
    assert body["details"]["kind"] == "Widget" and body["details"]["group"] == "test.kvtier.io"


def test_all_violations_are_reported_together(api, widgets):
    status, body, _ = api.post(
        widgets,
        {
            "apiVersion": "test.kvtier.io/v1",
            "kind": "Widget",
            "metadata": {"name": "w"},
            "spec": {"replicas": 500, "code": "X"},
        },
    )
    assert status == 422
    assert set(causes(body)) == {"spec.size", "spec.replicas", "spec.code"}
    assert body["message"].startswith('Widget.test.kvtier.io "w" is invalid: [')


def test_accepted_values(api, widgets):
    for i, spec in enumerate(
        [
            {"port": 80},
            {"port": "http"},
            {"since": "2026-01-02T03:04:05Z"},
            {"owner": "a@b.io"},
            {"size": "large", "replicas": 0},
        ]
    ):
        api.ok("POST", widgets, widget(f"w{i}", **spec))


def test_cel_rules_run_with_old_self(api, widgets):
    status, body, _ = api.post(widgets, widget("w", limits={"min": 5, "max": 1}))
    assert status == 422 and causes(body) == {
        "spec.limits": 'Invalid value: "object": limits.min must not exceed limits.max'
    }
    api.ok("POST", widgets, widget("w", limits={"min": 1, "max": 5}, code="abc"))
    status, body, _ = api.patch(f"{widgets}/w", {"spec": {"limits": {"min": 9}}}, MERGE)
    assert status == 422 and "spec.limits" in causes(body)
    # Transition rule: `code` is immutable once set (oldSelf is bound on update).
    status, body, _ = api.patch(f"{widgets}/w", {"spec": {"code": "xyz"}}, MERGE)
    assert status == 422 and causes(body) == {"spec.code": 'Invalid value: "xyz": code is immutable'}
    api.ok("PATCH", f"{widgets}/w", {"spec": {"size": "medium"}}, content_type=MERGE)


def test_builtin_kinds_are_validated(api):
    status, body, _ = api.post(CONFIGMAPS, {"metadata": {"name": "a"}, "data": {"k": 1}})
    assert status == 422 and "data.k" in causes(body)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {
            "replicas": "x",
            "selector": {"matchLabels": {"a": "b"}},
            "template": {"spec": {"containers": [{"image": "i"}]}},
        },
    }
    status, body, _ = api.post("/apis/apps/v1/namespaces/default/deployments", deployment)
    assert status == 422
    assert {"spec.replicas", "spec.template.spec.containers[0].name"} <= set(causes(body))
    # Unknown fields of built-ins are dropped (with a warning), or refused with fieldValidation=Strict.
    status, created, headers = api.post(CONFIGMAPS, {"metadata": {"name": "u", "bogus": 1}, "data": {}, "extra": 2})
    assert status == 201 and "extra" not in created and "bogus" not in created["metadata"]
    assert (
        'unknown field \\"extra\\"' in headers["Warning"] and 'unknown field \\"metadata.bogus\\"' in headers["Warning"]
    )
    status, body, _ = api.post(f"{CONFIGMAPS}?fieldValidation=Strict", {"metadata": {"name": "s"}, "extra": 2})
    assert status == 400 and body["message"] == 'strict decoding error: unknown field "extra"'
    with ThreadedAPIServer(validate_builtins=False) as lenient:
        assert Api(lenient.url).post(CONFIGMAPS, {"metadata": {"name": "a"}, "data": {"k": 1}})[0] == 201


def test_table_output_uses_printer_columns(api, widgets):
    api.ok("POST", widgets, widget("w", size="large", replicas=3))
    api.ok("PATCH", f"{widgets}/w/status", {"status": {"kv": {"hitRatio": {"total": 0.75}}}}, content_type=MERGE)
    api.ok("POST", widgets, widget("x"))
    table = api.ok("GET", widgets, headers={"Accept": TABLE})
    assert table["kind"] == "Table" and table["apiVersion"] == "meta.k8s.io/v1"
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Size", "Replicas", "Hit", "Age"]
    assert [c["type"] for c in table["columnDefinitions"]] == ["string", "string", "integer", "number", "date"]
    first, second = table["rows"]
    assert first["cells"][:4] == ["w", "large", 3, 0.75] and first["cells"][4].endswith("s")
    assert second["cells"][:4] == ["x", "small", 1, None]
    assert first["object"]["kind"] == "PartialObjectMetadata" and first["object"]["metadata"]["name"] == "w"
    assert int(table["metadata"]["resourceVersion"]) > 0
    single = api.ok(
        "GET",
        f"{widgets}/w?includeObject=Object",
        headers={"Accept": "application/json;as=Table;v=v1beta1;g=meta.k8s.io"},
    )
    assert len(single["rows"]) == 1 and single["rows"][0]["object"]["spec"]["size"] == "large"
    builtin = api.ok("GET", "/api/v1/namespaces", headers={"Accept": TABLE})
    assert [c["name"] for c in builtin["columnDefinitions"]] == ["Name", "Status", "Age"]
    default = next(r["cells"] for r in builtin["rows"] if r["cells"][0] == "default")
    assert default[1] == "Active" and default[2].endswith("s")  # an age like "0s"
    plain = api.ok("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles", headers={"Accept": TABLE})
    assert [c["name"] for c in plain["columnDefinitions"]] == ["Name", "Age"]
    # Watches can stream Tables too (kubectl get -w).
    rv = table["metadata"]["resourceVersion"]
    api.ok("PATCH", f"{widgets}/x", {"spec": {"size": "medium"}}, content_type=MERGE)
    events = WatchStream(
        api, f"{widgets}?watch=true&resourceVersion={rv}&timeoutSeconds=1", headers={"Accept": TABLE}
    ).rest()
    assert [(e["type"], e["object"]["kind"], e["object"]["rows"][0]["cells"][:2]) for e in events] == [
        ("MODIFIED", "Table", ["x", "medium"])
    ]
    # Without the Table Accept header the list is a plain list.
    assert api.ok("GET", widgets)["kind"] == "WidgetList"


def test_openapi_v3_describes_resources_for_kubectl(api, widgets):
    index = api.ok("GET", "/openapi/v3")["paths"]
    assert {"api/v1", "apis/apps/v1", "apis/test.kvtier.io/v1"} <= set(index)
    doc = api.ok("GET", index["apis/test.kvtier.io/v1"]["serverRelativeURL"])
    schema = doc["components"]["schemas"]["io.kvtier.test.v1.Widget"]
    assert schema["x-kubernetes-group-version-kind"] == [{"group": "test.kvtier.io", "version": "v1", "kind": "Widget"}]
    assert schema["properties"]["spec"]["properties"]["size"]["enum"] == ["small", "medium", "large"]
    patch = doc["paths"]["/apis/test.kvtier.io/v1/namespaces/{namespace}/widgets/{name}"]["patch"]
    assert {"name": "fieldValidation", "in": "query"}.items() <= patch["parameters"][0].items()
    assert patch["x-kubernetes-group-version-kind"]["kind"] == "Widget"
    assert api.get("/openapi/v3/apis/nope/v1")[0] == 404


def test_events_are_accepted_in_both_groups(api):
    event = {
        "metadata": {"name": "e1"},
        "involvedObject": {"kind": "ConfigMap", "name": "a", "namespace": "default"},
        "reason": "Test",
        "message": "hello",
        "type": "Normal",
    }
    api.ok("POST", "/api/v1/namespaces/default/events", event)
    new_style = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "e2"},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": "kvtier.io/test",
        "reportingInstance": "t",
        "action": "Test",
        "reason": "Test",
        "type": "Normal",
        "regarding": {"kind": "ConfigMap", "name": "a", "namespace": "default"},
    }
    api.ok("POST", "/apis/events.k8s.io/v1/namespaces/default/events", new_style)
    found = api.ok("GET", "/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3Da")["items"]
    assert [e["metadata"]["name"] for e in found] == ["e1"]
    assert api.ok("PUT", "/api/v1/namespaces/default/events/e1", {**found[0], "count": 2})["count"] == 2


def test_invalid_crds_are_rejected(api):
    crd = next(yaml.safe_load_all(CRDS.read_text()))
    spec_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec_schema["properties"]["code"]["pattern"] = "("
    spec_schema["x-kubernetes-validations"][0]["rule"] = "self.limits.min <"
    crd["spec"]["versions"][0]["additionalPrinterColumns"][0]["type"] = "color"
    status, body, _ = api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    assert status == 422
    base = "spec.versions[0].schema.openAPIV3Schema.properties[spec]"
    assert set(causes(body)) == {
        f"{base}.properties[code].pattern",
        f"{base}.x-kubernetes-validations[0].rule",
        "spec.versions[0].additionalPrinterColumns[0].type",
    }
    assert api.get("/apis/test.kvtier.io/v1")[0] == 404  # nothing was registered


def test_printer_column_json_paths():
    obj = {
        "status": {
            "conditions": [{"type": "Progressing", "status": "False"}, {"type": "Ready", "status": "True"}],
            "kv": {"hit.ratio": 0.5},
        },
        "spec": {"args": ["--a", "--b"]},
    }
    assert jsonpath(obj, '.status.conditions[?(@.type=="Ready")].status') == "True"
    assert jsonpath(obj, "{.status.conditions[?(@.type=='Missing')].status}") is None
    assert jsonpath(obj, ".status.kv['hit.ratio']") == 0.5
    assert jsonpath(obj, ".spec.args[1]") == "--b" and jsonpath(obj, ".spec.args[5]") is None
    assert jsonpath(obj, ".spec.nothing.deeper") is None
