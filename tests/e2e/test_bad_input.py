"""Bad input at `kubectl apply --dry-run=server`: the API server (with the generated CRDs) and `kvtier validate`
agree on rejecting every case of the bad-input corpus and name the same field path.

The corpus is `tests/unit/test_api_invalid.py` (CASES: object, the field `kvtier validate` must name; VALID:
objects both must accept) plus MULTI below (documents with several errors at once). A case added there is
checked here too, on every ground. On the real control plane the API server is the judge; on the embedded
one the same comparison checks the emulator.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvtier.api.documents import Document, parse_document
from kvtier.kube import NAMESPACES
from tests.unit.test_api_invalid import _DELETE, CASES, INFD, VALID, with_

KUBECTL = Path(sys.executable).parent / "kubectl"
NAMESPACE = "bad-input"

#: Documents with several errors: the API server names each; `kvtier validate` must too. (An unknown field
#: is refused alone: strict field validation answers 400 before the schema is checked.)
MULTI = [
    (
        "kvcache-omitted-with-other-errors",
        with_(INFD, spec__kvCache=_DELETE, spec__engine__tensorParallelSize=0, spec__engine__gpuMemoryUtilization=1.5),
        ["spec.engine.tensorParallelSize", "spec.engine.gpuMemoryUtilization"],
    ),
    (
        "unknown-field-among-other-errors",
        with_(INFD, spec__engine__gpus=8, spec__engine__tensorParallelSize=0),
        ["spec.engine.gpus"],
    ),
]

#: Cases where the two disagree today, with why. strict: each flips to a failure once fixed, to be removed here.
KNOWN: dict[str, str] = {}

_PATH = re.compile(r"(?:^|[\[\s,*])((?:metadata|spec)(?:\.[A-Za-z0-9_-]+|\[[A-Za-z0-9_.-]+\])*): ")
_UNKNOWN = re.compile(r'unknown field "([^"]+)"')


def _normal(path: str) -> str:
    """`a.requests[memory]` -> `a.requests.memory` (a map key); list indexes stay."""
    return re.sub(r"\[([A-Za-z_][A-Za-z0-9_.-]*)\]", r".\1", path)


def server_paths(cluster, obj) -> tuple[int, list[str], str]:
    """`kubectl apply --dry-run=server` of one object: exit code, the field paths its error names, the error."""
    obj = dict(obj, metadata={**obj["metadata"], **({"namespace": NAMESPACE} if obj["kind"] != "KVPool" else {})})
    result = subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(cluster.kubeconfig), "apply", "--dry-run=server", "-f", "-"],
        input=yaml.safe_dump(obj),
        capture_output=True,
        text=True,
        timeout=60,
    )
    paths = {_normal(path) for path in _PATH.findall(result.stderr) + _UNKNOWN.findall(result.stderr)}
    return result.returncode, sorted(paths), result.stderr.strip()


def validate_paths(obj) -> list[str]:
    return [problem.field for problem in parse_document(Document("case.yaml", 0, obj)).problems]


def _names(field: str, paths: list[str]) -> bool:
    """A path names the field: exactly, or as the list a CEL rule on it names (`spec.engine.args` for `[1]`)."""
    return any(path == field or field.startswith(path + "[") for path in paths)


@pytest.fixture(scope="module")
def bad_input_namespace(cluster):
    if cluster.run(cluster.kube.get_or_none(NAMESPACES, None, NAMESPACE)) is None:
        cluster.run(
            cluster.kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        )
    return NAMESPACE


def _params(cases):
    return [
        pytest.param(
            *case, id=case[0], marks=[pytest.mark.xfail(strict=True, reason=KNOWN[case[0]])] if case[0] in KNOWN else []
        )
        for case in cases
    ]


@pytest.mark.parametrize(("case", "obj", "field", "cel"), _params(CASES))
def test_the_api_server_rejects_each_bad_case_naming_the_field_validate_names(
    cluster, bad_input_namespace, case, obj, field, cel
):
    code, paths, error = server_paths(cluster, obj)
    assert code != 0, f"{case}: the API server accepted it; kvtier validate names {validate_paths(obj)}"
    assert _names(field, paths), f"{case}: kvtier validate names {field}, the API server {paths}: {error}"
    assert _names(field, validate_paths(obj)), f"{case}: kvtier validate names {validate_paths(obj)}"


@pytest.mark.parametrize(("case", "obj"), [pytest.param(*case, id=case[0]) for case in VALID])
def test_the_api_server_accepts_what_validate_accepts(cluster, bad_input_namespace, case, obj):
    code, _, error = server_paths(cluster, obj)
    assert code == 0, f"{case}: {error}"
    assert validate_paths(obj) == []


@pytest.mark.parametrize(("case", "obj", "fields"), _params(MULTI))
def test_every_error_of_a_document_is_named_by_both(cluster, bad_input_namespace, case, obj, fields):
    code, paths, error = server_paths(cluster, obj)
    assert code != 0 and all(_names(field, paths) for field in fields), f"{case}: {paths}: {error}"
    named = validate_paths(obj)
    assert all(_names(field, named) for field in fields), f"{case}: kvtier validate names {named}, expected {fields}"
