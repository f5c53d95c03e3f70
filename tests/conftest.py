"""Shared test helpers: where the repository and the shared fixtures live."""

import pathlib

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = REPO_ROOT / "manifests" / "examples"


@pytest.fixture(scope="session")
def repo_root() -> pathlib.Path:
    return REPO_ROOT
