"""Why a replica's quota cannot be applied: the LMCache container's own exit message, the known cause named,
or a server that does not answer in time."""

import asyncio

import aiohttp
from aiohttp import web

from kvtier.contract import LMCACHE_CONTAINER, QUOTA_GATE, quota_path
from kvtier.rebalance.actuator import RAW_BLOCK_MISSING, apply_quotas, exit_reason


def pod(name="lmcache", **states):
    return {"metadata": {"name": "chat-0"}, "status": {"containerStatuses": [{"name": name, "ready": False, **states}]}}


def test_a_missing_raw_block_extension_is_named_with_the_package_to_install():
    message = f"Traceback ...\nRuntimeError: {RAW_BLOCK_MISSING}. Install / build `rust_raw_block_io` and retry."
    reason = exit_reason(pod(lastState={"terminated": {"exitCode": 1, "message": message}}), "lmcache")
    assert "lmcache-rust-raw-block-io" in reason and RAW_BLOCK_MISSING in reason


def test_other_exits_give_the_last_line_and_running_containers_nothing():
    crashed = pod(state={"terminated": {"exitCode": 2, "message": "usage: lmcache\nlmcache: error: bad flag"}})
    assert exit_reason(crashed, "lmcache") == "container lmcache exits with code 2: lmcache: error: bad flag"
    assert (
        exit_reason(pod(lastState={"terminated": {"exitCode": 137, "reason": "OOMKilled"}}), "lmcache")
        == "container lmcache exits with code 137: OOMKilled"
    )
    assert exit_reason(pod(state={"running": {}}), "lmcache") is None
    assert exit_reason(pod(lastState={"terminated": {"exitCode": 0}}), "lmcache") is None
    assert exit_reason(pod("vllm", lastState={"terminated": {"exitCode": 1}}), "lmcache") is None
    assert exit_reason({"metadata": {}}, "lmcache") is None


def test_a_server_that_does_not_answer_is_said_so_and_spares_a_replica_already_serving_its_quota():
    """The 300-deployment scale run's QuotaNotApplied read `http://...:8080/quota/_default: ` (a timeout has
    no text), and flipped Ready on replicas serving with their quota while their server was slow."""

    async def hang(request: web.Request) -> web.Response:
        await asyncio.sleep(1)
        return web.json_response({})

    def replica(name: str, gate: str) -> dict:
        return {
            "metadata": {"name": name},
            "status": {
                "podIP": "127.0.0.1",
                "containerStatuses": [{"name": LMCACHE_CONTAINER, "ready": True}],
                "conditions": [{"type": QUOTA_GATE, "status": gate}],
            },
        }

    async def scenario() -> list:
        app = web.Application()
        app.router.add_route("*", quota_path(), hang)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.2)) as http:
                replicas = [replica("serving-0", "True"), replica("new-1", "False")]
                return await apply_quotas(None, http, replicas, 2**30, port)  # no gate is opened: no API client
        finally:
            await runner.cleanup()

    serving, new = asyncio.run(scenario())
    for result in (serving, new):
        assert not result.applied and result.detail.endswith(f"{quota_path()}: no answer within 0.2 s"), result
    assert serving.unanswered and not new.unanswered
