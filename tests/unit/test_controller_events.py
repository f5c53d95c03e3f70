"""Events: the same Event about the same object is posted once, however many handlers see it."""

import asyncio

from kvtier.controllers import events
from kvtier.controllers.events import post_event


class RecordingKube:
    def __init__(self):
        self.created = []

    async def create(self, resource, body):
        self.created.append(body)
        return body


def body(uid="u1"):
    return {"apiVersion": "kvtier.io/v1alpha1", "kind": "KVPool", "metadata": {"name": "p", "uid": uid}}


def test_a_repeated_event_is_posted_once_within_the_repeat_window(monkeypatch):
    monkeypatch.setattr(events, "_posted", type(events._posted)())
    kube = RecordingKube()

    async def post_twice_concurrently(obj, reason, message):
        await asyncio.gather(*(post_event(kube, obj, "Normal", reason, message) for _ in range(2)))

    asyncio.run(post_twice_concurrently(body(), "Bound", "32Gi per replica"))
    asyncio.run(post_twice_concurrently(body(), "Bound", "64Gi per replica"))  # another message: another Event
    asyncio.run(post_twice_concurrently(body("u2"), "Bound", "32Gi per replica"))  # another object
    assert [(e["involvedObject"]["uid"], e["message"]) for e in kube.created] == [
        ("u1", "KVPool p: 32Gi per replica"),
        ("u1", "KVPool p: 64Gi per replica"),
        ("u2", "KVPool p: 32Gi per replica"),
    ]
    assert kube.created[0]["metadata"]["namespace"] == "default"  # a cluster-scoped object's Events


def test_the_same_event_comes_again_after_the_window(monkeypatch):
    monkeypatch.setattr(events, "_posted", type(events._posted)())
    clock = [1000.0]
    monkeypatch.setattr(events.time, "monotonic", lambda: clock[0])
    kube = RecordingKube()
    for advance in (0.0, events.REPEAT_SECONDS - 1, 2.0):
        clock[0] += advance
        asyncio.run(post_event(kube, body(), "Warning", "ScrapeFailed", "refused"))
    assert len(kube.created) == 2


def _pool(allocations=(), waiting=0, reclaiming=(), capacity="96Gi"):
    from kvtier.api.kvpool import KVPool, KVPoolStatus

    pool = KVPool.model_validate(
        {
            "metadata": {"name": "gpu-pool"},
            "spec": {"capacity": capacity, "storage": {"hostPath": {"path": "/var/lib/kv"}}},
        }
    )
    status = KVPoolStatus.model_validate(
        {
            "allocations": [
                {"namespace": "ml", "name": f"d{i}", "uid": f"u{i}", "replicas": r, "quota": q}
                for i, (r, q) in enumerate(allocations)
            ],
            "waiting": [
                {"namespace": "ml", "name": f"w{i}", "uid": f"w{i}", "since": "2026-12-04T10:00:00Z", "needs": "8Gi"}
                for i in range(waiting)
            ],
            "reclaiming": list(reclaiming),
        }
    )
    return pool, status


def test_the_pools_ready_message_says_who_holds_what_in_words():
    from kvtier.controllers.kvpools import holdings

    assert holdings(*_pool([(1, "32Gi"), (2, "16Gi"), (1, "32Gi")])) == "3 deployments hold 96Gi of 96Gi"
    assert holdings(*_pool([(1, "32Gi")])) == "1 deployment holds 32Gi of 96Gi"
    assert holdings(*_pool()) == "no deployment holds any of its 96Gi yet"
    assert holdings(*_pool([(1, "96Gi")], waiting=2, reclaiming=["u"])) == (
        "1 deployment holds 96Gi of 96Gi; 2 deployments wait for capacity; 1 released NVMe-oF namespace being wiped"
    )


def test_the_pools_ready_event_names_the_pool(monkeypatch):
    from kvtier.controllers.events import post_transitions
    from kvtier.controllers.kvpools import pool_conditions

    monkeypatch.setattr(events, "_posted", type(events._posted)())
    pool, status = _pool([(1, "32Gi"), (1, "32Gi"), (1, "32Gi")])
    kube = RecordingKube()
    body = {"apiVersion": "kvtier.io/v1alpha1", "kind": "KVPool", "metadata": {"name": "gpu-pool", "uid": "p"}}
    asyncio.run(post_transitions(kube, body, [], pool_conditions(pool, status, 1)))
    assert ("Normal", "Available", "KVPool gpu-pool: 3 deployments hold 96Gi of 96Gi") in [
        (e["type"], e["reason"], e["message"]) for e in kube.created
    ]
    assert not any(e["type"] == "Warning" for e in kube.created)
