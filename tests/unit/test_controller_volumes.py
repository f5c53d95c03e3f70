"""What an existing StatefulSet keeps, and how big the replicas' volumes are (pure parts of controllers.volumes)."""

import copy

from kvtier.controllers.volumes import keep_claim_templates, volume_size

TI = 2**40


def statefulset(size="1Ti", mode="Block", storage_class="fast"):
    return {
        "metadata": {"name": "coder", "namespace": "ml"},
        "spec": {
            "serviceName": "coder-headless",
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"a": "b"}},
            "volumeClaimTemplates": [
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "kv-store", "labels": {"a": "b"}},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "volumeMode": mode,
                        "storageClassName": storage_class,
                        "resources": {"requests": {"storage": size}},
                    },
                }
            ],
        },
    }


def claim(request, capacity=None):
    body = {"spec": {"resources": {"requests": {"storage": request}}}}
    if capacity:
        body["status"] = {"phase": "Bound", "capacity": {"storage": capacity}}
    return body


def test_a_grown_claim_template_is_replaced_by_the_existing_one():
    existing = statefulset("1Ti")
    existing["spec"]["volumeClaimTemplates"][0]["status"] = {"phase": "Pending"}  # what a real server adds
    rendered = statefulset("2Ti")
    assert keep_claim_templates(rendered, existing) is None
    [template] = rendered["spec"]["volumeClaimTemplates"]
    assert template["spec"]["resources"]["requests"]["storage"] == "1Ti" and "status" not in template


def test_a_changed_volume_kind_is_reported_and_nothing_is_replaced():
    rendered = statefulset(mode="Filesystem", storage_class="slow")
    before = copy.deepcopy(rendered)
    problem = keep_claim_templates(rendered, statefulset())
    assert problem.startswith(
        "spec.kvCache.storage: StatefulSet coder cannot be updated: kv-store.volumeMode 'Block' "
        "-> 'Filesystem'; kv-store.storageClassName 'fast' -> 'slow'"
    )
    assert "kubectl delete pvc -n ml -l kvtier.io/deployment=coder" in problem and rendered == before


def test_other_fixed_fields_are_reported_without_blaming_storage():
    rendered = statefulset()
    rendered["spec"]["serviceName"] = "other"
    assert keep_claim_templates(rendered, statefulset()).startswith(
        "StatefulSet coder cannot be updated: serviceName 'coder-headless' -> 'other'"
    )


def test_volume_size_is_what_the_smallest_volume_holds():
    assert volume_size([claim("1Ti", "2Ti"), claim("1Ti", "1536Gi")], statefulset()) == 1536 * 2**30
    assert volume_size([claim("2Ti")], None) == 2 * TI, "an unbound claim holds its request"
    assert volume_size([], statefulset("1Ti")) == TI, "before any claim: the template"
    assert volume_size([], None) is None
