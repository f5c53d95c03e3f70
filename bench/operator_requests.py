"""The operator's API requests in steady state and on a restart, on the embedded cluster (its request log).

    .venv/bin/python bench/operator_requests.py --deployments 20 --steady 60

Creates one CSI KVPool and D InferenceDeployments (1 replica each, stub engines), waits until every one is
Ready with `status.kv` filled, then counts the requests of the operator (and kopf) for `--steady` seconds:
per second by verb and resource, 409s, status writes per minute. Then it stops the operator, starts it
again and counts the requests of the next `--restart` seconds, and whether any deployment's storage quota
or the pool's ledger changed. Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import os
import threading
import time

from kvtier.controllers import OperatorConfig
from kvtier.kube import INFERENCEDEPLOYMENTS, KVPOOLS, NAMESPACES, STORAGECLASSES
from kvtier.testing.cluster import BackgroundCluster, default_nodes
from kvtier.testing.engines import stub_engine

OPERATOR_AGENTS = ("kvtier-operator", "kopf")
NAMESPACE = "scale"


def deployment(name: str, pool: str) -> dict:
    return {
        "apiVersion": "kvtier.io/v1alpha1",
        "kind": "InferenceDeployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "model": {"name": "Qwen/Qwen3-8B", "kvBytesPerToken": 147456},
            "replicas": 1,
            "engine": {"image": "vllm/vllm-openai:v0.33.0", "resources": {"requests": {"cpu": "1", "memory": "4Gi"}}},
            "kvCache": {"cpu": {"size": "1Gi"}, "storage": {"poolRef": pool, "request": "10Gi", "max": "10Gi"}},
        },
    }


def operator_records(cluster: BackgroundCluster, since: int) -> list:
    assert cluster.server is not None
    return [r for r in cluster.server.requests.records[since:] if r.user_agent.split("/")[0] in OPERATOR_AGENTS]


def table(records: list, seconds: float) -> str:
    by = collections.Counter(
        (r.verb, (r.resource or r.path) + (f"/{r.subresource}" if r.subresource else "")) for r in records
    )
    lines = [
        f"  {verb:8} {resource:34} {count:6d}  {count / seconds:7.2f}/s" for (verb, resource), count in by.most_common()
    ]
    return "\n".join(lines)


def summary(records: list, seconds: float, deployments: int) -> dict[str, float]:
    verbs = collections.Counter(r.verb for r in records if r.verb != "watch")
    status_writes = sum(1 for r in records if r.subresource == "status" and r.verb in ("patch", "update"))
    return {
        "requests/s": round(sum(verbs.values()) / seconds, 2),
        "per deployment/s": round(sum(verbs.values()) / seconds / deployments, 3),
        **{f"{verb}/s": round(count / seconds, 2) for verb, count in sorted(verbs.items())},
        "409s": sum(1 for r in records if r.status == 409),
        "status writes/min": round(status_writes / seconds * 60, 1),
    }


def operator_cpu_seconds() -> float:
    """CPU seconds of the in-process operator's thread so far (Linux: /proc/self/task/<tid>/stat)."""
    thread = next((t for t in threading.enumerate() if t.name == "kvtier-operator"), None)
    if thread is None or thread.native_id is None:
        return float("nan")
    with open(f"/proc/self/task/{thread.native_id}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def quotas(cluster: BackgroundCluster) -> dict[str, str]:
    found = cluster.run(cluster.kube.list(INFERENCEDEPLOYMENTS, NAMESPACE))["items"]
    return {d["metadata"]["name"]: (d.get("status") or {}).get("kv", {}).get("storage", {}).get("quota") for d in found}


def ledger(cluster: BackgroundCluster, pool: str) -> list:
    status = cluster.run(cluster.kube.get(KVPOOLS, None, pool)).get("status") or {}
    return sorted((a["name"], a["quota"]) for a in status.get("allocations", []))


def ready(cluster: BackgroundCluster) -> int:
    found = cluster.run(cluster.kube.list(INFERENCEDEPLOYMENTS, NAMESPACE))["items"]
    count = 0
    for d in found:
        status = d.get("status") or {}
        ok = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))
        count += ok and bool(status.get("kv"))
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deployments", type=int, default=20)
    parser.add_argument("--steady", type=float, default=60.0, help="seconds of steady state counted")
    parser.add_argument("--restart", type=float, default=30.0, help="seconds counted after a restart")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for every deployment Ready")
    parser.add_argument("--interval", type=float, default=2.0, help="resync, scrape and status interval (dev up: 2)")
    args = parser.parse_args()
    config = OperatorConfig(
        resync_seconds=args.interval, scrape_interval_seconds=args.interval, status_interval_seconds=args.interval
    )
    nodes = default_nodes(args.deployments // 8 + 1)  # 8 GPUs a node, one a replica
    with BackgroundCluster(operator=config, engine_factory=stub_engine, nodes=nodes) as cluster:
        kube = cluster.kube
        cluster.run(kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}))
        cluster.run(
            kube.create(
                STORAGECLASSES,
                {
                    "apiVersion": "storage.k8s.io/v1",
                    "kind": "StorageClass",
                    "metadata": {"name": "sim-fast"},
                    "provisioner": "csi.example.com",
                },
            )
        )
        pool = {
            "apiVersion": "kvtier.io/v1alpha1",
            "kind": "KVPool",
            "metadata": {"name": "bench"},
            "spec": {
                "capacity": f"{10 * args.deployments}Gi",
                "storage": {"csi": {"storageClassName": "sim-fast"}},
                "rebalance": {"policy": "Static"},
            },
        }
        cluster.run(kube.create(KVPOOLS, pool))
        started = time.monotonic()
        for index in range(args.deployments):
            cluster.run(kube.create(INFERENCEDEPLOYMENTS, deployment(f"d{index:04d}", "bench")))
        while ready(cluster) < args.deployments:
            if time.monotonic() - started > args.timeout:
                raise SystemExit(f"only {ready(cluster)}/{args.deployments} Ready after {args.timeout:.0f}s")
            time.sleep(1)
        print(f"{args.deployments} deployments Ready with status.kv in {time.monotonic() - started:.1f}s")
        time.sleep(3 * args.interval)  # let the last status writes land
        assert cluster.server is not None
        since = len(cluster.server.requests)
        cpu = operator_cpu_seconds()
        time.sleep(args.steady)
        cpu = operator_cpu_seconds() - cpu
        records = operator_records(cluster, since)
        print(f"steady state, {args.steady:.0f}s, {args.deployments} deployments (interval {args.interval}s):")
        print(table(records, args.steady))
        print(" ", summary(records, args.steady, args.deployments))
        print(f"  operator thread CPU: {cpu / args.steady:.1%} of one core")
        before = quotas(cluster), ledger(cluster, "bench")
        since = len(cluster.server.requests)
        cluster.run(cluster.cluster.stop_operator(crash=True))
        cluster.run(cluster.cluster.start_operator())
        time.sleep(args.restart)
        records = operator_records(cluster, since)
        print(f"restart: {len(records)} requests in the {args.restart:.0f}s after it (watches included):")
        print(table(records, args.restart))
        print(" ", summary(records, args.restart, args.deployments))
        after = quotas(cluster), ledger(cluster, "bench")
        print(f"  quotas unchanged: {before[0] == after[0]}; ledger unchanged: {before[1] == after[1]}")


if __name__ == "__main__":
    main()
