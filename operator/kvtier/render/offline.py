"""`kvtier render`: children of every InferenceDeployment among parsed manifests, with no cluster.

Each deployment's pool is looked up among the manifests' KVPools; the pool ledger is stood in for
by `default_binding`, with static namespaces handed out in file order so that two deployments on
one pool never get the same namespace. A deployment whose pool is not among the manifests is
rendered without its storage tier, and a message says so.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import yaml

from kvtier.api.documents import Document
from kvtier.api.inferencedeployment import InferenceDeployment
from kvtier.api.kvpool import KVPool
from kvtier.render.errors import RenderError
from kvtier.render.options import RenderOptions
from kvtier.render.volumes import default_binding
from kvtier.render.workload import render_deployment


@dataclass
class OfflineRender:
    objects: list[dict[str, Any]] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    """Problems and warnings, one line each, prefixed like `kvtier validate` (`FILE: KIND/NAME: ...`)."""
    failed: bool = False

    def yaml(self) -> str:
        return yaml.safe_dump_all(self.objects, sort_keys=False) if self.objects else ""


def render_documents(documents: Iterable[Document], options: RenderOptions | None = None) -> OfflineRender:
    """Render every valid InferenceDeployment among `documents`; invalid kvtier objects are reported."""
    options = options or RenderOptions()
    documents = list(documents)
    result = OfflineRender()
    for document in documents:
        result.messages += document.lines()
        result.failed |= bool(document.problems)
    valid = [document for document in documents if document.model is not None and not document.problems]
    # Parsed models always carry a name (the schema requires one); `or ""` only satisfies the type.
    pools = {doc.model.metadata.name or "": doc.model for doc in valid if isinstance(doc.model, KVPool)}
    taken: dict[str, set[str]] = defaultdict(set)
    for document in valid:
        if isinstance(document.model, InferenceDeployment):
            _render_one(result, document, document.model, pools, taken, options)
    return result


def _render_one(
    result: OfflineRender,
    document: Document,
    deployment: InferenceDeployment,
    pools: dict[str, KVPool],
    taken: dict[str, set[str]],
    options: RenderOptions,
) -> None:
    """Render one deployment into `result`; `taken` collects the static namespaces handed out so far."""
    prefix = f"{document.source}: {document.label}: "
    if not deployment.metadata.name:
        result.messages.append(f"{prefix}metadata.name: required to render (children are named after it)")
        result.failed = True
        return
    storage = deployment.spec.kv_cache.storage
    pool = pools.get(storage.pool_ref) if storage is not None else None
    if storage is not None and pool is None:
        missing = f"KVPool {storage.pool_ref} is not in the files: rendered without the storage tier"
        result.messages.append(prefix + missing)
    try:
        binding = default_binding(deployment, pool, taken[pool.metadata.name or ""]) if pool is not None else None
        result.objects += render_deployment(deployment, pool, options, binding)
    except RenderError as error:
        result.messages.append(f"{prefix}{error.reason}: {error}")
        result.failed = True
        return
    if pool is not None and binding is not None:
        taken[pool.metadata.name or ""] |= {ns.uuid for ns in binding.namespaces}
