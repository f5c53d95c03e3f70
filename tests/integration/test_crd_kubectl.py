"""What the real kubectl shows of kvtier's CRDs on the embedded API server: `explain` (the descriptions,
from /openapi/v3), `get` (printer columns with units) and `describe` (quantities, not floats)."""

from __future__ import annotations

import re

import pytest
from apiserver_helpers import MERGE

from kvtier.api.crd import build_crds
from kvtier.probe.demand import HitCurve
from kvtier.telemetry.report import kv_status
from kvtier.telemetry.stats import HitRatio, Summary

INFD = """
apiVersion: kvtier.io/v1alpha1
kind: InferenceDeployment
metadata: {name: chat, namespace: default}
spec:
  model: {name: m, kvBytesPerToken: 131072}
  engine: {image: vllm/vllm-openai:v0.33.0}
  kvCache: {cpu: {size: 16Gi}}
"""


@pytest.fixture
def kvtier_crds(api):
    for crd in build_crds().values():
        api.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        (
            "infd.spec.kvCache",
            ["The KV cache tiers beyond GPU memory", "chunkSize", "Tokens per LMCache chunk", "default 256"],
        ),
        ("infd.spec.kvCache.storage.max", ["Most quota the rebalancer may give a replica", "default: `request`"]),
        ("infd.spec.engine.maxModelLen", ["Longest request", "--max-model-len"]),
        ("infd.spec.slo", ["Time-to-first-token objectives", "ttftP50"]),
        ("infd.status.kv.ttftP50Seconds", ["Median time to first token", "in seconds"]),
        ("kvpool.spec.storage.nvmeof.namespaces", ["static inventory", "uuid", "Namespace UUID"]),
        ("kvpool.spec.storage.csi.storageClassName", ["StorageClass that provisions one volume per replica"]),
        ("kvpool.spec.rebalance.interval", ["How often", "default 1m"]),
    ],
)
def test_kubectl_explain_shows_the_descriptions(kubectl, kvtier_crds, field, expected):
    out = kubectl("explain", field).stdout
    for text in expected:
        assert text in " ".join(out.split()), f"`kubectl explain {field}` lacks {text!r}:\n{out}"


def test_get_and_describe_show_units_and_quantities(kubectl, api, kvtier_crds):
    kubectl("apply", "-f", "-", stdin=INFD)
    summary = Summary(
        replicas=1,
        hbm_watermark_mean=0.923,
        hit_ratio=HitRatio(hbm=0.5, cpu=0.1, storage=0.21, total=0.78),
        ttft_p50_seconds=1.5,
        prompt_tokens_per_second=1000.0,
        demand=HitCurve(capacities=(96.0 * 2**21, 192.0 * 2**20), hits=(5, 9), total=10),
        demand_unit="bytes",
    )
    api.ok(
        "PATCH",
        "/apis/kvtier.io/v1alpha1/namespaces/default/inferencedeployments/chat/status",
        {"status": {"kv": kv_status(summary)}},
        content_type=MERGE,
    )
    header, row = kubectl("get", "infd", "chat", "-o", "wide").stdout.splitlines()
    columns = list(re.finditer(r"\S+", header))  # cells may be empty: cut the row at the header's columns
    shown = {
        c.group(): row[c.start() : after.start() if after else None].strip()
        for c, after in zip(columns, [*columns[1:], None])
    }
    assert (shown["WATERMARK"], shown["HIT"], shown["STORAGE-HIT"], shown["TTFT-P50"]) == ("92%", "78%", "21%", "1.5s")
    described = kubectl("describe", "infd", "chat").stdout
    assert "201326592" in described and "e+" not in described, described
