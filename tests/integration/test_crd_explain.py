"""The real `kubectl explain` reads the kvtier CRDs' descriptions from the embedded API server's /openapi/v3."""

from __future__ import annotations

import pytest

from kvtier.api.crd import build_crds


@pytest.fixture
def kvtier_crds(api):
    for crd in build_crds().values():
        api.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)


@pytest.mark.parametrize(("field", "expected"), [
    ("infd.spec.kvCache", ["The KV cache tiers beyond GPU memory", "chunkSize", "Tokens per LMCache chunk",
                           "default 256"]),
    ("infd.spec.kvCache.storage.max", ["Most quota the rebalancer may give a replica", "default: `request`"]),
    ("infd.spec.engine.maxModelLen", ["Longest request", "--max-model-len"]),
    ("infd.spec.slo", ["Time-to-first-token objectives", "ttftP50"]),
    ("infd.status.kv.ttftP50Seconds", ["Median time to first token", "in seconds"]),
    ("kvpool.spec.storage.nvmeof.namespaces", ["static inventory", "uuid", "Namespace UUID"]),
    ("kvpool.spec.storage.csi.storageClassName", ["StorageClass that provisions one volume per replica"]),
    ("kvpool.spec.rebalance.interval", ["How often", "default 1m"]),
])
def test_kubectl_explain_shows_the_descriptions(kubectl, kvtier_crds, field, expected):
    out = kubectl("explain", field).stdout
    for text in expected:
        assert text in " ".join(out.split()), f"`kubectl explain {field}` lacks {text!r}:\n{out}"
