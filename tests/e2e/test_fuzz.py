"""Seeded fuzzing of the examples against the running operator (issue #23 item 6).

A few hundred mutations of `manifests/examples/` (a fixed seed: the same objects every run) are sent to
the API server as `kubectl apply` would (strict field validation). Every object is either refused at
admission with field paths, or accepted and then, within a bounded time, carries a Ready condition for
its current generation that is True or says why not. Meanwhile: the operator logs no traceback, every
pool's ledger stays within its capacity, and `kvtier validate` names exactly the server's field paths
for every object. The counts are printed (`-s` shows them).

KVTIER_FUZZ_MUTATIONS changes how many mutations run (default 240); KVTIER_FUZZ_SEED the seed.
"""

from __future__ import annotations

import copy
import logging
import os
import random
import re
import threading
import time
from collections import Counter
from typing import Any

import pytest

from kvtier.api.documents import Document, parse_document
from kvtier.api.units import parse_quantity
from kvtier.kube import INFERENCEDEPLOYMENTS, KVPOOLS, APIError
from tests.conftest import wait_for
from tests.e2e.helpers import condition, create_pool, csi_pool, ensure_sim_storage_class, example, get, items, kubectl

SEED = int(os.environ.get("KVTIER_FUZZ_SEED", "20261204"))
MUTATIONS = int(os.environ.get("KVTIER_FUZZ_MUTATIONS", "240"))
BATCH = 12
#: How long an accepted object may take to carry a Ready condition that explains itself.
SETTLE_SECONDS = 45
RULES_NOT_CHECKED = "some validation rules were not checked because the object was invalid"
#: Ready=False reasons that only say "not yet" (anything else names a cause).
TRANSIENT = {"ReplicasNotReady"}

NASTY = [
    0,
    -1,
    1,
    3,
    2**31,
    2**63,
    1e-300,
    -0.5,
    1.5,
    1024,
    10000,
    True,
    None,
    "",
    " ",
    "x" * 300,
    "-5Gi",
    "1e99999999999",
    "0.5",
    "1Ti",
    "ünïcode",
    "a_b",
    "trail-",
    "a..b",
    "a\x00b",
    "UPPER",
    "60",
    "1h",
    "-1s",
    [],
    {},
    ["--port=1"],
    {"extra": 1},
    [{"name": "PYTHONHASHSEED", "value": "1"}],
]
DEPLOYMENT_PATHS = [
    "metadata.name",
    "spec.replicas",
    "spec.model.name",
    "spec.model.servedName",
    "spec.model.kvBytesPerToken",
    "spec.model.architecture",
    "spec.model.architecture.layers",
    "spec.model.architecture.dtype",
    "spec.engine.image",
    "spec.engine.tensorParallelSize",
    "spec.engine.gpuMemoryUtilization",
    "spec.engine.maxModelLen",
    "spec.engine.args",
    "spec.engine.env",
    "spec.engine.resources.requests.memory",
    "spec.engine.resources.requests.cpu",
    "spec.engine.resources.limits",
    "spec.engine.nodeSelector",
    "spec.engine.tolerations",
    "spec.kvCache",
    "spec.kvCache.mode",
    "spec.kvCache.chunkSize",
    "spec.kvCache.cpu.size",
    "spec.kvCache.storage",
    "spec.kvCache.storage.request",
    "spec.kvCache.storage.min",
    "spec.kvCache.storage.max",
    "spec.kvCache.storage.weight",
    "spec.kvCache.storage.poolRef",
    "spec.slo.ttftP50",
    "spec.slo.ttftP99",
    "spec.typo",
]
POOL_PATHS = [
    "metadata.name",
    "spec.capacity",
    "spec.readBandwidth",
    "spec.storage",
    "spec.storage.csi.storageClassName",
    "spec.storage.csi.volumeMode",
    "spec.storage.hostPath",
    "spec.rebalance",
    "spec.rebalance.policy",
    "spec.rebalance.interval",
    "spec.rebalance.cooldown",
    "spec.rebalance.minGain",
    "spec.rebalance.maxStep",
    "spec.rebalance.dryRun",
    "spec.volumeReclaim",
    "spec.typo",
]
MODES = ["LMCacheMP", "LMCacheInProcess", "None"]
#: Values the schema accepts that the operator must then explain (or serve): half of the changes use these.
PLAUSIBLE: dict[str, list[Any]] = {
    "spec.replicas": [0, 2, 40, 1000],
    "spec.engine.tensorParallelSize": [2, 3, 5, 16],
    "spec.engine.resources.requests.memory": ["1Ti", "4Ti", "0"],
    "spec.engine.nodeSelector": [{"gpu": "h200"}],
    "spec.engine.args": [["--enforce-eager"], ["--max-num-seqs", "8"]],
    "spec.kvCache.mode": MODES,
    "spec.kvCache.cpu.size": ["3Ti", "1Mi"],
    "spec.kvCache.storage.poolRef": ["missing-pool"],
    "spec.kvCache.storage.request": ["0", "50Gi", "200Gi"],
    "spec.kvCache.storage.min": ["0", "4Gi", "200Gi"],
    "spec.kvCache.storage.max": ["4Gi", "1Ti"],
    "spec.kvCache.storage.weight": [0.001, 1000],
    "spec.capacity": ["1", "1Ki", "1Pi"],
    "spec.storage": [{"hostPath": {"path": "/tmp/kvtier-fuzz"}}],
    "spec.storage.csi.storageClassName": ["missing-class"],
    "spec.rebalance.policy": ["Static", "Proportional"],
    "spec.rebalance.minGain": [0, 1],
    "spec.rebalance.maxStep": [1, 0.01],
    "spec.rebalance.dryRun": [True],
    "spec.volumeReclaim": ["Retain"],
}
_DELETE = object()


