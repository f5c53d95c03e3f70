"""The simulated kubelet's readiness probes: a ready container survives fewer than `failureThreshold` failures in a
row, with `probe_periods` a container is probed once per `periodSeconds`, not on every pass, and an answer later than
`timeoutSeconds` is a failure."""

import asyncio

import aiohttp
from aiohttp import web

from kvtier.testing.podsim.kubelet import Kubelet, RunningPod

PROBE = {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 10, "failureThreshold": 3}
POD = {
    "metadata": {"name": "p", "namespace": "n", "uid": "u"},
    "spec": {"containers": [{"name": "c", "readinessProbe": PROBE}]},
}


class FakeKube:
    def __init__(self) -> None:
        self.patches: list[dict] = []

    async def patch(self, resource, namespace, name, body, **kwargs):
        self.patches.append(body)
        return body


class ProbedKubelet(Kubelet):
    def __init__(self, answers: list[bool], probe_periods: bool) -> None:
        self.kube = FakeKube()  # type: ignore[assignment]  # records the status patches
        self.probe_periods = probe_periods
        self.answers = answers
        self.probed = 0
        self._running = {"u": RunningPod("u", "127.0.0.9", [])}

    async def _probe(self, address, container):
        self.probed += 1
        return self.answers.pop(0)


def _container_ready(pod: dict) -> bool:
    return pod["status"]["containerStatuses"][0]["ready"]


def _passes(kubelet: ProbedKubelet, count: int) -> list[bool]:
    """Readiness after each of `count` passes, each pass seeing the status the previous one wrote."""
    pod, seen = {**POD, "status": {}}, []

    async def run() -> None:
        nonlocal pod
        for _ in range(count):
            await kubelet._update_pod_status(pod)
            if kubelet.kube.patches:
                pod = {**pod, "status": kubelet.kube.patches[-1]["status"]}
            seen.append(_container_ready(pod))

    asyncio.run(run())
    return seen


def test_a_ready_container_turns_unready_after_failure_threshold_failures_in_a_row():
    kubelet = ProbedKubelet([True, False, False, True, False, False, False], probe_periods=False)
    assert _passes(kubelet, 7) == [True, True, True, True, True, True, False]
    assert kubelet.probed == 7


def test_a_container_never_ready_is_unready_at_its_first_failure():
    assert _passes(ProbedKubelet([False], probe_periods=False), 1) == [False]


def test_with_probe_periods_a_container_is_probed_once_per_period():
    kubelet = ProbedKubelet([True, False], probe_periods=True)
    assert _passes(kubelet, 5) == [True] * 5
    assert kubelet.probed == 1  # the passes within periodSeconds reuse the first answer


def test_a_probe_answered_after_timeout_seconds_fails():
    """As a kubelet's: an answer later than `timeoutSeconds` (1 s by default) is a failed probe."""

    async def run() -> tuple[bool, bool, bool]:
        async def slow(_: web.Request) -> web.Response:
            await asyncio.sleep(1.5)
            return web.Response(text="ok")

        async def fast(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_get("/slow", slow)
        app.router.add_get("/fast", fast)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        kubelet = ProbedKubelet([], probe_periods=False)
        kubelet._http = aiohttp.ClientSession()

        def container(path: str, timeout: int | None) -> dict:
            probe = {"httpGet": {"path": path, "port": port}, **({"timeoutSeconds": timeout} if timeout else {})}
            return {"name": "c", "readinessProbe": probe}

        try:
            return (
                await Kubelet._probe(kubelet, "127.0.0.1", container("/slow", None)),
                await Kubelet._probe(kubelet, "127.0.0.1", container("/slow", 3)),
                await Kubelet._probe(kubelet, "127.0.0.1", container("/fast", None)),
            )
        finally:
            await kubelet._http.close()
            await runner.cleanup()

    assert asyncio.run(run()) == (False, True, True)
