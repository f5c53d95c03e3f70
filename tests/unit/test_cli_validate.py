"""`kvtier validate`: exit codes and one line per problem, never a traceback."""

import subprocess
import sys

import pytest

from tests.conftest import EXAMPLES, REPO_ROOT


def kvtier_validate(*args, stdin=None):
    return subprocess.run(
        [sys.executable, "-m", "kvtier", "validate", *args], input=stdin, capture_output=True, text=True
    )


def test_examples_are_valid():
    result = kvtier_validate("-f", str(EXAMPLES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "3 kvtier objects valid"


def test_every_example_file_alone():
    for path in sorted(EXAMPLES.glob("*.yaml")):
        assert kvtier_validate("-f", str(path)).returncode == 0, path


BAD = """\
apiVersion: kvtier.io/v1alpha1
kind: KVPool
metadata: {name: p}
spec:
  capacity: 10Ti
  storage: {csi: {storageClassName: fast}, hostPath: {path: /x}}
---
apiVersion: kvtier.io/v1
kind: KVPool
metadata: {name: q}
---
apiVersion: kvtier.io/v1alpha1
kind: InferenceDeployment
metadata: {name: d, namespace: ml}
spec:
  model: {name: m, kvBytesPerToken: 1024}
  engine: {image: vllm, args: ["--port", "9000"]}
  kvCache: {cpu: {size: 4Gi}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: ignored}
---
metadata: {name: nokind}
---
apiVersion: kvtier.io/v1alpha1
kind: KVPools
metadata: {name: typo}
"""


def test_problems_are_one_line_each_with_file_kind_name_and_field(tmp_path):
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(BAD)
    result = kvtier_validate("-f", str(manifest))
    assert result.returncode == 1
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines == [
        f'{manifest}: KVPool/p: spec.storage: Invalid value: "object": set exactly one storage backend: nvmeof, csi or hostPath',
        f"{manifest}: KVPool/q: apiVersion: unknown apiVersion 'kvtier.io/v1' for KVPool (served: kvtier.io/v1alpha1)",
        f'{manifest}: InferenceDeployment/d: spec.engine.args: Invalid value: "array": args must not set --port, --host, --model, '
        "--served-model-name, --tensor-parallel-size, --gpu-memory-utilization or --max-model-len: use the spec's fields",
        f"{manifest}: <no kind>/nokind: kind: required field is missing",
        f"{manifest}: KVPools/typo: kind: unknown kind 'KVPools' in kvtier.io (known: KVPool, InferenceDeployment)",
    ]


def test_stdin_and_malformed_yaml():
    result = kvtier_validate("-f", "-", stdin="apiVersion: kvtier.io/v1alpha1\nkind: KVPool\nspec: [unclosed\n")
    assert result.returncode == 1
    assert result.stdout.startswith("<stdin>: malformed YAML: line 4, column 1:")
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("- just\n- a list\n", "expected a Kubernetes object, got list"),
        ("kind: KVPool\nmetadata: {name: x}\nspec: {}\n", "apiVersion: required field is missing"),
        (
            "apiVersion: kvtier.io/v1alpha1\nkind: KVPool\nspec: {capacity: 1Ti, storage: {hostPath: {path: /x}}}\n",
            "metadata.name: Required value",
        ),
        ("apiVersion: kvtier.io/v1alpha1\nkind: KVPool\nmetadata: {name: x}\n", "spec: Required value"),
        ("\t- bad indentation\n", "malformed YAML"),
    ],
)
def test_bad_documents_get_one_line(text, expected):
    result = kvtier_validate("-f", "-", stdin=text)
    assert result.returncode == 1
    first, *rest = result.stdout.splitlines()
    assert expected in first, result.stdout
    # As from the API server: after a schema error, a note that the CEL rules were not checked.
    assert rest in (
        [],
        [
            f"{first.split(': ')[0]}: {first.split(': ')[1]}: some validation rules were not checked because the object was invalid; "
            "correct the existing errors to complete validation"
        ],
    ), result.stdout


def test_unreadable_file():
    result = kvtier_validate("-f", "/nonexistent/kvpool.yaml")
    assert result.returncode == 1
    assert result.stdout.strip() == "/nonexistent/kvpool.yaml: cannot read: No such file or directory"


def test_filename_is_required():
    assert kvtier_validate().returncode == 2


def test_an_omitted_kv_cache_masks_nothing():
    """Issue #16 item 6: with spec.kvCache omitted, validate said only `cpu: cpu is required` and hid the rest."""
    text = (REPO_ROOT / "tests" / "data" / "bad-inputs" / "kvcache-omitted-with-other-errors.yaml").read_text()
    result = kvtier_validate("-f", "-", stdin=text)
    fields = [line.split(": ")[2] for line in result.stdout.splitlines()]
    assert result.returncode == 1
    assert fields == [
        "spec.engine.imagee",
        "spec.kvCache",
        "spec.engine.tensorParallelSize",
        "spec.engine.gpuMemoryUtilization",
        "some validation rules were not checked because the object was invalid; correct the existing "
        "errors to complete validation",
    ], result.stdout
    fixed = text.replace("imagee: typo, tensorParallelSize: 0, gpuMemoryUtilization: 1.5", "tensorParallelSize: 1")
    result = kvtier_validate("-f", "-", stdin=fixed)
    assert [line.split(": ")[2] for line in result.stdout.splitlines()][:1] == ["spec.kvCache"], result.stdout
