"""The Helm chart, with the real `helm`: it lints, every rendered object is a valid Kubernetes object (for
the oldest Kubernetes the CRDs support and the newest schemas we have), its CRDs are the generated
ones, manifests/install.yaml is current, values are checked by the schema, and the operator's pod is
locked down."""

from __future__ import annotations

import json
import re
import subprocess

import kubernetes_validate
import pytest
import yaml

from kvtier.cli.services import run as run_command
from tests.chart import CHART, HELM, NAMESPACE, helm, rule_triples, template
from tests.conftest import REPO_ROOT

#: The CRDs' CEL rules need Kubernetes 1.29 (Chart.yaml kubeVersion); and the newest schemas kubernetes-validate has.
KUBERNETES_VERSIONS = ("1.29.0", "1.35.0")
#: Kinds of other projects' CRDs (no schema in kubernetes-validate): checked by hand below.
CUSTOM_KINDS = {"ServiceMonitor", "ClusterKopfPeering", "KopfPeering"}
#: `kvtier run` flags the telemetry work adds (issue 6); the chart already passes them.
EVERYTHING = {
    "watchNamespaces": ["ml-prod", "ml-dev"],
    "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    "dashboard": {"enabled": True, "namespace": "monitoring"},
    "metrics": {"source": "prometheus", "prometheusUrl": "http://prometheus.monitoring:9090", "scrapeInterval": 30},
    "peering": {"enabled": True, "priority": 10},
    "engines": {
        "podMonitor": True,
        "simulated": True,
        "lmcacheImage": "lmcache/vllm-openai:v0.5.6",
        "wipeImage": "registry.example/tools:wipe",
    },
    "image": {"repository": "registry.example/kvtier", "tag": "dev", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "regcred"}],
    "resources": {"requests": {"cpu": "200m", "memory": "512Mi"}, "limits": {"cpu": "2", "memory": "2Gi"}},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "control", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist"}]}
                ]
            }
        }
    },
    "priorityClassName": "system-cluster-critical",
    "podAnnotations": {"example.com/team": "ml"},
}
VALUES = {"default": None, "everything": EVERYTHING}


def one(objects, kind, name=None):
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def operator_container(objects):
    return one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def test_helm_lint_passes_with_default_and_other_values(tmp_path):
    helm("lint", "--strict", str(CHART))
    values = tmp_path / "values.yaml"
    values.write_text(json.dumps(EVERYTHING))
    helm("lint", "--strict", str(CHART), "--values", str(values))


@pytest.mark.parametrize("values", sorted(VALUES))
def test_every_rendered_object_is_valid(values):
    objects = template(VALUES[values], "--include-crds")
    kinds = {o["kind"] for o in objects}
    assert {
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Service",
        "Deployment",
    } <= kinds
    for obj in objects:
        if obj["kind"] in CUSTOM_KINDS:
            continue
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                pytest.fail(
                    f"{obj['kind']}/{obj['metadata']['name']} on Kubernetes {version}: {error.message} "
                    f"at {'.'.join(map(str, error.path))}"
                )


def test_every_object_is_in_the_release_namespace_or_cluster_scoped():
    cluster_kinds = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "ClusterKopfPeering"}
    for obj in template(EVERYTHING):
        namespace = obj["metadata"].get("namespace")
        if obj["kind"] in cluster_kinds:
            assert namespace is None, obj["metadata"]
        elif obj["kind"] in ("Role", "RoleBinding") and obj["metadata"]["name"].endswith("-reclaim"):
            assert namespace == NAMESPACE
        elif obj["kind"] in ("Role", "RoleBinding", "KopfPeering"):
            assert namespace in EVERYTHING["watchNamespaces"]
        elif obj["kind"] == "ConfigMap":
            assert namespace == "monitoring"
        else:
            assert namespace == NAMESPACE, obj["metadata"]


