"""RBAC audit: the chart's ClusterRole grants exactly what the operator requested during the e2e suite.

Runs last in the session (tests/e2e/conftest.py), reading the embedded API server's request log:
every request by the operator, its own client (user agent `kvtier-operator`) and kopf's (`kopf/...`),
becomes (verb, group, resource[/subresource]); the log records verbs as the API server authorizes
them (`watch` for a GET with watch=1, `list` for a collection GET, `update` for PUT, `patch`, ...).
Non-resource requests (discovery: /api, /apis, /version) are allowed to every authenticated user by
the default `system:discovery` ClusterRole and are not audited. On a real cluster
(KVTIER_E2E_KUBECONFIG) there is no request log: the audit skips.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chart import rule_triples, template
from tests.e2e.conftest import AUDIT_MODULE, DESELECTED

E2E = Path(__file__).parent


def operator_requests(records) -> set[tuple[str, str, str]]:
    return {(r.verb, r.group, r.resource + (f"/{r.subresource}" if r.subresource else ""))
            for r in records if r.resource is not None and _operator(r.user_agent)}


def _operator(user_agent: str) -> bool:
    return user_agent == "kvtier-operator" or user_agent.startswith("kopf/")


def _whole_suite(cluster, request) -> None:
    if not cluster.embedded:
        pytest.skip("needs the embedded API server's request log (on a real cluster, read the API server's audit log)")
    ran = {item.path.name for item in request.session.items if item.path.parent == E2E}
    missing = sorted({path.name for path in E2E.glob("test_*.py")} - ran - {AUDIT_MODULE})
    deselected = request.config.stash.get(DESELECTED, [])
    if missing or deselected:
        pytest.skip(f"audits the whole e2e suite; not in this session: {missing + deselected}")


def _table(triples) -> str:
    return "\n".join(f"  {verb:<7} {group or '(core)':<22} {resource}" for verb, group, resource in sorted(triples))


def test_the_cluster_role_grants_exactly_what_the_operator_requests(cluster, request):
    _whole_suite(cluster, request)
    records = cluster.server.requests.records
    agents = {r.user_agent.split("/")[0] for r in records if r.resource is not None and _operator(r.user_agent)}
    assert agents == {"kvtier-operator", "kopf"}, f"expected requests from the operator and kopf, saw {agents}"
    requested = operator_requests(records)
    role = next(doc for doc in template() if doc["kind"] == "ClusterRole")
    granted = rule_triples(role["rules"])
    ungranted, unused = requested - granted, granted - requested
    print(f"the operator requested:\n{_table(requested)}")
    assert not ungranted and not unused, (
        f"requested but not granted by the chart's ClusterRole:\n{_table(ungranted) or '  (none)'}\n"
        f"granted but never requested:\n{_table(unused) or '  (none)'}"
    )


def test_the_operator_reads_namespaced_resources_one_namespace_at_a_time(cluster, request):
    """What makes the chart's Role-per-namespace variant (watchNamespaces) sufficient: apart from kopf's
    cluster-wide watches (which become per-namespace ones with `-n`), no request spans all namespaces
    of a namespaced resource."""
    _whole_suite(cluster, request)
    cluster_scoped = {"nodes", "persistentvolumes", "namespaces", "customresourcedefinitions", "kvpools",
                      "storageclasses"}
    spanning = {(r.verb, r.group, r.resource) for r in cluster.server.requests.records
                if r.user_agent == "kvtier-operator" and r.resource is not None and r.namespace is None
                and r.resource not in cluster_scoped}
    assert not spanning, f"all-namespace requests of namespaced resources:\n{_table(spanning)}"
