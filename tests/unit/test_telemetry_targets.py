"""The scrape-target index: Ready replicas by deployment, from pod events and a resumable watch."""

import asyncio

import pytest

from kvtier.kube import APIError
from kvtier.telemetry.targets import Target, TargetIndex, target_of


def replica(
    name, *, deployment="chat", namespace="ns", ready=True, ip="127.1.0.5", uid=None, containers=None, deleting=False
):
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    metadata = {
        "name": name,
        "namespace": namespace,
        "uid": uid or f"uid-{name}",
        "labels": {"kvtier.io/deployment": deployment} if deployment else {},
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if containers is None:
        containers = [
            {"name": "vllm", "ports": [{"name": "http", "containerPort": 8000}]},
            {"name": "lmcache", "ports": [{"name": "lmcache-api", "containerPort": 8080}]},
            {"name": "kvtier-probe", "ports": [{"name": "probe-metrics", "containerPort": 9400}]},
        ]
    return {"metadata": metadata, "spec": {"containers": containers}, "status": {"podIP": ip, "conditions": conditions}}


def test_a_ready_replica_is_a_target_with_its_endpoints():
    target = target_of(replica("chat-0"))
    assert target == Target(
        "ns", "chat", "chat-0", "127.1.0.5", (("vllm", 8000), ("lmcache", 8080), ("probe", 9400), ("quota", 8080))
    )
    # LMCache 0.5.6 serves /metrics on its HTTP port, beside /quota
    assert target.urls() == {
        "vllm": "http://127.1.0.5:8000/metrics",
        "lmcache": "http://127.1.0.5:8080/metrics",
        "probe": "http://127.1.0.5:9400/metrics",
        "quota": "http://127.1.0.5:8080/quota",
    }
    assert target_of(replica("v6", ip="fd00::5")).urls()["vllm"] == "http://[fd00::5]:8000/metrics"


@pytest.mark.parametrize(
    "pod",
    [
        replica("not-ready", ready=False),
        replica("no-ip", ip=""),
        replica("deleting", deleting=True),
        replica("not-ours", deployment=None),
        replica("no-ports", containers=[{"name": "vllm"}, {"name": "sidecar", "ports": [{"containerPort": 1}]}]),
        replica("bad-port", containers=[{"name": "vllm", "ports": [{"name": "http", "containerPort": "x"}]}]),
        {"metadata": {"name": "bare", "labels": {"kvtier.io/deployment": "chat"}}},
    ],
)
def test_pods_that_cannot_be_scraped_are_not_targets(pod):
    assert target_of(pod) is None


def test_events_add_update_and_remove_targets_by_deployment():
    index = TargetIndex()
    index.apply("ADDED", replica("chat-0"))
    index.apply("ADDED", replica("chat-1", ip="127.1.0.6"))
    index.apply("ADDED", replica("code-0", deployment="code", ip="127.1.0.7"))
    assert {key: [t.pod for t in ts] for key, ts in index.by_deployment().items()} == {
        ("ns", "chat"): ["chat-0", "chat-1"],
        ("ns", "code"): ["code-0"],
    }
    index.apply("MODIFIED", replica("chat-1", ready=False, ip="127.1.0.6"))
    index.apply("DELETED", replica("code-0", deployment="code"))
    assert [t.pod for t in index.targets()] == ["chat-0"]
    index.apply("MODIFIED", replica("chat-0", ip="127.1.0.9"))  # a new address replaces the old
    assert [t.ip for t in index.targets()] == ["127.1.0.9"]


def test_every_replica_ready_or_not_is_kept_by_deployment_once_listed():
    index = TargetIndex()
    index.apply("ADDED", replica("chat-0"))
    assert index.pods_of("ns", "chat") is None, "nothing to say before the first list"
    index.synced.set()
    index.apply("ADDED", replica("chat-1", ready=False))
    index.apply(
        "ADDED",
        {
            **replica("code-0", deployment="code"),
            "metadata": {**replica("code-0", deployment="code")["metadata"], "managedFields": [{"manager": "x"}]},
        },
    )
    assert sorted(p["metadata"]["name"] for p in index.pods_of("ns", "chat")) == ["chat-0", "chat-1"]
    code = index.pods_of("ns", "code")[0]
    # Kept small: no managedFields, no spec (read only into the target); status and identity stay.
    assert "managedFields" not in code["metadata"] and "spec" not in code
    assert code["status"]["podIP"] == "127.1.0.5" and code["metadata"]["uid"] == "uid-code-0"
    assert [t.urls()["vllm"] for t in index.by_deployment()[("ns", "code")]] == ["http://127.1.0.5:8000/metrics"]
    index.apply("DELETED", replica("chat-0"))
    index.replace("ns", [replica("code-1", deployment="code")])
    assert index.pods_of("ns", "chat") == [] and [p["metadata"]["name"] for p in index.pods_of("ns", "code")] == [
        "code-1"
    ]


def test_a_list_replaces_only_its_namespace():
    index = TargetIndex()
    index.apply("ADDED", replica("a-0", namespace="a"))
    index.apply("ADDED", replica("b-0", namespace="b"))
    index.replace("a", [replica("a-1", namespace="a")])
    assert [t.pod for t in index.targets()] == ["a-1", "b-0"]
    index.replace(None, [])
    assert index.targets() == []


class FakeKube:
    """Answers `list` and `watch` from scripted streams; records the resourceVersions asked for."""

    def __init__(self, lists, watches):
        self.lists, self.watches = list(lists), list(watches)
        self.calls = []

    async def list(self, resource, namespace=None, *, label_selector=None):
        self.calls.append(("list", namespace, label_selector))
        return self.lists.pop(0)

    async def watch(self, resource, namespace=None, *, resource_version=None, timeout_seconds=300, label_selector=None):
        self.calls.append(("watch", namespace, resource_version))
        if not self.watches:
            await asyncio.Event().wait()  # a quiet stream, until cancelled
        script = self.watches.pop(0)
        if isinstance(script, Exception):
            raise script
        for event in script:
            yield event


def listing(version, *pods):
    return {"metadata": {"resourceVersion": version}, "items": list(pods)}


def event(kind, pod, version):
    pod["metadata"]["resourceVersion"] = version
    return {"type": kind, "object": pod}


async def run_until(index, kube, predicate):
    task = asyncio.create_task(index.run(kube, backoff=0.001))
    try:
        for _ in range(500):
            if predicate():
                return
            await asyncio.sleep(0.002)
        raise AssertionError(f"index never got there; calls: {kube.calls}")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_the_watch_resumes_from_the_last_version_and_lists_again_only_when_it_expired():
    kube = FakeKube(
        lists=[listing("10", replica("chat-0")), listing("50", replica("chat-2"))],
        watches=[
            [
                event("ADDED", replica("chat-1"), "11"),
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "20"}}},
            ],
            [event("DELETED", replica("chat-0"), "21")],
            [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}],
            [event("ADDED", replica("chat-3"), "51")],
        ],
    )
    index = TargetIndex()
    await run_until(index, kube, lambda: len(kube.calls) >= 7 and not kube.watches)
    assert index.synced.is_set()
    assert kube.calls == [
        ("list", None, "kvtier.io/deployment"),
        ("watch", None, "10"),
        ("watch", None, "20"),
        ("watch", None, "21"),
        ("list", None, "kvtier.io/deployment"),
        ("watch", None, "50"),
        ("watch", None, "51"),
    ]
    assert [t.pod for t in index.targets()] == ["chat-2", "chat-3"]
    assert index.lists == 2


async def test_watch_failures_back_off_and_resume_without_listing():
    kube = FakeKube(
        lists=[listing("5", replica("chat-0"))],
        watches=[APIError(500, {"message": "boom"}, "WATCH", "/pods"), [event("ADDED", replica("chat-1"), "6")]],
    )
    index = TargetIndex(["ns"])
    await run_until(index, kube, lambda: len(index.targets()) == 2)
    assert [call for call in kube.calls if call[0] == "list"] == [("list", "ns", "kvtier.io/deployment")]
    assert ("watch", "ns", "5") in kube.calls