def test_the_operator_pod_is_locked_down_and_alone():
    objects = template()
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = operator_container(objects)
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    liveness = [a for a in container["args"] if a.startswith("--liveness=")]
    assert liveness == ["--liveness=http://0.0.0.0:8081/healthz"]
    health = next(p for p in container["ports"] if p["name"] == "health")["containerPort"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"} and health == 8081
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert pod["serviceAccountName"] == one(objects, "ServiceAccount")["metadata"]["name"]


def _run_flags(args):
    return {arg.split("=", 1)[0] for arg in args if arg.startswith("-")}


@pytest.mark.parametrize("values", sorted(VALUES))
def test_the_operator_arguments_are_kvtier_run_options(values):
    container = operator_container(template(VALUES[values]))
    assert container["command"] == ["kvtier", "run"]
    known = {opt for param in run_command.params for opt in param.opts}
    unknown = _run_flags(container["args"]) - known
    assert not unknown, f"not `kvtier run` options: {sorted(unknown)}"
    params = run_command.make_context("run", list(container["args"])).params
    if values == "everything":
        assert params["namespaces"] == ("ml-prod", "ml-dev")
        assert params["peering"] == "kvtier" and params["priority"] == 10
        assert params["simulated_engine_image"] == params["probe_image"] == "registry.example/kvtier:dev"
        assert params["pod_monitor"] is True and params["lmcache_image"] == "lmcache/vllm-openai:v0.5.6"
        assert params["wipe_image"] == "registry.example/tools:wipe"
        assert params["prometheus_url"] == "http://prometheus.monitoring:9090"
        assert params["metrics_source"] == "prometheus" and params["scrape_interval"] == 30
    else:
        assert params["namespaces"] == () and params["peering"] is None and params["simulated_engine_image"] is None
        assert params["probe_image"] == "ghcr.io/kvtier/kvtier-operator:0.1.0"
        assert params["metrics_source"] == "scrape" and params["metrics_port"] == 8080


def test_metrics_service_and_service_monitor_point_at_the_operator():
    objects = template(EVERYTHING)
    service = one(objects, "Service")
    deployment = one(objects, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}]
    assert any(p["name"] == "metrics" for p in operator_container(objects)["ports"])
    monitor = one(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    assert not [o for o in template() if o["kind"] in ("ServiceMonitor", "ConfigMap")]


def test_the_dashboard_config_map_carries_the_dashboard():
    config_map = one(template(EVERYTHING), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["kvtier.json"]) == json.loads(
        (CHART / "dashboards" / "kvtier.json").read_text()
    )


def test_peering_objects_match_the_scope():
    cluster_wide = template({"peering": {"enabled": True}})
    peering = one(cluster_wide, "ClusterKopfPeering")
    assert peering["apiVersion"] == "kopf.dev/v1" and peering["metadata"]["name"] == "kvtier"
    assert ("patch", "kopf.dev", "clusterkopfpeerings") in rule_triples(one(cluster_wide, "ClusterRole")["rules"])
    namespaced = template(EVERYTHING)
    assert sorted(o["metadata"]["namespace"] for o in namespaced if o["kind"] == "KopfPeering") == ["ml-dev", "ml-prod"]
    for role in watched_namespace_roles(namespaced):
        assert {("list", "kopf.dev", "kopfpeerings"), ("watch", "kopf.dev", "kopfpeerings")} <= rule_triples(
            role["rules"]
        )
    crds = {
        doc["spec"]["names"]["kind"]: doc
        for doc in yaml.safe_load_all((CHART / "crds" / "kopf.dev_peerings.yaml").read_text())
    }
    assert {kind: crd["spec"]["scope"] for kind, crd in crds.items()} == {
        "ClusterKopfPeering": "Cluster",
        "KopfPeering": "Namespaced",
    }


def watched_namespace_roles(objects):
    """The Roles of `watchNamespaces` (not the operator's own `-reclaim` Role)."""
    return [o for o in objects if o["kind"] == "Role" and not o["metadata"]["name"].endswith("-reclaim")]


def test_the_operator_namespace_role_covers_only_volume_wipes():
    for values in VALUES.values():
        objects = template(values)
        role = next(o for o in objects if o["kind"] == "Role" and o["metadata"]["name"].endswith("-reclaim"))
        binding = next(
            o for o in objects if o["kind"] == "RoleBinding" and o["metadata"]["name"] == role["metadata"]["name"]
        )
        assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == NAMESPACE
        assert {resource for _, _, resource in rule_triples(role["rules"])} == {"jobs", "persistentvolumeclaims"}
        env = {e["name"]: e for e in operator_container(objects)["env"]}
        assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_watching_namespaces_moves_namespaced_permissions_into_roles():
    default = rule_triples(one(template(), "ClusterRole")["rules"])
    objects = template({"watchNamespaces": ["ml-prod", "ml-dev"]})
    cluster = rule_triples(one(objects, "ClusterRole")["rules"])
    roles = watched_namespace_roles(objects)
    bindings = [o for o in objects if o["kind"] == "RoleBinding" and not o["metadata"]["name"].endswith("-reclaim")]
    assert (
        sorted(r["metadata"]["namespace"] for r in roles)
        == sorted(b["metadata"]["namespace"] for b in bindings)
        == ["ml-dev", "ml-prod"]
    )
    namespaced = rule_triples(roles[0]["rules"])
    assert all(rule_triples(r["rules"]) == namespaced for r in roles)
    # The same permissions as cluster-wide, plus listing/watching namespaces (kopf follows the named ones) ...
    assert cluster | namespaced == default | {("list", "", "namespaces"), ("watch", "", "namespaces")}
    # ... and nothing namespaced left in the ClusterRole.
    cluster_scoped = {
        "customresourcedefinitions",
        "nodes",
        "kvpools",
        "kvpools/status",
        "persistentvolumes",
        "storageclasses",
        "namespaces",
    }
    # ... but Events, which a KVPool's go to `default` whatever namespaces are watched.
    assert {resource for _, _, resource in cluster} == cluster_scoped | {"events"}
    assert not {resource for _, _, resource in namespaced} & (cluster_scoped | {"events"})
    container = operator_container(objects)
    assert [a for a in container["args"] if a.startswith("--namespace=")] == [
        "--namespace=ml-prod",
        "--namespace=ml-dev",
    ]


def test_rbac_has_no_wildcards_and_no_versioned_groups():
    for values in VALUES.values():
        for role in (o for o in template(values) if o["kind"] in ("ClusterRole", "Role")):
            for rule in role["rules"]:
                for key in ("apiGroups", "resources", "verbs"):
                    assert "*" not in rule[key], rule
                assert not any("/" in group for group in rule["apiGroups"]), rule


@pytest.mark.parametrize(
    "values, message",
    [
        ({"metrics": {"source": "graphite"}}, "/metrics/source"),
        ({"metrics": {"source": "prometheus"}}, "prometheusUrl"),
        ({"watchNamespaces": ["Not_A_Namespace"]}, "watchNamespaces"),
        ({"replicas": 2}, "replicas"),
        ({"image": {"repository": ""}}, "/image/repository"),
        ({"resyncSeconds": 0}, "resyncSeconds"),
    ],
)
def test_the_values_schema_refuses_bad_values(tmp_path, values, message):
    path = tmp_path / "values.yaml"
    path.write_text(json.dumps(values))
    result = helm("template", "x", str(CHART), "--values", str(path), check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_the_chart_crds_are_the_generated_ones():
    generated = sorted(p.name for p in (REPO_ROOT / "crds").glob("*.yaml"))
    in_chart = sorted(p.name for p in (CHART / "crds").glob("*.yaml") if not p.name.startswith("kopf.dev_"))
    assert in_chart == generated
    for name in generated:
        assert (CHART / "crds" / name).read_text() == (REPO_ROOT / "crds" / name).read_text(), name


def test_install_yaml_and_every_generated_file_is_current():
    result = subprocess.run(
        [str(REPO_ROOT / "hack" / "generate.sh"), "--check"], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT
    )
    assert result.returncode == 0, result.stderr
    install = [doc for doc in yaml.safe_load_all((REPO_ROOT / "manifests" / "install.yaml").read_text()) if doc]
    assert install[0] == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "labels": {"app.kubernetes.io/part-of": "kvtier"}},
    }
    rendered = template(None, "--include-crds")
    assert install[1:] == rendered


def test_helm_binary_is_a_real_helm():
    version = helm("version", "--template", "{{.Version}}").stdout
    assert re.fullmatch(r"v[34]\.\d+\.\d+", version), version
    assert HELM.stat().st_size > 10_000_000
