"""Why a replica's quota cannot be applied: the LMCache container's own exit message, the known cause named,
or a server that does not answer in time; and a replica replaced during the call is no failure."""

import asyncio

import aiohttp
from aiohttp import web

from kvtier.contract import LMCACHE_CONTAINER, QUOTA_GATE, quota_path
from kvtier.rebalance.actuator import RAW_BLOCK_MISSING, apply_quotas, exit_reason, quota_in_place


def replicas_now(pods: list):
    """The pod watch's replicas of the deployment as they stand after the quota call (a deleted one is absent)."""

    async def now() -> list:
        return pods

    return now


def replica(name: str, gate: str = "True", uid: str = "u1") -> dict:
    """A replica whose `lmcache` container is ready at 127.0.0.1."""
    return {
        "metadata": {"name": name, "namespace": "team", "uid": uid},
        "status": {
            "podIP": "127.0.0.1",
            "containerStatuses": [{"name": LMCACHE_CONTAINER, "ready": True}],
            "conditions": [{"type": QUOTA_GATE, "status": gate}],
        },
    }


async def free_port() -> int:
    """A port nothing listens on (a server just stopped: its connection is refused)."""
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    return port


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
                replicas = [replica("serving-0", "True", uid="u0"), replica("new-1", "False", uid="u1")]
                return await apply_quotas(None, http, replicas, 2**30, port, replicas_now(replicas))
        finally:
            await runner.cleanup()

    serving, new = asyncio.run(scenario())
    for result in (serving, new):
        assert not result.applied and result.detail.endswith(f"{quota_path()}: no answer within 0.2 s"), result
    assert serving.unanswered and not new.unanswered


def test_a_replica_replaced_during_the_call_is_skipped_and_one_still_serving_is_a_failure():
    """Raising a volume's size rolls the StatefulSet (the device file is sized at start): the replica the
    controller deletes refuses the call the same moment. That is its successor's quota, not a failure;
    a refusal from a replica the API still calls serving is one."""
    replaced, renamed, deleting, serving = (replica(f"chat-{i}", uid=f"u{i}") for i in range(4))
    now = [
        {**renamed, "metadata": {**renamed["metadata"], "uid": "u1-successor"}},  # a new pod of the same name
        {**deleting, "metadata": {**deleting["metadata"], "deletionTimestamp": "2026-12-05T00:00:00Z"}},
        serving,
    ]  # chat-0 is gone

    async def scenario() -> list:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            return await apply_quotas(
                None, http, [replaced, renamed, deleting, serving], 2**30, await free_port(), replicas_now(now)
            )

    *gone, refused = asyncio.run(scenario())
    for result in gone:
        assert (
            result.skipped and not result.applied and result.detail.startswith("stopped serving during the call (")
        ), result
    assert not (refused.skipped or refused.unanswered or refused.applied) and "Connect call failed" in refused.detail


def test_a_quota_is_in_place_only_behind_an_open_gate_and_as_the_last_fresh_scrape_read_it():
    tib = 2**40
    assert quota_in_place(replica("chat-0", "True"), 4 * tib, 4 * tib)
    assert not quota_in_place(replica("chat-0", "False"), 4 * tib, 4 * tib)  # never confirmed by the operator
    assert not quota_in_place(replica("chat-0", "True"), 4 * tib, None)  # no fresh scrape, or the server lost it
    assert not quota_in_place(replica("chat-0", "True"), 4 * tib, 3 * tib)  # a round moved it
