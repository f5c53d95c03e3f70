"""A table of invalid objects: `kvtier validate` (pydantic) and the CRDs' CEL rules reject each one,
naming the offending field; valid variants pass both."""

import copy
import re

import pytest
import yaml
from pydantic import ValidationError

from kvtier.api.cel import validate_rules
from kvtier.api.crd import build_crds
from kvtier.api.documents import KINDS
from kvtier.api.errors import problems
from tests.conftest import EXAMPLES

POOL = yaml.safe_load((EXAMPLES / "kvpool.yaml").read_text())
CSI_POOL = yaml.safe_load((EXAMPLES / "kvpool-csi.yaml").read_text())
INFD = yaml.safe_load((EXAMPLES / "inferencedeployment.yaml").read_text())
SCHEMAS = {
    crd["spec"]["names"]["kind"]: crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for crd in build_crds().values()
}
_DELETE = object()


def _steps(path):
    return [int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", path)]


def with_(base, **changes):
    """A copy of `base` with `path=value` changes (`spec.engine.args`, `spec.x[0].y`); `_DELETE` removes."""
    obj = copy.deepcopy(base)
    for dotted, value in changes.items():
        *parents, last = _steps(dotted.replace("__", "."))
        node = obj
        for step in parents:
            node = node[step]
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value
    return obj


def _mode_none(**changes):
    return with_(INFD, spec__kvCache={"mode": "None"}, **changes)


# (id, object, field the error must name, whether a CEL rule must reject it too)
CASES = [
    # KVPool
    ("capacity-negative", with_(POOL, spec__capacity="-5"), "spec.capacity", True),
    ("capacity-zero", with_(POOL, spec__capacity=0), "spec.capacity", True),
    ("capacity-bad-suffix", with_(POOL, spec__capacity="90TB"), "spec.capacity", True),
    ("two-backends", with_(POOL, spec__storage__csi={"storageClassName": "x"}), "spec.storage", True),
    ("no-backend", with_(POOL, spec__storage={}), "spec.storage", True),
    (
        "auth-without-hostnqn",
        with_(
            POOL,
            spec__storage__nvmeof__hostNQN=_DELETE,
            spec__storage__nvmeof__auth={"secretRef": {"name": "k", "namespace": "kvtier"}},
        ),
        "spec.storage.nvmeof.hostNQN",
        True,
    ),
    ("interval-zero", with_(POOL, spec__rebalance__interval="0s"), "spec.rebalance.interval", True),
    (
        "bad-nqn",
        with_(POOL, **{"spec.storage.nvmeof.namespaces[0].nqn": "iqn.2024-06.com.example:x"}),
        "spec.storage.nvmeof.namespaces[0].nqn",
        False,
    ),
    (
        "bad-host-nqn",
        with_(POOL, spec__storage__nvmeof__hostNQN="nqn.2014-13.org.nvmexpress:x"),
        "spec.storage.nvmeof.hostNQN",
        False,
    ),
    (
        "bad-uuid",
        with_(POOL, **{"spec.storage.nvmeof.namespaces[0].uuid": "5b0c8d4e-zzzz"}),
        "spec.storage.nvmeof.namespaces[0].uuid",
        False,
    ),
    (
        "duplicate-uuid",
        with_(POOL, **{"spec.storage.nvmeof.namespaces[1].uuid": "5b0c8d4e-0f1a-4c2b-9d3e-000000000000"}),
        "spec.storage.nvmeof.namespaces[1].uuid",
        True,
    ),
    (
        # The list-map key compares uuids as written; the CEL rule compares them ignoring case.
        "duplicate-uuid-but-case",
        with_(POOL, **{"spec.storage.nvmeof.namespaces[1].uuid": "5B0C8D4E-0F1A-4C2B-9D3E-000000000000"}),
        "spec.storage.nvmeof.namespaces[1].uuid",
        True,
    ),
    (
        "namespace-size-negative",
        with_(POOL, **{"spec.storage.nvmeof.namespaces[0].size": -1}),
        "spec.storage.nvmeof.namespaces[0].size",
        True,
    ),
    ("transport-fc", with_(POOL, spec__storage__nvmeof__transport="fc"), "spec.storage.nvmeof.transport", False),
    ("no-targets", with_(POOL, spec__storage__nvmeof__targets=[]), "spec.storage.nvmeof.targets", False),
    (
        "port-out-of-range",
        with_(POOL, **{"spec.storage.nvmeof.targets[0].port": 70000}),
        "spec.storage.nvmeof.targets[0].port",
        False,
    ),
    (
        "queue-size-tiny",
        with_(POOL, spec__storage__nvmeof__connect={"queueSize": 2}),
        "spec.storage.nvmeof.connect.queueSize",
        False,
    ),
    (
        "hostpath-relative",
        with_(CSI_POOL, spec__storage={"hostPath": {"path": "var/kv"}}),
        "spec.storage.hostPath.path",
        False,
    ),
    ("volume-mode-raw", with_(CSI_POOL, spec__storage__csi__volumeMode="Raw"), "spec.storage.csi.volumeMode", False),
    (
        "storage-class-uppercase",
        with_(CSI_POOL, spec__storage__csi__storageClassName="Fast"),
        "spec.storage.csi.storageClassName",
        False,
    ),
    ("policy-unknown", with_(POOL, spec__rebalance__policy="Greedy"), "spec.rebalance.policy", False),
    ("interval-without-unit", with_(POOL, spec__rebalance__interval="60"), "spec.rebalance.interval", False),
    ("max-step-zero", with_(POOL, spec__rebalance__maxStep=0), "spec.rebalance.maxStep", False),
    ("pool-unknown-field", with_(POOL, spec__size="1Ti"), "spec.size", False),
    # InferenceDeployment
    ("both-kv-sizes", with_(INFD, spec__model__kvBytesPerToken=253952), "spec.model", True),
    ("no-kv-size", with_(INFD, spec__model__architecture=_DELETE), "spec.model", True),
    ("min-above-request", with_(INFD, spec__kvCache__storage__min="5Ti"), "spec.kvCache.storage.min", True),
    ("request-above-max", with_(INFD, spec__kvCache__storage__max="2Ti"), "spec.kvCache.storage.max", True),
    ("request-not-quantity", with_(INFD, spec__kvCache__storage__request="lots"), "spec.kvCache.storage.request", True),
    ("tp-zero", with_(INFD, spec__engine__tensorParallelSize=0), "spec.engine.tensorParallelSize", False),
    ("gmu-zero", with_(INFD, spec__engine__gpuMemoryUtilization=0), "spec.engine.gpuMemoryUtilization", False),
    ("gmu-above-one", with_(INFD, spec__engine__gpuMemoryUtilization=1.2), "spec.engine.gpuMemoryUtilization", False),
    ("replicas-negative", with_(INFD, spec__replicas=-1), "spec.replicas", False),
    ("args-port", with_(INFD, spec__engine__args=["--enforce-eager", "--port=9000"]), "spec.engine.args[1]", True),
    (
        "args-tp-underscore",
        with_(INFD, spec__engine__args=["--tensor_parallel_size", "4"]),
        "spec.engine.args[0]",
        True,
    ),
    ("args-tp-short", with_(INFD, spec__engine__args=["-tp=4"]), "spec.engine.args[0]", True),
    ("args-tp-one-string", with_(INFD, spec__engine__args=["--tensor-parallel-size 4"]), "spec.engine.args[0]", True),
    ("args-kv-transfer", with_(INFD, spec__engine__args=["--kv-transfer-config", "{}"]), "spec.engine.args[0]", True),
    # vLLM's parser reads an unambiguous prefix of a flag as the flag, and a dotted key of a JSON flag.
    (
        "args-gmu-abbreviated",
        with_(INFD, spec__engine__args=["--enforce-eager", "--gpu-memory-util", "0.5"]),
        "spec.engine.args[1]",
        True,
    ),
    ("args-tp-short-abbreviated", with_(INFD, spec__engine__args=["-t", "4"]), "spec.engine.args[0]", True),
    ("args-served-abbreviated", with_(INFD, spec__engine__args=["--served_model=x"]), "spec.engine.args[0]", True),
    ("args-kv-abbreviated", with_(INFD, spec__engine__args=["--kv-offloading-s=8"]), "spec.engine.args[0]", True),
    (
        "args-kv-transfer-dotted",
        with_(INFD, spec__engine__args=["--kv-transfer-config.kv_role=kv_producer"]),
        "spec.engine.args[0]",
        True,
    ),
    ("args-kv-offloading", with_(INFD, spec__engine__args=["--kv-offloading-size=100"]), "spec.engine.args[0]", True),
    (
        "env-hash-seed",
        with_(INFD, spec__engine__env=[{"name": "PYTHONHASHSEED", "value": "1"}]),
        "spec.engine.env[0].name",
        True,
    ),
    (
        "env-lmcache-in-process",
        with_(
            INFD,
            spec__kvCache__mode="LMCacheInProcess",
            spec__engine__env=[{"name": "LMCACHE_LOCAL_DISK", "value": "True"}],
        ),
        "spec.engine.env[0].name",
        True,
    ),
    ("mode-none-with-cpu", _mode_none(spec__kvCache__cpu={"size": "10Gi"}), "spec.kvCache.cpu", True),
    (
        "mode-none-with-storage",
        _mode_none(spec__kvCache__storage={"poolRef": "p", "request": "1Ti"}),
        "spec.kvCache.storage",
        True,
    ),
    ("lmcache-without-cpu", with_(INFD, spec__kvCache__cpu=_DELETE), "spec.kvCache.cpu", True),
    ("lmcache-default-mode-without-cpu", with_(INFD, spec__kvCache={}), "spec.kvCache.cpu", True),
    ("cpu-size-zero", with_(INFD, spec__kvCache__cpu__size="0"), "spec.kvCache.cpu.size", True),
    ("cpu-size-floaty", with_(INFD, spec__kvCache__cpu__size="4GB"), "spec.kvCache.cpu.size", True),
    ("chunk-not-block-multiple", with_(INFD, spec__kvCache__chunkSize=100), "spec.kvCache.chunkSize", False),
    ("mode-unknown", with_(INFD, spec__kvCache__mode="LMCache"), "spec.kvCache.mode", False),
    ("pool-ref-uppercase", with_(INFD, spec__kvCache__storage__poolRef="FX100"), "spec.kvCache.storage.poolRef", False),
    ("weight-zero", with_(INFD, spec__kvCache__storage__weight=0), "spec.kvCache.storage.weight", False),
    # The schema's metadata.name maxLength (a CEL rule may not point into metadata on a real API server).
    ("name-too-long", with_(INFD, metadata__name="x" * 53), "metadata.name", False),
    ("slo-p50-above-p99", with_(INFD, spec__slo={"ttftP50": "2m", "ttftP99": "30s"}), "spec.slo.ttftP50", True),
    ("dtype-unknown", with_(INFD, spec__model__architecture__dtype="int4"), "spec.model.architecture.dtype", False),
    (
        "memory-not-quantity",
        with_(INFD, spec__engine__resources__requests__memory="lots"),
        "spec.engine.resources.requests.memory",
        False,
    ),
    ("engine-unknown-field", with_(INFD, spec__engine__gpus=8), "spec.engine.gpus", False),
    (
        "toleration-effect",
        with_(INFD, spec__engine__tolerations=[{"key": "a", "effect": "Never"}]),
        "spec.engine.tolerations[0].effect",
        False,
    ),
]

VALID = [
    ("pool-example", POOL),
    ("csi-pool-example", CSI_POOL),
    ("infd-example", INFD),
    ("hostpath-pool", with_(CSI_POOL, spec__storage={"hostPath": {"path": "/var/lib/kvtier"}})),
    ("pool-capacity-int", with_(POOL, spec__capacity=12500000000)),
    ("mode-none-may-set-kv-flags", _mode_none(spec__engine__args=["--kv-transfer-config", "{}"])),
    ("mode-none-may-abbreviate-kv-flags", _mode_none(spec__engine__args=["--kv-offloading-s", "8"])),
    (
        "args-near-owned-flags",
        with_(INFD, spec__engine__args=["--model-impl", "auto", "--max-num-seqs", "8", "--hf-token", "--port-x"]),
    ),
    ("mp-may-set-lmcache-env", with_(INFD, spec__engine__env=[{"name": "LMCACHE_LOG_LEVEL", "value": "DEBUG"}])),
    ("kv-bytes-given", with_(INFD, spec__model={"name": "m", "kvBytesPerToken": 327680})),
    ("storage-without-bounds", with_(INFD, spec__kvCache__storage={"poolRef": "fx100-a", "request": "1Ti"})),
    ("no-storage-tier", with_(INFD, spec__kvCache__storage=_DELETE)),
    ("scaled-to-zero", with_(INFD, spec__replicas=0)),
    ("name-at-limit", with_(INFD, metadata__name="x" * 52)),
]


def _pydantic_problems(obj):
    """The models' own verdict (what the operator parses; `kvtier validate` runs the server's rules first)."""
    try:
        KINDS[obj["kind"]].model_validate(obj)
    except ValidationError as error:
        return problems(error)
    return []


def test_the_table_is_large_enough():
    assert len(CASES) >= 25
    assert sum(1 for case in CASES if case[3]) >= 15
    assert len({case[0] for case in CASES}) == len(CASES)


@pytest.mark.parametrize(("case", "obj", "field", "cel"), CASES, ids=[c[0] for c in CASES])
def test_pydantic_rejects_naming_the_field(case, obj, field, cel):
    fields = [problem.field for problem in _pydantic_problems(obj)]
    assert field in fields, f"{case}: expected {field}, got {fields}"


@pytest.mark.parametrize(
    ("case", "obj", "field"), [(c[0], c[1], c[2]) for c in CASES if c[3]], ids=[c[0] for c in CASES if c[3]]
)
def test_cel_rules_reject_naming_the_field(case, obj, field):
    failures = validate_rules(SCHEMAS[obj["kind"]], obj)
    # CEL names the list (`spec.engine.args`); pydantic names the element (`spec.engine.args[1]`).
    assert any(field == f.field or field.startswith(f.field + "[") for f in failures), failures


@pytest.mark.parametrize(("case", "obj"), VALID, ids=[v[0] for v in VALID])
def test_valid_objects_pass_both(case, obj):
    assert _pydantic_problems(obj) == []
    assert validate_rules(SCHEMAS[obj["kind"]], obj) == []


def test_duplicate_namespaces_are_also_a_list_map_for_the_api_server():
    namespaces = SCHEMAS["KVPool"]["properties"]["spec"]["properties"]["storage"]["properties"]["nvmeof"]["properties"][
        "namespaces"
    ]
    assert namespaces["x-kubernetes-list-type"] == "map"
    assert namespaces["x-kubernetes-list-map-keys"] == ["uuid"]


def test_cel_evaluation_errors_reject_instead_of_passing():
    schema = {"type": "object", "x-kubernetes-validations": [{"rule": "self.missing > 1", "message": "m"}]}
    failures = validate_rules(schema, {"present": 1})
    # As kube-apiserver: blamed on the rule's node, the node's type as the value, the rule's message after the error.
    assert len(failures) == 1 and failures[0].message.endswith(" evaluating rule: m")
    assert failures[0].field == "" and failures[0].value_type == "object"


def test_namespace_uuids_are_unique_ignoring_case_for_the_api_server():
    namespaces = SCHEMAS["KVPool"]["properties"]["spec"]["properties"]["storage"]["properties"]["nvmeof"]["properties"][
        "namespaces"
    ]
    schema = {**namespaces, "items": {}}  # the rule alone, not the uuid pattern
    distinct = [{"uuid": "5b0c8d4e-0f1a-4c2b-9d3e-00000000000a"}, {"uuid": "5b0c8d4e-0f1a-4c2b-9d3e-00000000000b"}]
    assert validate_rules(schema, distinct) == []
    by_case = [{"uuid": "5b0c8d4e-0f1a-4c2b-9d3e-00000000000a"}, {"uuid": "5B0C8D4E-0F1A-4C2B-9D3E-00000000000A"}]
    [failure] = validate_rules(schema, by_case)
    assert failure.message.startswith("duplicate namespace uuid")


def test_lower_ascii_lowers_only_ascii_letters_as_cel_go_does():
    from kvtier.api.cel import compile_rule

    assert compile_rule("'ÄBc-9'.lowerAscii() == 'Äbc-9'").evaluate({})


def test_an_abbreviated_flag_is_refused_naming_the_full_flag_and_the_field_to_set():
    obj = with_(INFD, spec__engine__args=["--gpu-memory-util=0.5"])
    expected = (
        "args must not abbreviate --gpu-memory-utilization: vLLM reads an unambiguous prefix of a flag as the flag; "
        "set engine.gpuMemoryUtilization"
    )
    assert [(p.field, p.message) for p in _pydantic_problems(obj)] == [("spec.engine.args[0]", expected)]
    assert [(f.field, f.message) for f in validate_rules(SCHEMAS["InferenceDeployment"], obj)] == [
        ("spec.engine.args", expected)
    ]
