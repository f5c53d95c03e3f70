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
        ("u1", "32Gi per replica"), ("u1", "64Gi per replica"), ("u2", "32Gi per replica")]
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