def base_deployment(pool: str) -> dict[str, Any]:
    """The example InferenceDeployment, shrunk to what the simulated nodes hold many of."""
    body = copy.deepcopy(example("inferencedeployment.yaml"))
    spec = body["spec"]
    spec["replicas"] = 1
    spec["engine"].update(tensorParallelSize=1, resources={"requests": {"cpu": "2", "memory": "8Gi"}})
    spec["kvCache"]["cpu"] = {"size": "4Gi"}
    spec["kvCache"]["storage"].update(poolRef=pool, request="4Gi", min="1Gi", max="8Gi")
    return body


def base_pool() -> dict[str, Any]:
    body = copy.deepcopy(example("kvpool-csi.yaml"))
    body["spec"]["capacity"] = "64Gi"
    return body


def set_path(body: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = body
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    if value is _DELETE:
        node.pop(last, None)
    else:
        node[last] = copy.deepcopy(value)


def mutate(rng: random.Random, body: dict[str, Any], paths: list[str]) -> dict[str, Any]:
    """One to three changes: a plausible value the operator must handle, a deletion, or a nasty value."""
    body = copy.deepcopy(body)
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(paths)
        roll = rng.random()
        if path in PLAUSIBLE and roll < 0.6:
            set_path(body, path, rng.choice(PLAUSIBLE[path]))
        elif roll < 0.7:
            set_path(body, path, _DELETE)
        else:
            set_path(body, path, rng.choice(NASTY))
    return body


def corpus(pool: str) -> list[dict[str, Any]]:
    rng = random.Random(SEED)
    objects = []
    for index in range(MUTATIONS):
        deployment = rng.random() < 0.7
        body = mutate(
            rng, base_deployment(pool) if deployment else base_pool(), DEPLOYMENT_PATHS if deployment else POOL_PATHS
        )
        metadata = body.setdefault("metadata", {}) if isinstance(body.get("metadata"), dict) else {}
        if (
            metadata.get("name") == base_deployment(pool)["metadata"]["name"]
            or metadata.get("name") == base_pool()["metadata"]["name"]
        ):
            metadata["name"] = f"fz-{index:03d}"  # unique unless the mutation chose a name
        if deployment:
            metadata["namespace"] = "default"
        objects.append(body)
    return objects


def same_fields(server: list[str], local: list[str], *, exact: bool) -> bool:
    """Whether validate names what the server names. The embedded server runs validate's own code: the lists
    are equal. kube-apiserver may name one field twice (an enum through the schema and the structural check)
    or name the parts of a value of the wrong type (`hostPath[0].name` for a list where an object belongs):
    there each field either side names must be, contain or lie within a field the other names. (Whether the
    server adds its `<nil>` note that rules were skipped is not compared there: for a number too large for an
    int64 field it does, validate does not yet.)"""
    if exact:
        return server == local
    server, local = [p for p in server if p != "<nil>"], [p for p in local if p != "<nil>"]

    def covered(path: str, others: list[str]) -> bool:
        return any(
            path == other or path.startswith((other + ".", other + "[")) or other.startswith((path + ".", path + "["))
            for other in others
        )

    return (
        bool(server) == bool(local)
        and all(covered(p, local) for p in server)
        and all(covered(p, server) for p in local)
    )


def _path(problem: str) -> str:
    return "<nil>" if problem.startswith(RULES_NOT_CHECKED) else problem.split(": ", 1)[0]


def server_verdict(cluster, body: dict[str, Any]) -> tuple[list[str], dict[str, Any] | None]:
    """(refused field paths, the created object) as `kubectl apply` gets them: strict field validation
    first (a 400 naming unknown fields), then the 422's causes without the unknown fields."""
    resource = INFERENCEDEPLOYMENTS if body["kind"] == "InferenceDeployment" else KVPOOLS
    namespace = body["metadata"].get("namespace") if resource.namespaced else None
    path = resource.path(namespace)
    try:
        return [], cluster.run(cluster.kube.request("POST", path, body, params={"fieldValidation": "Strict"}))
    except APIError as error:
        assert error.status in (400, 422), f"{error.status}: {error}"
        message = error.body.get("message", "") if isinstance(error.body, dict) else str(error.body)
        if error.status == 422:
            return sorted(c["field"] for c in error.body["details"]["causes"]), None
        undecodable = re.search(r"cannot unmarshal \w+ into Go struct field ObjectMeta\.(\w+)", message)
        if undecodable:  # metadata of the wrong type
            return [f"metadata.{undecodable[1]}"], None
        assert "strict decoding error" in message, message
        unknown = [part.split('"')[1] for part in message.split("unknown field ")[1:]]
    try:
        cluster.run(cluster.kube.request("POST", path, body, params={"fieldValidation": "Ignore", "dryRun": "All"}))
        return sorted(unknown), None
    except APIError as error:
        assert error.status == 422, f"{error.status}: {error}"
        return sorted(unknown + [c["field"] for c in error.body["details"]["causes"]]), None


def validate_verdict(body: dict[str, Any]) -> list[str]:
    return sorted(_path(str(problem)) for problem in parse_document(Document("fuzz", 0, body)).problems)


class Tracebacks(logging.Handler):
    """Every log record of the operator (kopf, kvtier) that carries a traceback."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.name.split(".")[0] in ("kopf", "kvtier"):
            self.records.append(record)


class LedgerWatch(threading.Thread):
    """Samples every pool's ledger until stopped: the sum of the allocations never exceeds the capacity."""

    def __init__(self, cluster) -> None:
        super().__init__(daemon=True)
        self.cluster, self.samples, self.violations = cluster, 0, []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.25):
            for pool in items(self.cluster, KVPOOLS):
                status = pool.get("status") or {}
                if not status.get("allocations"):
                    continue
                capacity = parse_quantity(pool["spec"]["capacity"])
                total = sum(parse_quantity(a["quota"]) * a["replicas"] for a in status["allocations"])
                self.samples += 1
                if total > capacity:
                    self.violations.append(f"{pool['metadata']['name']}: {total} > {capacity}")


