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

from tests.chart import NAMESPACE, rule_triples, template
from tests.e2e.conftest import AUDIT_MODULE, DESELECTED

E2E = Path(__file__).parent


def operator_requests(records, where=lambda namespace: True) -> set[tuple[str, str, str]]:
    """The operator's (verb, group, resource[/subresource]) triples, of requests whose namespace passes `where`."""
    return {
        (r.verb, r.group, r.resource + (f"/{r.subresource}" if r.subresource else ""))
        for r in records
        if r.resource is not None and _operator(r.user_agent) and where(r.namespace)
    }


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
    own_namespace = cluster.cluster.operator.namespace
    in_own_namespace = operator_requests(records, lambda namespace: namespace == own_namespace)
    elsewhere = operator_requests(records, lambda namespace: namespace != own_namespace)
    rendered = template()
    granted = rule_triples(next(doc for doc in rendered if doc["kind"] == "ClusterRole")["rules"])
    # The operator's own namespace (wipe claims and Jobs) is granted by a Role there.
    own = rule_triples(
        next(doc for doc in rendered if doc["kind"] == "Role" and doc["metadata"]["namespace"] == NAMESPACE)["rules"]
    )
    ungranted = (elsewhere - granted) | (in_own_namespace - granted - own)
    unused = (granted - requested) | (own - in_own_namespace)
    print(f"the operator requested:\n{_table(requested)}")
    assert not ungranted and not unused, (
        f"requested but not granted by the chart's ClusterRole (or its Role in the operator's namespace):\n"
        f"{_table(ungranted) or '  (none)'}\n"
        f"granted but never requested:\n{_table(unused) or '  (none)'}"
    )


def test_the_operator_reads_namespaced_resources_one_namespace_at_a_time(cluster, request):
    """What makes the chart's Role-per-namespace variant (watchNamespaces) sufficient: apart from kopf's
    cluster-wide watches (which become per-namespace ones with `-n`), no request spans all namespaces
    of a namespaced resource."""
    _whole_suite(cluster, request)
    cluster_scoped = {
        "nodes",
        "persistentvolumes",
        "namespaces",
        "customresourcedefinitions",
        "kvpools",
        "storageclasses",
    }
    # Telemetry's pod watch follows `--namespace` as kopf's watches do (one per namespace when given).
    like_kopf = {("list", "", "pods"), ("watch", "", "pods")}
    spanning = {
        (r.verb, r.group, r.resource)
        for r in cluster.server.requests.records
        if r.user_agent == "kvtier-operator"
        and r.resource is not None
        and r.namespace is None
        and r.resource not in cluster_scoped
    } - like_kopf
    assert not spanning, f"all-namespace requests of namespaced resources:\n{_table(spanning)}"
