"""Why a replica's quota cannot be applied: the LMCache container's own exit message, the known cause named."""

from kvtier.rebalance.actuator import RAW_BLOCK_MISSING, exit_reason


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
