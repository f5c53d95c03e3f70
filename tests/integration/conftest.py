"""Fixtures for tests against the embedded API server.

* `apiserver`: a running :class:`ThreadedAPIServer` (fresh per test; starting one takes milliseconds).
* `kubeconfig`: a kubeconfig file for it.
* `api`: a small synchronous HTTP client returning (status, decoded JSON, headers).
* `kubectl`: runs the real kubectl binary against the server.
* `widgets`: the test CRDs of `widgets-crd.yaml` installed (returns the widget resource path prefix).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from collections.abc import Callable

import pytest
import yaml
from apiserver_helpers import CRDS, WIDGETS, Api

from kvtier.testing.apiserver import ThreadedAPIServer

KUBECTL = pathlib.Path(sys.executable).parent / "kubectl"


@pytest.fixture
def apiserver():
    with ThreadedAPIServer() as server:
        yield server


@pytest.fixture
def kubeconfig(apiserver: ThreadedAPIServer, tmp_path: pathlib.Path) -> pathlib.Path:
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def api(apiserver: ThreadedAPIServer) -> Api:
    return Api(apiserver.url)


@pytest.fixture
def kubectl(kubeconfig: pathlib.Path, tmp_path: pathlib.Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`kubectl("get", "pods")` runs the real binary; `check=False` returns failures instead of raising."""
    env = {**os.environ, "KUBECACHEDIR": str(tmp_path / "kubecache"), "HOME": str(tmp_path)}

    def run(*args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(KUBECTL), "--kubeconfig", str(kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
            )
        return result

    return run


@pytest.fixture
def widgets(api: Api) -> str:
    for crd in yaml.safe_load_all(CRDS.read_text()):
        api.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    return WIDGETS
