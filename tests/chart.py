"""The Helm chart, rendered by the real `helm` binary (hack/tools.sh puts it into .venv/bin)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO_ROOT

CHART = REPO_ROOT / "charts" / "kvtier-operator"
HELM = Path(sys.executable).parent / "helm"
RELEASE, NAMESPACE = "kvtier-operator", "kvtier-system"


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    if not HELM.exists():
        pytest.fail(f"{HELM} is missing: run ./hack/tools.sh (./hack/setup.sh does)")
    result = subprocess.run(
        [str(HELM), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"HOME": tempfile.gettempdir(), "PATH": "/usr/bin:/bin"},
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)}:\n{result.stderr}")
    return result


def template(values: dict[str, Any] | None = None, *extra: str) -> list[dict[str, Any]]:
    """`helm template` of the chart with these values (merged over values.yaml), as objects."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, *extra]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
        if values is not None:
            file.write(json.dumps(values))
            file.flush()
            args += ["--values", file.name]
        rendered = helm(*args).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def rule_triples(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """Every (verb, group, resource[/subresource]) a list of RBAC rules grants."""
    return {
        (verb, group, resource)
        for rule in rules
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }
