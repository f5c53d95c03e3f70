"""Immutable parts of built-in specs and the PVC resize admission, as a real API server enforces them.

Messages are kubernetes/kubernetes': `ValidateStatefulSetUpdate` (pkg/apis/apps/validation),
`ValidatePersistentVolumeClaimUpdate` (pkg/apis/core/validation) and the PersistentVolumeClaimResize
admission plugin (plugin/pkg/admission/storage/persistentvolume/resize).
"""

from __future__ import annotations

import copy

import pytest
import yaml
from apiserver_helpers import APPLY, JSON_PATCH, MERGE, STRATEGIC

STS = "/apis/apps/v1/namespaces/default/statefulsets"
PVC = "/api/v1/namespaces/default/persistentvolumeclaims"
SC = "/apis/storage.k8s.io/v1/storageclasses"
STS_FORBIDDEN = (
    'StatefulSet.apps "db" is invalid: spec: Forbidden: updates to statefulset spec for fields other '
    "than 'replicas', 'ordinals', 'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' "
    "and 'minReadySeconds' are forbidden"
)
RESIZE_FORBIDDEN = (
    'persistentvolumeclaims "data" is forbidden: only dynamically provisioned pvc can be resized and '
    "the storageclass that provisions the pvc must support resize"
)


def statefulset(size: str = "1Gi") -> dict:
    labels = {"app": "db"}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {
            "replicas": 1,
            "serviceName": "db",
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "db", "image": "db:1"}]}},
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "data"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}},
                }
            ],
        },
    }


def claim(storage_class: str = "fast", size: str = "1Gi") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": "default"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": storage_class,
            "volumeMode": "Block",
            "resources": {"requests": {"storage": size}},
        },
    }


def bound(api, body: dict) -> dict:
    api.ok("POST", PVC, body)
    api.ok("PATCH", f"{PVC}/data", {"spec": {"volumeName": "pv-data"}}, content_type=MERGE)
    return api.ok(
        "PATCH",
        f"{PVC}/data/status",
        {"status": {"phase": "Bound", "capacity": {"storage": "1Gi"}}},
        content_type=MERGE,
    )


def storage_class(api, name: str, expandable: bool | None) -> None:
    body = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": "csi.example.com",
    }
    if expandable is not None:
        body["allowVolumeExpansion"] = expandable
    api.ok("POST", SC, body)


def assert_invalid(status, body, message):
    assert status == 422, body
    assert body["reason"] == "Invalid" and body["message"] == message
    return body["details"]["causes"]


