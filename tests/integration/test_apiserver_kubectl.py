"""The real kubectl binary against the embedded API server."""

from __future__ import annotations

import json
import threading
import time

import yaml
from apiserver_helpers import CRDS, MERGE

WIDGET = """
apiVersion: test.kvtier.io/v1
kind: Widget
metadata:
  name: w
  labels: {app: demo}
spec:
  size: large
  replicas: 2
  engine:
    args: ["--a"]
"""

DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
        - name: main
          image: main:1
          env: [{name: A, value: "1"}]
        - name: sidecar
          image: side:1
"""


def install(kubectl) -> None:
    kubectl("apply", "-f", str(CRDS))
    kubectl("wait", "--for=condition=Established", "crd/widgets.test.kvtier.io", "--timeout=10s")


def test_apply_and_get_with_printer_columns(kubectl, api, apiserver):
    install(kubectl)
    out = kubectl("apply", "-f", "-", stdin=WIDGET).stdout
    assert "widget.test.kvtier.io/w created" in out
    api.ok(
        "PATCH",
        "/apis/test.kvtier.io/v1/namespaces/default/widgets/w/status",
        {"status": {"kv": {"hitRatio": {"total": 0.5}}}},
        content_type=MERGE,
    )
    lines = kubectl("get", "widgets").stdout.splitlines()
    assert lines[0].split() == ["NAME", "SIZE", "REPLICAS", "HIT", "AGE"]
    assert lines[1].split()[:4] == ["w", "large", "2", "0.5"]
    assert kubectl("get", "wdg", "-o", "name").stdout.strip() == "widget.test.kvtier.io/w"  # short name
    assert kubectl("get", "kvtier-test").stdout.splitlines()[1].startswith("w ")  # category
    got = json.loads(kubectl("get", "widget", "w", "-o", "json").stdout)
    assert got["spec"]["engine"]["image"] == "vllm/vllm-openai:latest"  # server-side default
    # Re-applying a changed manifest patches the object (client-side apply, JSON merge patch for CRs).
    out = kubectl("apply", "-f", "-", stdin=WIDGET.replace("replicas: 2", "replicas: 3")).stdout
    assert "widget.test.kvtier.io/w configured" in out
    assert json.loads(kubectl("get", "widget", "w", "-o", "json").stdout)["spec"]["replicas"] == 3
    assert "unchanged" in kubectl("apply", "-f", "-", stdin=WIDGET.replace("replicas: 2", "replicas: 3")).stdout
    assert {"create", "patch"} <= {r.verb for r in apiserver.requests.filter(resource="widgets")}


def test_apply_rejects_invalid_resources_with_the_field(kubectl):
    install(kubectl)
    bad = kubectl("apply", "-f", "-", stdin=WIDGET.replace("size: large", "size: huge"), check=False)
    assert bad.returncode != 0 and "spec.size" in bad.stderr and "Unsupported value" in bad.stderr
    unknown = kubectl("apply", "-f", "-", stdin=WIDGET.replace("replicas: 2", "replicas: 2\n  bogus: 1"), check=False)
    assert unknown.returncode != 0 and 'unknown field "spec.bogus"' in unknown.stderr
    assert (
        kubectl(
            "apply", "--validate=false", "-f", "-", stdin=WIDGET.replace("replicas: 2", "replicas: 2\n  bogus: 1")
        ).returncode
        == 0
    )


def test_scale(kubectl):
    install(kubectl)
    kubectl("apply", "-f", "-", stdin=WIDGET)
    assert "scaled" in kubectl("scale", "widget/w", "--replicas=5").stdout
    assert json.loads(kubectl("get", "widget", "w", "-o", "json").stdout)["spec"]["replicas"] == 5
    kubectl("apply", "-f", "-", stdin=DEPLOYMENT)
    kubectl("scale", "deployment/web", "--replicas=4")
    assert kubectl("get", "deploy", "web", "-o", "jsonpath={.spec.replicas}").stdout == "4"


def test_patch_merge_json_and_strategic(kubectl):
    install(kubectl)
    kubectl("apply", "-f", "-", stdin=WIDGET)
    kubectl("patch", "widget", "w", "--type=merge", "-p", '{"spec":{"size":"small"}}')
    kubectl("patch", "widget", "w", "--type=json", "-p", '[{"op":"replace","path":"/spec/replicas","value":7}]')
    got = json.loads(kubectl("get", "widget", "w", "-o", "json").stdout)
    assert got["spec"]["size"] == "small" and got["spec"]["replicas"] == 7
    refused = kubectl("patch", "widget", "w", "-p", '{"spec":{"size":"medium"}}', check=False)  # strategic on a CR
    assert refused.returncode != 0
    kubectl("apply", "-f", "-", stdin=DEPLOYMENT)
    kubectl(
        "patch",
        "deployment",
        "web",
        "-p",
        '{"spec":{"template":{"spec":{"containers":[{"name":"main","image":"main:2"}]}}}}',
    )
    containers = json.loads(kubectl("get", "deploy", "web", "-o", "json").stdout)["spec"]["template"]["spec"][
        "containers"
    ]
    assert [(c["name"], c["image"]) for c in containers] == [("main", "main:2"), ("sidecar", "side:1")]
    assert containers[0]["env"] == [{"name": "A", "value": "1"}]


def test_delete_waits_for_finalizers(kubectl):
    install(kubectl)
    manifest = yaml.safe_load(WIDGET)
    manifest["metadata"]["finalizers"] = ["test.kvtier.io/hold"]
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(manifest))
    kubectl("delete", "widget", "w", "--wait=false")
    got = json.loads(kubectl("get", "widget", "w", "-o", "json").stdout)
    assert got["metadata"]["deletionTimestamp"]
    waiter = threading.Thread(
        target=lambda: (
            time.sleep(0.5),
            kubectl("patch", "widget", "w", "--type=merge", "-p", '{"metadata":{"finalizers":null}}'),
        )
    )
    waiter.start()
    kubectl("wait", "--for=delete", "widget/w", "--timeout=10s")  # a watch that sees the DELETED event
    waiter.join()
    missing = kubectl("get", "widget", "w", check=False)
    assert missing.returncode != 0 and "NotFound" in missing.stderr


def test_server_side_apply(kubectl):
    install(kubectl)
    out = kubectl("apply", "--server-side", "-f", "-", stdin=WIDGET).stdout
    assert "serverside-applied" in out
    got = json.loads(kubectl("get", "widget", "w", "-o", "json", "--show-managed-fields").stdout)
    assert {e["manager"] for e in got["metadata"]["managedFields"]} == {"kubectl"}
    kubectl("patch", "widget", "w", "--type=merge", "-p", '{"spec":{"replicas":9}}')
    conflict = kubectl("apply", "--server-side", "-f", "-", stdin=WIDGET, check=False)
    assert conflict.returncode != 0 and "conflict" in conflict.stderr.lower() and ".spec.replicas" in conflict.stderr
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=WIDGET)
    assert kubectl("get", "widget", "w", "-o", "jsonpath={.spec.replicas}").stdout == "2"
    # Built-ins too, with kubectl's default strict field validation.
    assert "serverside-applied" in kubectl("apply", "--server-side", "-f", "-", stdin=DEPLOYMENT).stdout
    bogus = kubectl("apply", "-f", "-", stdin=DEPLOYMENT.replace("replicas: 1", "replicas: 1\n  bogus: 1"), check=False)
    assert bogus.returncode != 0 and 'unknown field "spec.bogus"' in bogus.stderr


def test_namespaces_and_builtins(kubectl):
    # `kubectl create <generator>` sends protobuf: understood for namespaces, configmaps, secrets and
    # serviceaccounts, refused (415) for other kinds.
    kubectl("create", "namespace", "team")
    kubectl("-n", "team", "create", "configmap", "settings", "--from-literal=a=b")
    kubectl("-n", "team", "create", "secret", "generic", "pw", "--from-literal=pw=hunter2")
    kubectl("-n", "team", "create", "serviceaccount", "robot")
    secret = json.loads(kubectl("-n", "team", "get", "secret", "pw", "-o", "json").stdout)
    assert secret["data"] == {"pw": "aHVudGVyMg=="} and secret["type"] == "Opaque"
    assert "generateName" not in secret["metadata"]
    refused = kubectl("-n", "team", "create", "deployment", "x", "--image=x", check=False)
    assert refused.returncode != 0 and "unknown format" in refused.stderr
    kubectl("-n", "team", "apply", "-f", "-", stdin=DEPLOYMENT)
    lines = kubectl("get", "configmaps,deployments", "-n", "team").stdout
    assert "configmap/settings" in lines and "deployment.apps/web" in lines
    kubectl("label", "-n", "team", "configmap", "settings", "tier=gold")
    assert kubectl("get", "cm", "-n", "team", "-l", "tier=gold", "-o", "name").stdout.strip() == "configmap/settings"
    assert (
        kubectl("get", "cm", "-A", "--field-selector", "metadata.name=settings", "-o", "name").stdout.strip()
        == "configmap/settings"
    )
    kubectl("delete", "namespace", "team", "--timeout=10s")
    assert kubectl("get", "namespace", "team", check=False).returncode != 0


def test_builtin_columns(kubectl, api):
    pod = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "a", "image": "a"}, {"name": "b", "image": "b"}]},
    }
    api.ok("POST", "/api/v1/namespaces/default/pods", pod)
    api.ok(
        "PATCH",
        "/api/v1/namespaces/default/pods/p/status",
        {
            "status": {
                "phase": "Running",
                "podIP": "127.0.0.5",
                "containerStatuses": [
                    {"name": "a", "ready": True, "restartCount": 2, "image": "a", "imageID": "", "state": {}},
                    {"name": "b", "ready": False, "restartCount": 1, "image": "b", "imageID": "", "state": {}},
                ],
            }
        },
        content_type=MERGE,
    )
    lines = kubectl("get", "pods", "-o", "wide").stdout.splitlines()
    assert lines[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"]
    assert lines[1].split()[:4] == ["p", "1/2", "Running", "3"] and lines[1].split()[5:] == ["127.0.0.5", "<none>"]
    kubectl("apply", "-f", "-", stdin=DEPLOYMENT)
    lines = kubectl("get", "deployments").stdout.splitlines()
    assert lines[0].split() == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
    assert lines[1].split()[:4] == ["web", "0/1", "0", "0"]
    api.ok(
        "POST",
        "/api/v1/namespaces/default/events",
        {
            "metadata": {"name": "web.1"},
            "involvedObject": {"kind": "Deployment", "name": "web", "namespace": "default"},
            "reason": "Rebalanced",
            "message": "moved 1Ti",
            "type": "Normal",
            "lastTimestamp": "2026-01-01T00:00:00Z",
        },
    )
    lines = kubectl("get", "events").stdout.splitlines()
    assert lines[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert lines[1].split()[1:] == ["Normal", "Rebalanced", "deployment/web", "moved", "1Ti"]
