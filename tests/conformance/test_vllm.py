"""vLLM 0.33's own `serve` parser reads the `vllm serve` arguments kvtier renders as kvtier means them."""

from __future__ import annotations

import re

import pytest

from kvtier.api.ownedargs import ALWAYS_OWNED_FLAGS, KV_OWNED_FLAGS, owned_flag_problem
from kvtier.render.lmcache import IN_PROCESS_CONNECTOR, MP_CONNECTOR
from kvtier.render.options import RenderOptions
from tests.conformance import rendered

pytestmark = pytest.mark.conformance

#: Owned fields: the `EngineArgs` (or server) destination of each flag kvtier renders itself.
ALWAYS_OWNED_DESTS = (
    "port",
    "host",
    "model",
    "served_model_name",
    "tensor_parallel_size",
    "gpu_memory_utilization",
    "max_model_len",
)
KV_OWNED_DESTS = ("kv_transfer_config", "kv_offloading_size", "kv_offloading_backend")
#: With the rendered positional model, vLLM refuses a second model outright.
CONFLICT = "vLLM refuses the combination"
#: Spellings users may try, with the value vLLM must read into the owned field (or CONFLICT).
REFUSED = [
    (["--port", "9000"], "port", 9000),
    (["--port=9000"], "port", 9000),
    (["--host", "127.0.0.1"], "host", "127.0.0.1"),
    (["--model", "other/model"], "model", CONFLICT),
    (["--served-model-name", "other"], "served_model_name", ["other"]),
    (["--served_model_name=other"], "served_model_name", ["other"]),
    (["--tensor-parallel-size", "4"], "tensor_parallel_size", 4),
    (["--tensor_parallel_size", "4"], "tensor_parallel_size", 4),
    (["-tp", "4"], "tensor_parallel_size", 4),
    (["--gpu-memory-utilization", "0.5"], "gpu_memory_utilization", 0.5),
    (["--device-memory-utilization", "0.5"], "gpu_memory_utilization", 0.5),
    (["--max-model-len", "4096"], "max_model_len", 4096),
    (
        ["--kv-transfer-config", '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'],
        "kv_transfer_config",
        "LMCacheConnectorV1",
    ),
    (["--kv-offloading-size", "8"], "kv_offloading_size", 8.0),
    (["--kv-offloading-backend", "lmcache"], "kv_offloading_backend", "lmcache"),
]


@pytest.fixture(scope="module")
def cases():
    return rendered.examples() + rendered.vllm_matrix()


@pytest.fixture(scope="module")
def parsed(engines, cases):
    """Every case's argv as vLLM parsed it, plus the refused spellings and a deliberately unknown flag."""
    base = rendered.render("base", rendered.deployment("None")).vllm_argv
    argv = [case.vllm_argv for case in cases]
    argv += [base + words for words, _, _ in REFUSED]
    argv.append(base + ["--kvtier-no-such-flag", "1"])
    answers = engines.ask("vllm-serve", {"argv": argv})
    count = len(cases)
    return {
        "cases": dict(zip((case.name for case in cases), answers[:count])),
        "refused": answers[count : count + len(REFUSED)],
        "unknown": answers[-1],
    }


@pytest.fixture(scope="module")
def options(engines):
    return engines.ask("vllm-options", {"dests": [*ALWAYS_OWNED_DESTS, *KV_OWNED_DESTS]})


def test_every_rendered_variant_parses_into_the_intended_engine_args(cases, parsed):
    port = RenderOptions().vllm_port
    for case in cases:
        answer = parsed["cases"][case.name]
        assert "error" not in answer, f"{case.name}: vLLM refused `vllm serve {' '.join(case.vllm_argv)}`: {answer}"
        engine, spec = answer["engine"], case.deployment.spec
        assert engine["model"] == spec.model.name, case.name
        assert engine["served_model_name"] == [spec.served_name], case.name
        assert engine["tensor_parallel_size"] == spec.engine.tensor_parallel_size, case.name
        assert engine["gpu_memory_utilization"] == spec.engine.gpu_memory_utilization, case.name
        assert engine["max_model_len"] == spec.engine.max_model_len, case.name
        assert answer["port"] == port, case.name
        # With the probe sidecar, vLLM also exports its block-lifetime histograms.
        assert engine["kv_cache_metrics"] is ("kvtier-probe" in case.containers), case.name
        transfer = engine["kv_transfer_config"]
        if spec.kv_cache.mode == "None":
            assert transfer is None, case.name
            continue
        assert transfer["kv_role"] == "kv_both", case.name
        if spec.kv_cache.mode == "LMCacheMP":
            assert transfer["kv_connector"] == MP_CONNECTOR, case.name
            assert transfer["kv_connector_extra_config"] == {
                "lmcache.mp.host": "tcp://localhost",
                "lmcache.mp.port": RenderOptions().lmcache_port,
            }, case.name
        else:
            assert transfer["kv_connector"] == IN_PROCESS_CONNECTOR, case.name