def leftovers(cluster) -> list[str]:
    """The fuzz's deployments still there, with what holds them."""
    return [
        f"{d['metadata']['name']}: finalizers {d['metadata'].get('finalizers')}, "
        f"Ready {condition(d, 'Ready').get('reason')}: {condition(d, 'Ready').get('message')}"
        for d in items(cluster, INFERENCEDEPLOYMENTS, "default")
        if d["metadata"]["name"].startswith("fz-")
    ]


def settled(obj: dict[str, Any] | None) -> dict[str, Any] | None:
    """The object's Ready condition once it is for the current generation and says something final."""
    if obj is None:
        return None
    ready = condition(obj, "Ready")
    current = ready.get("observedGeneration") == obj["metadata"].get("generation")
    if not current or not ready.get("reason") or ready["status"] == "False" and ready["reason"] in TRANSIENT:
        return None
    return ready


@pytest.mark.filterwarnings("ignore:The recursion limit will not be reset")
def test_seeded_mutations_are_refused_with_paths_or_explained(cluster):
    ensure_sim_storage_class(cluster)
    pool = "fuzz-pool"
    create_pool(
        cluster,
        {
            **csi_pool(pool, "100Gi"),
            "spec": {**csi_pool(pool, "100Gi")["spec"], "rebalance": {"policy": "MarginalGain"}},
        },
    )
    tracebacks = Tracebacks()
    logging.getLogger().addHandler(tracebacks)
    watch = LedgerWatch(cluster)
    watch.start()
    counts: Counter[str] = Counter()
    disagreements: list[str] = []
    unexplained: list[str] = []
    started = time.monotonic()
    try:
        objects = corpus(pool)
        for start in range(0, len(objects), BATCH):
            accepted: list[dict[str, Any]] = []
            for body in objects[start : start + BATCH]:
                server, created = server_verdict(cluster, body)
                local = validate_verdict(body)
                label = f"{body.get('kind')}/{body.get('metadata', {}).get('name')!r}"
                if not same_fields(server, local, exact=cluster.embedded):
                    disagreements.append(f"{label}: server {server} != validate {local}")
                if created is None:
                    assert server and all(server), f"{label} refused without a field path"
                    counts["refused"] += 1
                else:
                    accepted.append(created)
            for created in accepted:
                resource = INFERENCEDEPLOYMENTS if created["kind"] == "InferenceDeployment" else KVPOOLS
                namespace = created["metadata"].get("namespace")
                name = created["metadata"]["name"]
                try:
                    ready = wait_for(
                        lambda: settled(get(cluster, resource, namespace, name)),
                        timeout=SETTLE_SECONDS,
                        interval=0.25,
                        message=f"{created['kind']} {name} to explain itself",
                    )
                except pytest.fail.Exception:
                    unexplained.append(
                        f"{created['kind']}/{name}: {condition(get(cluster, resource, namespace, name), 'Ready')}"
                    )
                    continue
                counts["accepted clean" if ready["status"] == "True" else "accepted with a condition"] += 1
                counts[f"  {ready['reason']}"] += 1
            for created in accepted:
                kind = "infd" if created["kind"] == "InferenceDeployment" else "kvp"
                where = ["-n", created["metadata"]["namespace"]] if kind == "infd" else []
                kubectl(cluster, "delete", kind, created["metadata"]["name"], *where, "--wait=false")
            try:
                wait_for(lambda: not leftovers(cluster), timeout=120, message="the batch deleted")
            except pytest.fail.Exception:
                pytest.fail(f"deletion never finished: {leftovers(cluster)}")
    finally:
        watch.halt.set()
        watch.join()
        logging.getLogger().removeHandler(tracebacks)
        kubectl(cluster, "delete", "kvp", pool, "--ignore-not-found", "--wait=false")
    elapsed = time.monotonic() - started
    print(
        f"\nfuzz: seed {SEED}, {MUTATIONS} mutations in {elapsed:.0f}s: "
        + ", ".join(
            f"{key.strip()} {value}" for key, value in sorted(counts.items(), key=lambda kv: kv[0].startswith(" "))
        )
    )
    print(
        f"fuzz: ledger samples {watch.samples}, over-commits {len(watch.violations)}, "
        f"operator tracebacks {len(tracebacks.records)}, validate disagreements {len(disagreements)}"
    )
    assert not disagreements, "\n".join(disagreements[:20])
    assert not unexplained, "\n".join(unexplained[:20])
    assert not watch.violations, watch.violations[:5]
    assert watch.samples > 0
    assert not tracebacks.records, "\n".join(f"{r.name}: {r.getMessage()}" for r in tracebacks.records[:5])
    assert counts["refused"] and counts["accepted clean"] and counts["accepted with a condition"]