@pytest.mark.parametrize("how", ["put", "merge", "strategic", "json", "apply"])
def test_statefulset_claim_templates_are_immutable_by_every_verb(api, how):
    created = api.ok("POST", STS, statefulset("1Gi"))
    grown = statefulset("2Gi")
    if how == "put":
        status, body, _ = api.put(f"{STS}/db", {**grown, "metadata": created["metadata"]})
    elif how == "merge":
        status, body, _ = api.patch(
            f"{STS}/db", {"spec": {"volumeClaimTemplates": grown["spec"]["volumeClaimTemplates"]}}, MERGE
        )
    elif how == "strategic":
        status, body, _ = api.patch(f"{STS}/db", {"spec": {"serviceName": "other"}}, STRATEGIC)
    elif how == "json":
        status, body, _ = api.patch(
            f"{STS}/db",
            [{"op": "replace", "path": "/spec/volumeClaimTemplates/0/spec/resources/requests/storage", "value": "2Gi"}],
            JSON_PATCH,
        )
    else:
        status, body, _ = api.request(
            "PATCH", f"{STS}/db?fieldManager=test&force=true", yaml.safe_dump(grown), content_type=APPLY
        )
    causes = assert_invalid(status, body, STS_FORBIDDEN)
    assert causes == [
        {"reason": "FieldValueForbidden", "field": "spec", "message": STS_FORBIDDEN.split("spec: ", 1)[1]}
    ]
    stored = api.ok("GET", f"{STS}/db")
    assert stored["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert stored["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_statefulset_mutable_fields_still_change(api):
    api.ok("POST", STS, statefulset())
    changed = copy.deepcopy(statefulset())
    changed["spec"].update(
        replicas=3,
        minReadySeconds=5,
        updateStrategy={"type": "OnDelete"},
        persistentVolumeClaimRetentionPolicy={"whenDeleted": "Delete", "whenScaled": "Delete"},
    )
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = "db:2"
    status, body, _ = api.request(
        "PATCH", f"{STS}/db?fieldManager=test&force=true", yaml.safe_dump(changed), content_type=APPLY
    )
    assert status == 200, body
    assert body["spec"]["replicas"] == 3 and body["spec"]["template"]["spec"]["containers"][0]["image"] == "db:2"
    assert api.ok("PUT", f"{STS}/db/scale", {"spec": {"replicas": 1}})["spec"]["replicas"] == 1


def test_claim_storage_may_not_decrease(api):
    storage_class(api, "fast", True)
    bound(api, claim(size="1Gi"))
    api.ok("PATCH", f"{PVC}/data", {"spec": {"resources": {"requests": {"storage": "2Gi"}}}}, content_type=MERGE)
    status, body, _ = api.patch(f"{PVC}/data", {"spec": {"resources": {"requests": {"storage": "1Gi"}}}})
    assert_invalid(
        status,
        body,
        'PersistentVolumeClaim "data" is invalid: spec.resources.requests.storage: '
        "Forbidden: field can not be less than previous value",
    )


def test_claim_spec_is_immutable_except_requests(api):
    storage_class(api, "fast", True)
    bound(api, claim())
    status, body, _ = api.patch(f"{PVC}/data", {"spec": {"volumeMode": "Filesystem"}})
    assert status == 422
    assert body["message"].startswith(
        'PersistentVolumeClaim "data" is invalid: [spec: Forbidden: spec is immutable '
        "after creation except resources.requests and volumeAttributesClassName for "
        "bound claims"
    )
    assert 'volumeMode: Invalid value: "Filesystem": field is immutable' in body["message"]
    status, body, _ = api.patch(f"{PVC}/data", {"spec": {"accessModes": ["ReadWriteMany"]}})
    assert status == 422 and [c["field"] for c in body["details"]["causes"]] == ["spec"]
    assert api.ok("GET", f"{PVC}/data")["spec"]["accessModes"] == ["ReadWriteOnce"]


def test_an_unbound_claim_cannot_grow(api):
    storage_class(api, "fast", True)
    api.ok("POST", PVC, claim())
    status, body, _ = api.patch(f"{PVC}/data", {"spec": {"resources": {"requests": {"storage": "2Gi"}}}})
    assert status == 422 and [c["field"] for c in body["details"]["causes"]] == ["spec"]


@pytest.mark.parametrize("class_name, expandable", [("fast", False), ("fast", None), ("", None), ("gone", None)])
def test_growth_needs_a_class_that_allows_expansion(api, class_name, expandable):
    if class_name != "gone":
        storage_class(api, "fast", expandable)
    bound(api, claim(storage_class=class_name))
    status, body, _ = api.request(
        "PATCH",
        f"{PVC}/data?fieldManager=test&force=true",
        yaml.safe_dump(claim(storage_class=class_name, size="2Gi")),
        content_type=APPLY,
    )
    assert (status, body["reason"], body["message"]) == (403, "Forbidden", RESIZE_FORBIDDEN)
    assert body["details"] == {"name": "data", "kind": "persistentvolumeclaims", "group": ""}
    assert api.ok("GET", f"{PVC}/data")["spec"]["resources"]["requests"]["storage"] == "1Gi"


def test_growth_with_an_expandable_class(api):
    storage_class(api, "fast", True)
    bound(api, claim())
    grown = api.ok(
        "PATCH", f"{PVC}/data", {"spec": {"resources": {"requests": {"storage": "2Gi"}}}}, content_type=MERGE
    )
    assert grown["spec"]["resources"]["requests"]["storage"] == "2Gi" and grown["spec"]["volumeName"] == "pv-data"
