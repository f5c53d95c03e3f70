"""`kvtier render`: the children of every InferenceDeployment in the files, as a YAML stream."""

import subprocess
import sys

import kubernetes_validate
import yaml

from tests.conftest import EXAMPLES

DEPLOYMENT = """\
apiVersion: kvtier.io/v1alpha1
kind: InferenceDeployment
metadata: {{name: {name}, namespace: ml}}
spec:
  replicas: {replicas}
  model: {{name: m, kvBytesPerToken: 131072}}
  engine: {{image: vllm/vllm-openai:v0.33.0}}
  kvCache:
    cpu: {{size: 16Gi}}
    storage: {{poolRef: fx100-a, request: 1Ti}}
"""


def kvtier_render(*args):
    return subprocess.run([sys.executable, "-m", "kvtier", "render", *args], capture_output=True, text=True)


def test_examples_render_into_valid_objects():
    result = kvtier_render("-f", str(EXAMPLES))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    objects = list(yaml.safe_load_all(result.stdout))
    kinds = [obj["kind"] for obj in objects]
    assert kinds == ["Service", "Service", "StatefulSet", "PodDisruptionBudget", "PersistentVolume", "PersistentVolume"]
    for obj in objects:
        kubernetes_validate.validate(obj, "1.33", strict=True)
    claims = {pv["spec"]["claimRef"]["name"] for pv in objects if pv["kind"] == "PersistentVolume"}
    assert claims == {"kv-store-coder-480b-0", "kv-store-coder-480b-1"}


def test_pod_monitor_on_request():
    result = kvtier_render("-f", str(EXAMPLES), "--pod-monitor")
    assert "PodMonitor" in [obj["kind"] for obj in yaml.safe_load_all(result.stdout)]


def test_a_pool_missing_from_the_files_is_said_and_storage_left_out():
    result = kvtier_render("-f", str(EXAMPLES / "inferencedeployment.yaml"))
    assert result.returncode == 0
    assert "KVPool fx100-a is not in the files: rendered without the storage tier" in result.stderr
    objects = list(yaml.safe_load_all(result.stdout))
    assert "PersistentVolume" not in [obj["kind"] for obj in objects]
    (sts,) = [obj for obj in objects if obj["kind"] == "StatefulSet"]
    assert "volumeClaimTemplates" not in sts["spec"]


def test_deployments_sharing_a_static_pool_get_distinct_namespaces(tmp_path):
    manifest = tmp_path / "two.yaml"
    manifest.write_text(DEPLOYMENT.format(name="a", replicas=3) + "---\n" + DEPLOYMENT.format(name="b", replicas=2))
    result = kvtier_render("-f", str(EXAMPLES / "kvpool.yaml"), "-f", str(manifest))
    assert result.returncode == 0, result.stderr
    volumes = [obj for obj in yaml.safe_load_all(result.stdout) if obj["kind"] == "PersistentVolume"]
    assert len(volumes) == 5
    assert len({pv["spec"]["csi"]["volumeHandle"] for pv in volumes}) == 5


def test_an_exhausted_pool_fails_with_its_reason(tmp_path):
    manifest = tmp_path / "many.yaml"
    manifest.write_text(DEPLOYMENT.format(name="a", replicas=9))
    result = kvtier_render("-f", str(EXAMPLES / "kvpool.yaml"), "-f", str(manifest))
    assert result.returncode == 1
    assert f"{manifest}: InferenceDeployment/a: InsufficientCapacity: KVPool fx100-a has 8 free" in result.stderr


def test_invalid_manifests_are_reported_like_validate(tmp_path):
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(DEPLOYMENT.format(name="a", replicas=-1))
    result = kvtier_render("-f", str(manifest))
    assert result.returncode == 1
    assert f"{manifest}: InferenceDeployment/a: spec.replicas:" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_deployment_without_a_name_is_reported_not_rendered(tmp_path):
    manifest = tmp_path / "unnamed.yaml"
    manifest.write_text(DEPLOYMENT.format(name="a", replicas=1).replace("name: a,", "generateName: a-,"))
    result = kvtier_render("-f", str(manifest))
    assert result.returncode == 1 and result.stdout == ""
    assert "metadata.name: required to render" in result.stderr
    assert "Traceback" not in result.stderr
