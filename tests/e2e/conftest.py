"""The RBAC audit reads what the whole e2e suite made the operator request: it runs last."""

from __future__ import annotations

AUDIT_MODULE = "test_rbac_audit.py"


def pytest_collection_modifyitems(session, config, items):
    """Move the audit after every other test of the session (other tests keep their order)."""
    audit = [item for item in items if item.path.name == AUDIT_MODULE]
    if audit:
        items[:] = [item for item in items if item.path.name != AUDIT_MODULE] + audit


def pytest_deselected(items):
    """Remember deselected e2e tests: the audit needs them all to have run."""
    for item in items:
        if item.path.parent.name == "e2e":
            item.config.stash.setdefault(_DESELECTED, []).append(item.nodeid)


from pytest import StashKey  # noqa: E402 - after the hooks it serves

_DESELECTED: StashKey[list[str]] = StashKey()
DESELECTED = _DESELECTED
