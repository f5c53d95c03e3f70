"""The prefill cost model: attention grows with position, presets from public shapes, and the seed's
setting reproduced in the replay's prefill queue."""

import pytest

from kvtier.rebalance.costmodel import (
    LLAMA3_70B,
    PRESETS,
    QWEN3_CODER_480B,
    SEED_READ_BYTES_PER_SECOND,
    CostModel,
    preset,
)
from kvtier.sim.replay import PrefillQueue, percentile, taken_hits


def test_preset_shapes_give_the_published_kv_sizes():
    assert LLAMA3_70B.kv_bytes_per_token == 327_680  # the scenarios' LLaMA-3-70B fp16 figure
    assert QWEN3_CODER_480B.kv_bytes_per_token == 253_952
    assert set(PRESETS) == {"llama-3-70b-4xh100", "qwen3-coder-480b-8xh20"}
    with pytest.raises(KeyError, match="known: llama-3-70b-4xh100"):
        preset("gpt-5")


def test_prefill_time_adds_up_and_a_deep_block_costs_more_than_a_shallow_one():
    model = preset("llama-3-70b-4xh100")
    assert model.prefill_seconds(0, 60_000) == pytest.approx(
        model.prefill_seconds(0, 20_000) + model.prefill_seconds(20_000, 60_000)
    )
    first, deep = model.prefill_seconds(0, 512), model.prefill_seconds(99_488, 100_000)
    assert deep > 2 * first  # the attention term: (b^2 - a^2) grows with the block's position
    # So a hit token of a long prompt saves more GPU time than one of a short prompt.
    assert model.saved_per_hit_token(100_000) > 1.5 * model.saved_per_hit_token(2_000)
    # Without the attention term (the scenario format's flat speed) a token is a token.
    flat = CostModel.linear(20_000, 327_680, 5e9)
    assert flat.prefill_seconds(0, 512) == pytest.approx(flat.prefill_seconds(99_488, 100_000)) == 0.0256


def test_a_request_computes_its_misses_once_its_hits_are_loaded():
    model = CostModel.linear(1_000, 1_000, 1e6)
    queue = PrefillQueue(model, cpu_read_bytes_per_second=1e9)
    # 1,000 hit tokens load in 1 s (LMCache's MP connector loads asynchronously, before the
    # request is scheduled), then its 500 missed tokens compute in 0.5 s.
    assert queue.serve(0.0, 1_500, (0, 0, 1_000)) == pytest.approx(1.5)
    assert queue.storage_read_seconds == pytest.approx(1.0)
    assert queue.gpu_seconds_saved == pytest.approx(1.0) and queue.gpu_seconds == pytest.approx(0.5)
    # A whole prompt found in storage still computes its last token (vLLM's rule; LMCache loads the rest).
    assert queue.serve(10.0, 1_000, (0, 0, 1_000)) == pytest.approx(10.0 + 0.999 + 0.001)
    assert queue.storage_read_seconds == pytest.approx(1.0 + 0.999)
    assert taken_hits(1_000, (600, 300, 100)) == (600, 300, 99)
    assert taken_hits(1_000, (600, 400, 0)) == (600, 399, 0)
    assert taken_hits(1_000, (500, 0, 0)) == (500, 0, 0)


def test_a_request_waiting_for_its_load_holds_no_gpu():
    model = CostModel.linear(1_000, 1_000, 1e6)
    queue = PrefillQueue(model, cpu_read_bytes_per_second=1e9)
    assert queue.serve(0.0, 2_500, (0, 0, 2_000)) == pytest.approx(2.5)  # loads 0-2 s, computes 2-2.5 s
    # Arriving while the GPUs wait for that load, a miss of 1 s computes at once, in the idle stretch
    # (vLLM parks the loading request in WAITING_FOR_REMOTE_KVS and schedules the others).
    assert queue.serve(0.5, 1_000, (0, 0, 0)) == pytest.approx(1.5)
    # One that does not fit before the reserved compute goes after it, never delaying it.
    assert queue.serve(0.6, 600, (0, 0, 0)) == pytest.approx(3.1)
    # A shorter one fits what is left of the idle stretch (1.5-2 s).
    assert queue.serve(1.5, 400, (0, 0, 0)) == pytest.approx(1.9)
    assert queue.gpu_free_at == pytest.approx(3.1)


def _closed_loop(model: CostModel, prompt_tokens: int, hit_tokens: int, clients: int = 16, rounds: int = 20) -> float:
    """``clients`` users each sending their next prompt when the last one's first token arrives; TTFT p50."""
    queue = PrefillQueue(model, cpu_read_bytes_per_second=20e9)
    ready = [0.0] * clients
    for _ in range(rounds):
        for client in sorted(range(clients), key=lambda c: ready[c]):
            ready[client] = queue.serve(ready[client], prompt_tokens, (0, 0, hit_tokens))
    warm = sorted(queue.ttfts[clients:])
    return percentile(warm, 50)


def test_the_seeds_setting_recompute_against_loading_from_the_array():
    """R2: the 480B MoE on TP8, concurrency 16, TTFT p50 149.5 s recomputing vs 11.85 s loading
    (12.6x). Long prompts of 100,000 tokens whose prefix is in the array (all but the last block)."""
    model = preset("qwen3-coder-480b-8xh20", SEED_READ_BYTES_PER_SECOND)
    prompt = 100_000
    recompute = _closed_loop(model, prompt, 0)
    loaded = _closed_loop(model, prompt, prompt - 512)
    assert 12.6 / 2 <= recompute / loaded <= 12.6 * 2


def test_known_models_by_id_or_path_and_the_flops_a_hit_token_saves():
    from kvtier.rebalance.costmodel import LLAMA3_70B, QWEN3_CODER_480B, known_shape

    assert known_shape("meta-llama/Meta-Llama-3-70B-Instruct") is LLAMA3_70B
    assert known_shape("/mnt/models/qwen3-coder-480b-a35b-instruct-fp8") is QWEN3_CODER_480B
    assert known_shape("acme/llama-3-70b-finetune") is None
    # 2 x active parameters for every token, plus attention that grows with the prompt.
    assert LLAMA3_70B.hit_token_flops(1) == pytest.approx(2 * 70.6e9 + 2 * 80 * 64 * 128)
    # At 100k tokens attention is about as much again as the matrix products.
    assert LLAMA3_70B.hit_token_flops(100_000) == pytest.approx(2 * 70.6e9 + 2 * 80 * 8192 * 100_000)
    assert LLAMA3_70B.hit_token_flops(100_000) > 1.5 * LLAMA3_70B.hit_token_flops(1_000)
