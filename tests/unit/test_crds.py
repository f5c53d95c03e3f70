"""The generated CRDs are current, valid apiextensions.k8s.io/v1 objects, and structural."""

import re
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from kvtier.api.crd import build_crds, to_yaml

CRDS = build_crds()
KUBERNETES_VERSION = "1.33"


def _schema(name):
    return CRDS[name]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_crds_directory_is_current(repo_root):
    on_disk = {path.name: path.read_text() for path in (repo_root / "crds").glob("*.yaml")}
    assert on_disk == {name: to_yaml(crd) for name, crd in CRDS.items()}, "run `kvtier crds --out crds/`"


def test_crds_check_command_detects_a_stale_file(tmp_path):
    kvtier = [sys.executable, "-m", "kvtier", "crds"]
    subprocess.run([*kvtier, "--out", str(tmp_path)], check=True, capture_output=True)
    assert subprocess.run([*kvtier, "--check", "--out", str(tmp_path)], capture_output=True).returncode == 0
    stale = tmp_path / "kvtier.io_kvpools.yaml"
    stale.write_text(stale.read_text().replace("shortNames", "shortnames"))
    result = subprocess.run([*kvtier, "--check", "--out", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 1
    assert "kvtier.io_kvpools.yaml: stale" in result.stderr


@pytest.mark.parametrize("name", sorted(CRDS))
def test_crd_is_a_valid_kubernetes_object(name):
    kubernetes_validate.validate(yaml.safe_load(to_yaml(CRDS[name])), KUBERNETES_VERSION, strict=True)


def _structural_violations(node, path="schema"):
    """The rules of a structural schema (apiextensions-apiserver), plus kvtier's own hygiene."""
    found = []
    for forbidden in ("$ref", "title", "anyOf", "oneOf", "allOf", "not", "definitions", "$defs"):
        if forbidden in node:
            found.append(f"{path}: has {forbidden}")
    open_ended = node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
    if "type" not in node and not open_ended:
        found.append(f"{path}: no type")
    if node.get("nullable") and "type" not in node:
        found.append(f"{path}: nullable without a type")
    if "additionalProperties" in node:
        if not isinstance(node["additionalProperties"], dict):
            found.append(f"{path}: additionalProperties must be a schema")
        if "properties" in node:
            found.append(f"{path}: properties and additionalProperties together")
    if isinstance(node.get("exclusiveMinimum"), (int, float)) and not isinstance(node["exclusiveMinimum"], bool):
        found.append(f"{path}: exclusiveMinimum must be a boolean in OpenAPI v3")
    if "default" in node:
        expected = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict}
        wanted = expected.get(node.get("type"))
        if wanted and not isinstance(node["default"], wanted):
            found.append(f"{path}: default {node['default']!r} is not a {node['type']}")
        if node.get("enum") and node["default"] not in node["enum"]:
            found.append(f"{path}: default {node['default']!r} not in enum")
    if node.get("x-kubernetes-list-type") == "map":
        item = node["items"]
        for key in node["x-kubernetes-list-map-keys"]:
            if key not in item.get("required", []) and "default" not in item["properties"][key]:
                found.append(f"{path}: list-map key {key} must be required or defaulted")
    if node.get("x-kubernetes-preserve-unknown-fields") and path.count(".") < 2:
        found.append(f"{path}: preserve-unknown-fields this high up opens the whole object")
    for key, child in node.get("properties", {}).items():
        found += _structural_violations(child, f"{path}.{key}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            found += _structural_violations(node[key], f"{path}.{key}")
    return found


@pytest.mark.parametrize("name", sorted(CRDS))
def test_schema_is_structural(name):
    assert _structural_violations(_schema(name)) == []


def test_structural_check_catches_what_pydantic_emits_by_default():
    # The checker must be able to fail: raw pydantic output is not structural.
    from kvtier.api import KVPool

    raw = KVPool.model_json_schema(by_alias=True)
    assert _structural_violations(raw)


def test_preserve_unknown_fields_only_where_deliberate():
    text = yaml.safe_dump(CRDS)
    assert text.count("x-kubernetes-preserve-unknown-fields") == 1  # engine.env[].valueFrom (an EnvVarSource)
    env_item = _schema("kvtier.io_inferencedeployments.yaml")["properties"]["spec"]["properties"]["engine"][
        "properties"
    ]["env"]["items"]
    assert env_item["properties"]["valueFrom"]["x-kubernetes-preserve-unknown-fields"] is True


def test_names_scope_and_subresources():
    pool = CRDS["kvtier.io_kvpools.yaml"]["spec"]
    infd = CRDS["kvtier.io_inferencedeployments.yaml"]["spec"]
    assert (pool["scope"], pool["names"]["shortNames"], pool["names"]["categories"]) == ("Cluster", ["kvp"], ["kvtier"])
    assert (infd["scope"], infd["names"]["shortNames"], infd["names"]["categories"]) == (
        "Namespaced",
        ["infd"],
        ["kvtier"],
    )
    assert pool["versions"][0]["subresources"] == {"status": {}}
    assert infd["versions"][0]["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    status = infd["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["selector"]["type"] == "string" and status["replicas"]["type"] == "integer"


def _resolves(schema, json_path):
    node = schema
    for part in re.sub(r"\[[^\]]*\]", "", json_path).lstrip(".").split("."):
        if part == "metadata":
            return True
        node = node.get("properties", {}).get(part) or (node.get("items") or {}).get("properties", {}).get(part)
        if node is None:
            return False
    return True


@pytest.mark.parametrize("name", sorted(CRDS))
def test_printer_columns_point_at_real_fields(name):
    columns = CRDS[name]["spec"]["versions"][0]["additionalPrinterColumns"]
    for column in columns:
        assert _resolves(_schema(name), column["jsonPath"]), column


def test_printer_columns_show_what_design_asks_for():
    def names(file):
        return {c["name"] for c in CRDS[file]["spec"]["versions"][0]["additionalPrinterColumns"]}

    assert {"Capacity", "Allocated", "Available", "Ready"} <= names("kvtier.io_kvpools.yaml")
    assert {"Ready", "Watermark", "Hit", "Quota"} <= names("kvtier.io_inferencedeployments.yaml")


def test_defaults_written_deliberately():
    spec = _schema("kvtier.io_inferencedeployments.yaml")["properties"]["spec"]["properties"]
    # No `{}` default for kvCache: a real API server refuses a default its own rules reject (the default
    # mode needs cpu), and the whole CRD with it.
    assert "default" not in spec["kvCache"]
    assert spec["kvCache"]["properties"]["mode"]["default"] == "LMCacheMP"
    assert "default" not in spec["kvCache"]["properties"]["storage"]["properties"]["max"]
    rebalance = _schema("kvtier.io_kvpools.yaml")["properties"]["spec"]["properties"]["rebalance"]
    assert rebalance["default"] == {} and rebalance["properties"]["interval"]["default"] == "1m"


def _undocumented(node, path):
    """Every property under `node` (through arrays and maps) without a non-empty description."""
    missing = []
    for name, child in node.get("properties", {}).items():
        child_path = f"{path}.{name}"
        if child_path == ".metadata":  # kube-apiserver forbids a description there (ObjectMeta documents itself)
            missing += _undocumented(child, child_path)
            continue
        if not str(child.get("description", "")).strip():
            missing.append(child_path)
        missing += _undocumented(child, child_path)
    if isinstance(node.get("items"), dict):
        missing += _undocumented(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        missing += _undocumented(node["additionalProperties"], f"{path}{{}}")
    return missing


@pytest.mark.parametrize("name", sorted(CRDS))
def test_every_property_has_a_description(repo_root, name):
    """What `kubectl explain` prints: the generated files (crds/, the chart's copy) document every field."""
    for path in (repo_root / "crds" / name, repo_root / "charts" / "kvtier-operator" / "crds" / name):
        schema = yaml.safe_load(path.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        assert _undocumented(schema, "") == [], f"{path}: properties without a description"


def test_the_description_walker_finds_a_missing_description():
    schema = {
        "properties": {
            "spec": {
                "description": "s",
                "properties": {
                    "list": {"description": "l", "items": {"properties": {"hidden": {"type": "string"}}}},
                    "map": {"description": "m", "additionalProperties": {"properties": {"deep": {"description": " "}}}},
                },
            }
        }
    }
    assert _undocumented(schema, "") == [".spec.list[].hidden", ".spec.map{}.deep"]


def test_descriptions_state_units_and_defaults():
    """Spot checks that the descriptions say what an operator needs, not only what the field is."""
    infd = _schema("kvtier.io_inferencedeployments.yaml")["properties"]["spec"]["properties"]
    kv_cache = infd["kvCache"]["properties"]
    assert "default 256" in kv_cache["chunkSize"]["description"]
    assert "default 1" in infd["replicas"]["description"]
    assert "default: `request`" in kv_cache["storage"]["properties"]["max"]["description"]
    assert "default 0" in kv_cache["storage"]["properties"]["min"]["description"]
    status = _schema("kvtier.io_inferencedeployments.yaml")["properties"]["status"]["properties"]["kv"]["properties"]
    assert "seconds" in status["ttftP50Seconds"]["description"]
    rebalance = _schema("kvtier.io_kvpools.yaml")["properties"]["spec"]["properties"]["rebalance"]["properties"]
    assert "default 1m" in rebalance["interval"]["description"]
    assert "default 1m" in rebalance["cooldown"]["description"]
