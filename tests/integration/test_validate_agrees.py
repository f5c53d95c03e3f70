"""`kvtier validate` reports exactly what the API server reports: the bad-input corpus
(`tests/data/bad-inputs/`) applied with the real kubectl to the API server of every ground (the embedded one
and the real kube-apiserver, with the generated CRDs), and `kvtier validate` on the same files, name the same
field paths, one by one."""

from __future__ import annotations

import collections
import pathlib
import re
import subprocess
import sys
from collections.abc import Callable

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "data" / "bad-inputs"
FILES = sorted(CORPUS.glob("*.yaml"))
KUBECTL = pathlib.Path(sys.executable).parent / "kubectl"
RULES_NOT_CHECKED = "some validation rules were not checked because the object was invalid"


def _path(problem: str) -> str:
    """The field path of one `field: message` problem (the server's fieldless note is `<nil>`)."""
    return "<nil>" if problem.startswith(RULES_NOT_CHECKED) else problem.split(": ", 1)[0]


def server_paths(kubectl: Callable[..., subprocess.CompletedProcess[str]], path: pathlib.Path) -> list[str]:
    """Field paths the API server refuses in the object of `path` (sorted; empty: accepted).

    Unknown fields come from a strict apply (a 400 naming all of them, before any validation); the
    rest from an apply that ignores unknown fields (the 422's causes, as kubectl prints them).
    """
    found: list[str] = []
    strict = kubectl("apply", "--dry-run=server", "--validate=strict", "-f", str(path))
    if strict.returncode == 0:
        return []
    found += re.findall(r'unknown field "([^"]+)"', strict.stderr)
    result = kubectl("apply", "--dry-run=server", "--validate=false", "-f", str(path)) if found else strict
    if result.returncode != 0:
        message = result.stderr.split(" is invalid: ", 1)
        assert len(message) == 2, f"{path.name}: not a 422: {result.stderr}"
        bullets = [line[2:] for line in message[1].splitlines() if line.startswith("* ")]
        found += [_path(problem) for problem in (bullets or [message[1].strip()])]
    return sorted(found)


def validate_paths() -> dict[str, list[str]]:
    """Field paths `kvtier validate` reports, by file name (one run over the whole corpus)."""
    result = subprocess.run(
        [sys.executable, "-m", "kvtier", "validate", "-f", str(CORPUS)],
        capture_output=True,
        text=True,
        errors="backslashreplace",
    )
    assert "Traceback" not in result.stderr, result.stderr
    found: dict[str, list[str]] = collections.defaultdict(list)
    for line in result.stdout.splitlines():
        source, _label, problem = line.split(": ", 2)
        found[pathlib.Path(source).name].append(_path(problem))
    return {name: sorted(paths) for name, paths in found.items()}


@pytest.fixture
def kubectl(cluster):
    """The real kubectl against the ground's API server (the embedded one, and the real kube-apiserver)."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(KUBECTL), "--kubeconfig", str(cluster.kubeconfig), *args], capture_output=True, text=True, timeout=60
        )

    return run


@pytest.fixture(scope="module")
def validated():
    return validate_paths()


def test_the_corpus_covers_the_reported_disagreements():
    names = {path.stem for path in FILES}
    assert len(FILES) >= 70
    assert {
        "name-unicode",
        "name-underscore",
        "name-trailing-dash",
        "name-empty-label",
        "name-nul",
        "min-gain-2-pow-63",
        "max-step-underflow",
        "accepted-min-gain-underflow",
        "capacity-overflow",
        "kvcache-omitted-with-other-errors",
        "storage-min-above-max",
        "memory-negative",
    } <= names


@pytest.mark.parametrize("path", FILES, ids=[path.stem for path in FILES])
def test_validate_names_the_same_fields_as_the_server(kubectl, validated, path):
    server = server_paths(kubectl, path)
    assert validated.get(path.name, []) == server, (
        f"{path.name}: validate {validated.get(path.name)} != server {server}"
    )
    header = path.read_text().splitlines()[0]
    if path.stem.startswith("accepted-"):
        assert server == [], f"{path.name} should be accepted"
    else:
        assert server and header.startswith("# refused: "), f"{path.name} should be refused"
        for field in re.findall(r"((?:spec|metadata)\.[\w.\[\]]+)", header.split("(", 1)[0]):
            assert field in server, f"{path.name}: the server does not name {field}: {server}"


def test_an_enormous_exponent_is_refused_in_words_at_once(kubectl):
    """Unguarded, kube-apiserver's `quantity()` read `1e99999999999` and the rule comparing it ran until the
    request timed out (a Timeout, not a 422); the emulator answered with a Python tuple."""
    result = kubectl("apply", "--dry-run=server", "--validate=false", "-f", str(CORPUS / "capacity-overflow.yaml"))
    assert 'spec.capacity: Invalid value: "1e99999999999": must be a non-negative quantity' in result.stderr, (
        result.stderr
    )
    assert "Timeout" not in result.stderr and "evaluating rule" not in result.stderr
    assert "<class" not in result.stderr and "Error'" not in result.stderr and "', <" not in result.stderr