def test_user_engine_args_reach_vllm(cases, parsed):
    with_args = [case for case in cases if "--max-num-seqs" in case.deployment.spec.engine.args]
    assert with_args
    for case in with_args:
        engine = parsed["cases"][case.name]["engine"]
        assert engine["max_num_seqs"] == int(rendered.flag(case.deployment.spec.engine.args, "--max-num-seqs"))
        assert engine["enable_expert_parallel"] is True, case.name


def test_the_connectors_are_in_vllms_registry(options):
    assert {MP_CONNECTOR, IN_PROCESS_CONNECTOR} <= set(options["connectors"])


def test_an_unknown_flag_fails(parsed):
    assert "unrecognized arguments: --kvtier-no-such-flag" in parsed["unknown"].get("error", ""), parsed["unknown"]


@pytest.mark.parametrize("index", range(len(REFUSED)), ids=[" ".join(words) for words, _, _ in REFUSED])
def test_refused_user_args_mean_what_kvtier_says(parsed, index):
    """What kvtier refuses in `engine.args` does override the field it renders (so refusing it is right)."""
    words, dest, value = REFUSED[index]
    pattern = ALWAYS_OWNED_FLAGS if dest in ALWAYS_OWNED_DESTS else KV_OWNED_FLAGS
    assert re.search(pattern, words[0]), f"kvtier does not refuse {words[0]}"
    answer = parsed["refused"][index]
    if value == CONFLICT:
        assert "error" in answer, f"{' '.join(words)}: vLLM accepted it beside the rendered model"
        return
    assert "error" not in answer, answer
    read = answer["port"] if dest == "port" else answer["host"] if dest == "host" else answer["engine"][dest]
    if dest == "kv_transfer_config":
        read = read["kv_connector"]
    assert read == value, f"{' '.join(words)}: vLLM read {dest}={read!r}"


def test_kvtier_refuses_every_spelling_vllm_registers_for_an_owned_field(options):
    owned = {
        **{dest: ALWAYS_OWNED_FLAGS for dest in ALWAYS_OWNED_DESTS},
        **{dest: KV_OWNED_FLAGS for dest in KV_OWNED_DESTS},
    }
    assert set(options["options"]) == set(owned), "a destination kvtier owns is not in vLLM's serve parser"
    for dest, spellings in options["options"].items():
        for spelling in spellings:
            assert re.search(owned[dest], spelling), f"vLLM reads {spelling} into {dest}, kvtier does not refuse it"


def test_kvtier_refuses_abbreviations_vllm_accepts(engines, options):
    spellings = ["--gpu-memory-util", "--tensor-parallel", "--served-model", "--max-model", "--ho", "-t"]
    base = rendered.render("base", rendered.deployment("None")).vllm_argv
    answers = engines.ask("vllm-serve", {"argv": [base + [spelling, "1"] for spelling in spellings]})
    accepted = [spelling for spelling, answer in zip(spellings, answers) if "error" not in answer]
    assert options["allow_abbrev"] and accepted, "vLLM no longer accepts abbreviations: see kvtier.api.ownedargs"
    not_refused = [s for s in accepted if owned_flag_problem(f"{s}=1", connector=True) is None]
    assert not not_refused, f"vLLM accepts {not_refused}, which kvtier lets through into owned fields"


def _resolves_to(every: dict[str, str], spelling: str) -> str | None:
    """The destination argparse (allow_abbrev) gives a prefix of vLLM's flags, None when ambiguous or unknown."""
    if spelling in every:
        return every[spelling]
    long = spelling.startswith("--")
    dests = {dest for option, dest in every.items() if option.startswith(spelling) and option.startswith("--") == long}
    return dests.pop() if len(dests) == 1 else None


def test_every_prefix_vllm_reads_as_an_owned_field_is_refused(options):
    """From vLLM's own table of flags: each prefix of an owned flag that argparse resolves to it is refused."""
    owned = {*ALWAYS_OWNED_DESTS, *KV_OWNED_DESTS}
    every = options["every"]
    prefixes = {
        option[:end]
        for option, dest in every.items()
        if dest in owned
        for end in range(2 if option[1] != "-" else 3, len(option) + 1)
    }
    read_as_owned = sorted(p for p in prefixes if _resolves_to(every, p) in owned)
    assert "--gpu-memory-util" in read_as_owned and "-t" in read_as_owned
    for spelling in read_as_owned:
        # vLLM reads `--a_b` as `--a-b` (its parser swaps underscores in long flags before argparse sees them).
        for written in {spelling, "--" + spelling[2:].replace("-", "_") if spelling.startswith("--") else spelling}:
            assert owned_flag_problem(f"{written}=1", connector=True), f"vLLM reads {written} as an owned field"


def test_no_flag_vllm_reads_into_a_field_kvtier_leaves_to_users_is_refused(options):
    owned = {*ALWAYS_OWNED_DESTS, *KV_OWNED_DESTS}
    refused = sorted(
        option
        for option, dest in options["every"].items()
        if dest not in owned and owned_flag_problem(f"{option}=1", connector=True)
    )
    assert refused == []
