"""Property tests: no body, patch, apply or selector makes the server fail other than with a 4xx Status."""

from __future__ import annotations

import json
import os
import urllib.parse

import pytest
import yaml
from apiserver_helpers import CRDS, Api, widget
from apiserver_helpers import WIDGETS as WIDGETS_PATH
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.testing.apiserver import Cluster, StatusError, ThreadedAPIServer, WriteOptions
from kvtier.testing.apiserver.core import JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH
from kvtier.testing.apiserver.openapi import group_version_document
from kvtier.testing.apiserver.selectors import parse_field_selector, parse_label_selector
from kvtier.testing.apiserver.table import table

# Keys the server gives meaning to (patch directives, JSON patch fields, object fields), and noise.
keys = st.sampled_from(
    [
        "$patch",
        "$deleteFromPrimitiveList/finalizers",
        "$deleteFromPrimitiveList/data",
        "$setElementOrder/containers",
        "$retainKeys",
        "op",
        "path",
        "value",
        "from",
        "metadata",
        "name",
        "labels",
        "annotations",
        "finalizers",
        "ownerReferences",
        "resourceVersion",
        "spec",
        "status",
        "data",
        "replicas",
        "selector",
        "containers",
        "env",
        "size",
        "engine",
        "limits",
        "min",
        "max",
    ]
) | st.text(max_size=6)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["add", "remove", "replace", "move", "copy", "test", "/data", "/spec/size", "delete", "small"])
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=20,
)
# Bodies shaped roughly like objects, so that they reach the deeper validation code.
widget_specs = st.dictionaries(
    st.sampled_from(
        ["size", "replicas", "port", "owner", "since", "code", "note", "limits", "engine", "extra", "tags", "bogus"]
    ),
    json_values,
    max_size=6,
)
pytestmark = pytest.mark.filterwarnings("ignore:The recursion limit will not be reset")  # set by cel-python
# KVTIER_FUZZ_EXAMPLES=5000 searches harder than the default run.
FUZZ = settings(
    max_examples=int(os.environ.get("KVTIER_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def cluster_with_widgets() -> Cluster:
    cluster = Cluster()
    crds = cluster.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
    for crd in yaml.safe_load_all(CRDS.read_text()):
        cluster.create(crds, None, crd)
    return cluster


CLUSTER = cluster_with_widgets()
LENIENT = Cluster(validate_builtins=False)  # nothing but the emulator's own checks between input and code
WIDGETS = CLUSTER.resource("test.kvtier.io", "v1", "widgets")
CONFIGMAPS = CLUSTER.resource("", "v1", "configmaps")


@pytest.fixture(scope="module")
def fuzz_api():
    """One server for all HTTP fuzz examples, with the test CRDs and a widget."""
    with ThreadedAPIServer() as server:
        api = Api(server.url)
        for crd in yaml.safe_load_all(CRDS.read_text()):
            api.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        api.ok("POST", WIDGETS_PATH, widget("w"))
        yield api


def attempt(fn, *args) -> None:
    try:
        fn(*args)
    except StatusError as error:
        assert 400 <= error.code < 500, error.to_status()


@FUZZ
@given(spec=widget_specs, metadata=json_values)
def test_creating_arbitrary_widgets_fails_only_with_status_errors(spec, metadata):
    body = {"apiVersion": "test.kvtier.io/v1", "kind": "Widget", "metadata": {"generateName": "w-"}, "spec": spec}
    attempt(CLUSTER.create, WIDGETS, "default", body)
    attempt(CLUSTER.create, WIDGETS, "default", {**body, "metadata": metadata})
    attempt(CLUSTER.create, CONFIGMAPS, "default", {"metadata": {"generateName": "c-"}, "data": metadata})


@FUZZ
@given(patch=json_values, kind=st.sampled_from([MERGE_PATCH, JSON_PATCH, STRATEGIC_PATCH]))
def test_arbitrary_patches_fail_only_with_status_errors(patch, kind):
    if CLUSTER.find(WIDGETS, "default", "target") is None:
        CLUSTER.create(WIDGETS, "default", {"metadata": {"name": "target"}, "spec": {"size": "small"}})
        CLUSTER.create(CONFIGMAPS, "default", {"metadata": {"name": "target"}, "data": {"a": "b"}})
    raw = json.dumps(patch).encode()
    attempt(CLUSTER.patch, WIDGETS, "default", "target", kind, raw, WriteOptions(manager="fuzz"))
    attempt(CLUSTER.patch, CONFIGMAPS, "default", "target", kind, raw, WriteOptions(manager="fuzz"))
    attempt(CLUSTER.patch, WIDGETS, "default", "target", kind, raw, WriteOptions(manager="fuzz"), "status")
    attempt(CLUSTER.patch, WIDGETS, "default", "target", kind, raw, WriteOptions(manager="fuzz"), "scale")


@FUZZ
@given(config=widget_specs, force=st.booleans())
def test_arbitrary_applies_fail_only_with_status_errors(config, force):
    body = json.dumps(
        {"apiVersion": "test.kvtier.io/v1", "kind": "Widget", "metadata": {"name": "applied"}, "spec": config}
    ).encode()
    attempt(CLUSTER.apply, WIDGETS, "default", "applied", body, WriteOptions(manager="fuzz", force=force))


@FUZZ
@given(text=st.text(max_size=30))
def test_selectors_parse_or_fail_with_400(text):
    for parse in (parse_label_selector, lambda t: parse_field_selector(t, "pods")):
        try:
            predicate = parse(text)
        except StatusError as error:
            assert error.code == 400
        else:
            assert predicate is None or isinstance(predicate({"metadata": {"labels": {"a": "b"}}}), bool)


scalars = st.none() | st.booleans() | st.integers(-5, 5) | st.sampled_from(["", "a", "x@y.z", "2026-01-01T00:00:00Z"])
schemas = st.recursive(
    st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(["string", "integer", "number", "boolean", "object", "array"]) | json_values,
            "format": st.sampled_from(["date-time", "email", "int32", "byte", "uuid", "bogus"]),
            "enum": st.lists(scalars, max_size=3) | json_values,
            "default": json_values,
            "nullable": st.booleans(),
            "pattern": st.sampled_from(["^a", "(", "[a-z]+", "a{2,1}"]) | json_values,
            "minimum": st.integers(-3, 3) | json_values,
            "maxLength": st.integers(0, 3) | json_values,
            "x-kubernetes-int-or-string": st.booleans(),
            "x-kubernetes-preserve-unknown-fields": st.booleans(),
            "x-kubernetes-list-type": st.sampled_from(["set", "map", "atomic"]),
            "x-kubernetes-list-map-keys": st.lists(keys, max_size=2) | json_values,
            "required": st.lists(keys, max_size=2) | json_values,
        },
    ),
    lambda children: st.fixed_dictionaries(
        {"type": st.sampled_from(["object", "array"])},
        optional={
            "properties": st.dictionaries(keys, children, max_size=3) | json_values,
            "additionalProperties": children | st.booleans(),
            "items": children | json_values,
            "anyOf": st.lists(children, max_size=2),
            "allOf": st.lists(children, max_size=2),
            "x-kubernetes-validations": st.lists(
                st.fixed_dictionaries(
                    {
                        "rule": st.sampled_from(
                            ["self.a > 1", "self == oldSelf", "((", "has(self.spec)", "size(self) < 2"]
                        )
                    },
                    optional={"message": st.text(max_size=5), "fieldPath": st.sampled_from([".a", "bogus"])},
                ),
                max_size=2,
            ),
        },
    ),
    max_leaves=12,
)
crd_specs = st.fixed_dictionaries(
    {
        "group": st.just("x.io"),
        "scope": st.sampled_from(["Namespaced", "Cluster"]),
        "names": st.just({"plural": "things", "kind": "Thing"}),
        "versions": st.fixed_dictionaries(
            {"name": st.just("v1"), "served": st.just(True), "storage": st.just(True)},
            optional={
                "subresources": st.fixed_dictionaries(
                    {},
                    optional={
                        "status": st.just({}),
                        "scale": st.fixed_dictionaries(
                            {},
                            optional={
                                "specReplicasPath": st.sampled_from([".spec.replicas", ".spec", "spec..x"])
                                | json_values,
                                "statusReplicasPath": st.sampled_from([".status.replicas"]) | json_values,
                                "labelSelectorPath": st.sampled_from([".status.selector", ".spec"]) | json_values,
                            },
                        ),
                    },
                ),
                "schema": st.fixed_dictionaries({"openAPIV3Schema": schemas}),
                "additionalPrinterColumns": st.lists(
                    st.fixed_dictionaries(
                        {
                            "name": st.text(max_size=4),
                            "jsonPath": st.sampled_from([".spec.a", ".spec", "{.x[0]}", ".a['b']", "..", "["])
                            | json_values,
                        },
                        optional={
                            "type": st.sampled_from(["string", "integer", "date", "number", "boolean"]) | json_values,
                            "priority": st.integers(0, 1) | json_values,
                        },
                    ),
                    max_size=2,
                ),
            },
        ).map(lambda v: [v]),
    }
)


@FUZZ
@given(spec=crd_specs, thing=json_values)
def test_arbitrary_crds_fail_only_with_status_errors(spec, thing):
    crds = LENIENT.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
    body = {"metadata": {"name": "things.x.io"}, "spec": spec}
    try:
        LENIENT.create(crds, None, body)
    except StatusError as error:
        assert 400 <= error.code < 500, error.to_status()
        return
    try:
        for rt in [t for t in LENIENT.registry.all() if t.group == "x.io"]:
            namespace = "default" if rt.namespaced else None
            attempt(LENIENT.create, rt, namespace, {"metadata": {"name": "t"}, "spec": thing, "status": thing})
            if LENIENT.find(rt, namespace, "t"):
                raw = json.dumps({"spec": thing, "status": {"replicas": thing}}).encode()
                for sub in (None, "status", "scale"):
                    attempt(LENIENT.patch, rt, namespace, "t", MERGE_PATCH, raw, WriteOptions(manager="f"), sub)
                table(rt, [obj.obj for obj in LENIENT.list(rt, namespace)[0]], "1")
                if rt.scale:
                    attempt(LENIENT.scale_of, rt, LENIENT.get(rt, namespace, "t").obj)
            group_version_document(LENIENT.registry, rt.group, rt.version, "v1.37.0")
    finally:
        LENIENT.delete(crds, None, "things.x.io")
        LENIENT.collect_garbage()


segments = st.sampled_from(
    [
        "api",
        "apis",
        "v1",
        "apps",
        "namespaces",
        "default",
        "nope",
        "configmaps",
        "pods",
        "status",
        "scale",
        "statefulsets",
        "test.kvtier.io",
        "widgets",
        "w",
        "openapi",
        "v3",
        "version",
        "x",
        "",
    ]
)
real_paths = st.sampled_from(
    [
        "/api/v1/namespaces/default/configmaps",
        "/api/v1/namespaces/default/configmaps/x",
        "/api/v1/configmaps",
        "/apis/test.kvtier.io/v1/namespaces/default/widgets",
        "/apis/test.kvtier.io/v1/namespaces/default/widgets/w",
        "/apis/test.kvtier.io/v1/namespaces/default/widgets/w/status",
        "/apis/test.kvtier.io/v1/namespaces/default/widgets/w/scale",
        "/apis/test.kvtier.io/v1/gadgets",
        "/apis/apps/v1/statefulsets",
        "/api/v1/namespaces",
        "/api/v1/namespaces/default",
        "/api/v1/namespaces/default/status",
        "/openapi/v3/apis/apps/v1",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    ]
)
queries = st.dictionaries(
    st.sampled_from(
        [
            "labelSelector",
            "fieldSelector",
            "limit",
            "continue",
            "resourceVersion",
            "resourceVersionMatch",
            "watch",
            "timeoutSeconds",
            "fieldManager",
            "fieldValidation",
            "force",
            "dryRun",
            "propagationPolicy",
            "includeObject",
            "allowWatchBookmarks",
            "sendInitialEvents",
        ]
    ),
    st.sampled_from(
        [
            "",
            "0",
            "1",
            "-1",
            "abc",
            "true",
            "All",
            "Strict",
            "Exact",
            "a=b",
            "metadata.name=x",
            "!!",
            "Orphan",
            "Object",
            "3.5",
            "eyJ4Ijog",
        ]
    ),
    max_size=4,
)


@settings(FUZZ, max_examples=4 * FUZZ.max_examples)  # a wide space: request shape x parameters x body
@given(
    method=st.sampled_from(["GET", "GET", "GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]),
    path=real_paths | st.lists(segments, max_size=7).map(lambda parts: "/" + "/".join(parts)),
    query=queries,
    body=json_values,
    content_type=st.sampled_from(
        [
            "application/json",
            "application/merge-patch+json",
            "application/yaml",
            "application/apply-patch+yaml",
            "application/json-patch+json",
            "text/plain",
        ]
    ),
)
def test_arbitrary_requests_never_fail_with_a_server_error(fuzz_api, method, path, query, body, content_type):
    api = fuzz_api
    if query.get("watch") in ("1", "true"):
        query["timeoutSeconds"] = "0"  # keep watches short
    url = path + ("?" + urllib.parse.urlencode(query) if query else "")
    status, answer, _ = api.request(method, url, body, content_type=content_type)
    assert status < 500, (method, url, answer)
