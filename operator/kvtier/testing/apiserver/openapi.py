"""OpenAPI v3 documents, enough for kubectl.

kubectl (>= 1.27) decides how to validate `apply`/`create` by looking, in
`/openapi/v3/<group-version>`, for a PATCH operation tagged with the kind's
`x-kubernetes-group-version-kind` that accepts the `fieldValidation` query parameter.  Every
group/version served here declares that parameter for each resource, so kubectl delegates
validation to the server (`fieldValidation=Strict`), which enforces CRD schemas.  Component schemas
are published for custom resources (from their CRDs, for `kubectl explain`); built-in kinds get
paths only, no component schemas.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .resources import Registry, ResourceType

_OBJECT_META = {
    "type": "object",
    "x-kubernetes-preserve-unknown-fields": True,
    "description": "Standard object's metadata.",
}


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def schema_name(rt: ResourceType) -> str:
    """The component name Kubernetes uses: reversed group, version, kind (io.kvtier.v1alpha1.KVPool)."""
    group = ".".join(reversed(rt.group.split("."))) if rt.group else "io.k8s.api.core"
    return f"{group}.{rt.version}.{rt.kind}"


def _gvk(rt: ResourceType) -> dict[str, str]:
    return {"group": rt.group, "version": rt.version, "kind": rt.kind}


def group_version_document(
    registry: Registry, group: str, version: str, kubernetes_version: str
) -> dict[str, Any] | None:
    types = [rt for rt in registry.all() if rt.group == group and rt.version == version]
    if not types:
        return None
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    validation = {
        "name": "fieldValidation",
        "in": "query",
        "schema": {"type": "string", "uniqueItems": True},
        "description": "fieldValidation instructs the server on how to handle objects in the request "
        "containing unknown or duplicate fields (Ignore, Warn, Strict).",
    }
    for rt in types:
        prefix = "/" + _gv_path(group, version) + ("/namespaces/{namespace}" if rt.namespaced else "")
        ref = {"$ref": f"#/components/schemas/{schema_name(rt)}"}
        content = {"application/json": {"schema": ref}}
        operation = {
            "x-kubernetes-group-version-kind": _gvk(rt),
            "parameters": [validation],
            "responses": {"200": {"description": "OK", "content": content}},
        }
        paths[f"{prefix}/{rt.plural}"] = {
            "post": {**operation, "x-kubernetes-action": "post"},
            "get": {**operation, "parameters": [], "x-kubernetes-action": "list"},
        }
        paths[f"{prefix}/{rt.plural}/{{name}}"] = {
            "get": {**operation, "parameters": [], "x-kubernetes-action": "get"},
            "put": {**operation, "x-kubernetes-action": "put"},
            "patch": {**operation, "x-kubernetes-action": "patch"},
            "delete": {**operation, "parameters": [], "x-kubernetes-action": "delete"},
        }
        if rt.custom and rt.schema:
            schema = json.loads(json.dumps(rt.schema))
            schema.setdefault("properties", {})
            schema["properties"].setdefault("apiVersion", {"type": "string"})
            schema["properties"].setdefault("kind", {"type": "string"})
            schema["properties"]["metadata"] = _OBJECT_META
            schema["x-kubernetes-group-version-kind"] = [_gvk(rt)]
            schemas[schema_name(rt)] = schema
        else:
            schemas[schema_name(rt)] = {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "x-kubernetes-group-version-kind": [_gvk(rt)],
            }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": kubernetes_version},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def index(registry: Registry, kubernetes_version: str) -> dict[str, Any]:
    """`/openapi/v3`: one entry per group/version, with a hash of its document."""
    entries = {}
    gvs = sorted({(rt.group, rt.version) for rt in registry.all()})
    for group, version in gvs:
        doc = group_version_document(registry, group, version, kubernetes_version)
        digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32].upper()
        path = _gv_path(group, version)
        entries[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
    return {"paths": entries}
