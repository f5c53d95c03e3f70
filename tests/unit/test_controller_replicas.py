"""Replicas that are not Ready: starting (Normal) or in trouble (Warning), in words."""

import asyncio

import pytest

from kvtier.controllers import events
from kvtier.controllers.events import post_transitions
from kvtier.controllers.replicas import not_ready, pod_trouble

GRACE = 600.0


def pod(name="chat-0", phase="Pending", ready=False, containers=(), conditions=()):
    return {
        "metadata": {"name": name},
        "status": {
            "phase": phase,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}, *conditions],
            "containerStatuses": list(containers),
        },
    }


def waiting(reason, message="", name="vllm"):
    return {"name": name, "state": {"waiting": {"reason": reason, "message": message}}, "restartCount": 0}


def test_a_normal_start_is_starting_not_trouble():
    pods = [pod(containers=[waiting("ContainerCreating")]), pod("chat-1", phase="Running")]
    reason, message = not_ready(pods, 0, 2, not_ready_seconds=30, grace_seconds=GRACE)
    assert reason == "ReplicasStarting"
    assert message == "0/2 replicas ready; starting: chat-0 ContainerCreating, chat-1 Running, not Ready yet"
    assert not_ready([], 0, 1, 0, GRACE) == ("ReplicasStarting", "0/1 replicas ready; starting")


def test_still_not_ready_after_the_grace_period_is_trouble():
    reason, message = not_ready([pod(phase="Running")], 0, 1, not_ready_seconds=GRACE + 1, grace_seconds=GRACE)
    assert reason == "ReplicasNotReady"
    assert message == "0/1 replicas ready, still not all Ready after 601s (pod chat-0: Running, not Ready yet)"


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (
            {"containerStatuses": [waiting("CrashLoopBackOff", "back-off 5m0s restarting failed container")]},
            "container vllm: CrashLoopBackOff (back-off 5m0s restarting failed container)",
        ),
        ({"containerStatuses": [waiting("ImagePullBackOff")]}, "container vllm: ImagePullBackOff"),
        (
            {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
                    }
                ]
            },
            "cannot be scheduled (0/2 nodes are available: 2 Insufficient nvidia.com/gpu.)",
        ),
        (
            {
                "containerStatuses": [
                    {
                        "name": "lmcache",
                        "state": {"running": {}},
                        "restartCount": 2,
                        "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
                    }
                ]
            },
            "container lmcache restarted 2 times (last exit code 137, OOMKilled)",
        ),
        ({"phase": "Failed", "reason": "Evicted", "message": "low on memory"}, "failed: Evicted (low on memory)"),
    ],
)
def test_a_failing_pod_is_trouble_at_once_and_named(status, expected):
    failing = {"metadata": {"name": "chat-0"}, "status": {"phase": "Pending", **status}}
    assert pod_trouble(failing) == expected
    reason, message = not_ready([pod("chat-1", phase="Running"), failing], 0, 2, 5, GRACE)
    assert (reason, message) == ("ReplicasNotReady", f"0/2 replicas ready: pod chat-0 {expected}")


@pytest.mark.parametrize(
    "message",
    [
        # kube-scheduler v1.37 while the PersistentVolume controller has not bound the claim yet (seen on the real ground)
        "0/4 nodes are available: pod has unbound immediate PersistentVolumeClaims. not found",
        'persistentvolumeclaim "coder-480b-kv" not found',
    ],
)
def test_waiting_for_a_claim_to_bind_is_a_normal_start_until_the_grace_period(message):
    unbound = pod(
        conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]
    )
    assert pod_trouble(unbound) is None
    assert not_ready([unbound], 0, 1, 5, GRACE) == (
        "ReplicasStarting",
        "0/1 replicas ready; starting: chat-0 waiting for its volumes to bind",
    )
    assert not_ready([unbound], 0, 1, GRACE + 1, GRACE) == (
        "ReplicasNotReady",
        "0/1 replicas ready, still not all Ready after 601s (pod chat-0: waiting for its volumes to bind)",
    )


def test_ready_pods_and_starting_pods_are_no_trouble():
    assert pod_trouble(pod(phase="Running", ready=True)) is None
    assert pod_trouble(pod(containers=[waiting("ContainerCreating")])) is None
    assert pod_trouble(pod(containers=[waiting("PodInitializing")])) is None


class RecordingKube:
    def __init__(self):
        self.created = []

    async def create(self, resource, body):
        self.created.append(body)
        return body


def _events_for(before, after, monkeypatch):
    monkeypatch.setattr(events, "_posted", type(events._posted)())
    kube = RecordingKube()
    body = {
        "apiVersion": "kvtier.io/v1alpha1",
        "kind": "InferenceDeployment",
        "metadata": {"name": "chat", "namespace": "ml", "uid": "u1"},
    }
    asyncio.run(post_transitions(kube, body, before, after))
    return [(e["type"], e["reason"], e["message"]) for e in kube.created]


def test_starting_replicas_post_a_normal_event_and_trouble_a_warning(monkeypatch):
    starting = [
        {"type": "Ready", "status": "False", "reason": "ReplicasStarting", "message": "0/1 replicas ready; starting"}
    ]
    assert _events_for([], starting, monkeypatch) == [
        ("Normal", "ReplicasStarting", "InferenceDeployment ml/chat: 0/1 replicas ready; starting")
    ]
    failing = [
        {
            "type": "Ready",
            "status": "False",
            "reason": "ReplicasNotReady",
            "message": "0/1 replicas ready: pod chat-0 container vllm: CrashLoopBackOff",
        }
    ]
    assert _events_for(starting, failing, monkeypatch) == [
        (
            "Warning",
            "ReplicasNotReady",
            "InferenceDeployment ml/chat: 0/1 replicas ready: pod chat-0 container vllm: CrashLoopBackOff",
        )
    ]
