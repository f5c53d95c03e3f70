"""LMCache 0.5.6's own config loader and `lmcache server` argument parser read what kvtier renders."""

from __future__ import annotations

import json
import math

import pytest

from kvtier.api.units import gib
from kvtier.render.lmcache import CONFIG_KEY, EVICTION_POLICY, LOOKUP_LOG_DIR
from kvtier.render.options import RenderOptions
from kvtier.render.pod import CONFIG_VOLUME
from tests.conformance import rendered

pytestmark = pytest.mark.conformance


@pytest.fixture(scope="module")
def cases():
    return rendered.lmcache_cases()


@pytest.fixture(scope="module")
def lmcache_source(engines):
    return "\n".join(engines.source("lmcache").values())


@pytest.fixture(scope="module")
def servers(engines, cases):
    """Each MP case's `lmcache server` argv through LMCache's parser and config builders, plus broken variants."""
    mp = [case for case in cases if case.lmcache_argv is not None]
    no_storage = next(case for case in mp if case.name == "mp-no-storage").lmcache_argv
    without_policy = list(no_storage)
    del without_policy[without_policy.index("--eviction-policy") : without_policy.index("--eviction-policy") + 2]
    argv = [case.lmcache_argv for case in mp] + [no_storage + ["--kvtier-no-such-flag", "1"], without_policy]
    answers = engines.ask("lmcache-server", {"argv": argv})
    return {"cases": list(zip(mp, answers[: len(mp)])), "unknown": answers[-2], "without_policy": answers[-1]}


def test_rendered_server_args_build_the_intended_configs(servers):
    options = RenderOptions()
    assert len(servers["cases"]) >= 6
    for case, answer in servers["cases"]:
        assert "error" not in answer, f"{case.name}: LMCache refused `lmcache server {case.lmcache_argv}`: {answer}"
        args, spec = answer["args"], case.deployment.spec
        assert answer["mp"]["port"] == options.lmcache_port, case.name
        assert answer["mp"]["host"] == "localhost", case.name
        assert answer["mp"]["chunk_size"] == spec.kv_cache.chunk_size, case.name
        assert (answer["http"]["http_host"], answer["http"]["http_port"]) == ("0.0.0.0", options.lmcache_http_port)
        assert math.isclose(args["l1_size_gb"], gib(spec.kv_cache.cpu.size)), case.name
        assert args["eviction_policy"] == EVICTION_POLICY, case.name
        built = answer["storage"]["l2_adapter_config"]["adapters"]
        if "--l2-adapter" in case.lmcache_argv:
            rendered_adapter = json.loads(rendered.flag(case.lmcache_argv, "--l2-adapter"))
            (adapter,) = built
            assert adapter["__type__"] == "RawBlockL2AdapterConfig", case.name
            for key, value in rendered_adapter.items():
                if key != "type":
                    assert adapter.get(key) == value, f"{case.name}: adapter {key}: LMCache built {adapter.get(key)!r}"
        else:
            assert built == [], case.name
        if "--lookup-hash-log-dir" in case.lmcache_argv:
            assert args["lookup_hash_log_dir"] == LOOKUP_LOG_DIR, case.name


def test_an_unknown_server_flag_fails(servers):
    assert "unrecognized arguments: --kvtier-no-such-flag" in servers["unknown"].get("error", ""), servers["unknown"]


def test_lmcache_exits_without_an_eviction_policy_so_kvtier_always_renders_one(servers):
    """Defect 1 of issue 17: `--l1-size-gb` without `--eviction-policy` stops 0.5.6 at start."""
    assert "--eviction-policy" in servers["without_policy"].get("error", ""), servers["without_policy"]


def test_rendered_config_files_load_with_lmcaches_loader(engines, cases, lmcache_source):
    in_process = [case for case in cases if case.lmcache_yaml is not None]
    assert len(in_process) >= 3
    for case in in_process:
        # vLLM's container finds the file where the ConfigMap is mounted, by the variable LMCache reads.
        vllm = case.containers["vllm"]
        env = {var["name"]: var.get("value") for var in vllm["env"]}
        (mount,) = [m for m in vllm["volumeMounts"] if m["name"] == CONFIG_VOLUME]
        assert env["LMCACHE_CONFIG_FILE"] == f"{mount['mountPath']}/{CONFIG_KEY}", case.name
        answer = engines.ask("lmcache-config", {"yaml": case.lmcache_yaml})
        written = rendered.lmcache_config(case)
        assert answer["ignored"] == [], f"{case.name}: LMCache ignores {answer['ignored']}: {answer['warnings']}"
        # The loader turns the `file://` URL LMCache documents for local_disk into the directory it writes to.
        expected = {
            key: value.removeprefix("file://") if key == "local_disk" else value for key, value in written.items()
        }
        assert answer["values"] == expected, case.name
        for name, plugin in answer["plugins"].items():
            assert plugin.get("class_found"), f"{case.name}: storage plugin {name}: {plugin}"
        for key in written.get("extra_config", {}):
            if not key.startswith("storage_plugin."):
                assert f'"{key}"' in lmcache_source, f"{case.name}: LMCache never reads extra_config {key}"


def test_an_unknown_config_key_is_caught(engines, cases):
    case = next(case for case in cases if case.lmcache_yaml is not None)
    answer = engines.ask("lmcache-config", {"yaml": case.lmcache_yaml + "kvtier_no_such_key: 1\n"})
    assert answer["ignored"] == ["kvtier_no_such_key"], answer


def test_the_mp_connector_loads_a_hit_asynchronously_as_the_replay_models_it(engines):
    """The replay's prefill queue (docs/cost-model.md) holds no GPU while a hit loads and computes the
    misses after the load: what LMCache's MP connector asks of vLLM's scheduler (an asynchronous
    load, the request parked in WAITING_FOR_REMOTE_KVS meanwhile), not a layer-by-layer overlap."""
    cases = [
        {"prompt_tokens": 1024, "computed_tokens": 256, "lmcache_hit_tokens": 768},  # a prefix hit
        {"prompt_tokens": 1024, "computed_tokens": 0, "lmcache_hit_tokens": 1024},  # the whole prompt
        {"prompt_tokens": 1024, "computed_tokens": 0, "lmcache_hit_tokens": 0},  # a miss
    ]
    answers = engines.ask("mp-connector-load", {"cases": cases, "block_size": 16, "blocks_per_chunk": 16})
    assert answers[0]["connector"] == "lmcache.integration.vllm.lmcache_mp_connector.LMCacheMPConnector"
    prefix, whole, miss = ((answer["tokens_to_load"], answer["load_async"]) for answer in answers)
    assert prefix == (512, True)  # what vLLM's own prefix cache lacks, loaded asynchronously
    assert whole == (1023, True)  # vLLM recomputes the last token of a prompt found whole
    assert miss == (0, False)
