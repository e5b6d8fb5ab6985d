"""Greedy tokens identical to transformers, for every architecture, in float32.

One batch of 9 prompts of lengths 1..300 goes through tacit at once (mixed prefill and
decode in each step); transformers runs each prompt alone, so no padding is involved on
its side. The same batch is then run under a tight token budget (chunked prefill) and with
a KV pool small enough to force preemption.
"""

import json

import pytest
import torch

from tacit import LLM, SamplingParams
from tacit.config.model import layer_sliding_windows
from tacit.kv_cache_interface import FullAttentionSpec, sliding_peak_blocks, sliding_windows_of
from tacit.memory.kv_cache_utils import window_groups

ARCHS = [
    "llama",
    "llama3",
    "qwen2",
    "qwen3",
    "qwen3_sliding",
    "qwen3_moe",
    "qwen3_moe_nonorm",
    "deepseek_v3",
    "deepseek_v3_qlora",
    "deepseek_v32",
    "glm_moe_dsa",
]
ARCHS += ["gpt_oss"]  # sliding window 24 < the longer prompts, sinks, YaRN, biased clamped-SwiGLU experts
ARCHS += ["gemma3"]  # 6 layers in the 5:1 sliding pattern, a 32-token window: the longer prompts exceed it
LENGTHS = [1, 2, 7, 16, 17, 45, 100, 201, 300]
MAX_NEW = 16


def prompts_for(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1234)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in LENGTHS]


@pytest.fixture(scope="module", params=ARCHS)
def reference(request, tiny_model_factory):
    model, tok, path = tiny_model_factory(request.param)
    prompts = prompts_for(model.config.vocab_size)
    expected, first_logits = [], []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            out = model.generate(
                ids, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None, pad_token_id=0, min_new_tokens=MAX_NEW
            )
            expected.append(out[0, len(p) :].tolist())
            first_logits.append(model(ids).logits[0, -1].float())
    return request.param, path, prompts, expected, first_logits


GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=5)


def check(outs, prompts, expected):
    for p, o, e in zip(prompts, outs, expected):
        assert o.prompt_token_ids == p
        assert o.outputs[0].token_ids == e, f"prompt of length {len(p)} diverged"
        assert o.outputs[0].finish_reason == "length"


def test_greedy_matches_transformers(reference):
    arch, path, prompts, expected, first_logits = reference
    llm = LLM(str(path), dtype="float32")
    outs = llm.generate(prompts, GREEDY)
    check(outs, prompts, expected)
    # Prefill logits close: the top-5 logprobs of the first sampled token against transformers'.
    for o, logits in zip(outs, first_logits):
        ref = logits.log_softmax(-1)
        got = o.outputs[0].logprobs[0]
        for token_id, lp in got.items():
            assert abs(lp.logprob - float(ref[token_id])) < 1e-4


def test_chunked_prefill_matches(reference):
    arch, path, prompts, expected, _ = reference
    llm = LLM(str(path), dtype="float32", max_num_batched_tokens=48)
    check(llm.generate(prompts, GREEDY), prompts, expected)
    assert llm.engine.num_steps > sum(len(p) for p in prompts) // 48


def pool_blocks(path, full_blocks: int, block_size: int, chunk: int) -> int:
    """full_blocks for each full-attention block table, and each sliding-window table's most (its
    window and a chunk), over the engine's own grouping of the model's layers."""
    windows = layer_sliding_windows(json.loads((path / "config.json").read_text()))
    shape = FullAttentionSpec(block_size=block_size, dtype=torch.float32, num_kv_heads=1, head_size=1)
    tables = sliding_windows_of(window_groups(windows, shape))
    return sum(full_blocks if w is None else sliding_peak_blocks(w, block_size, chunk) for w in tables)


def test_preemption_resumes_exactly(reference):
    arch, path, prompts, expected, _ = reference
    # 24 blocks of 16 = 384 slots: the 300-token prompt alone needs 20 of them.
    blocks = pool_blocks(path, 24, 16, 128)
    llm = LLM(str(path), dtype="float32", num_kv_blocks=blocks, block_size=16, max_num_batched_tokens=128)
    check(llm.generate(prompts, GREEDY), prompts, expected)
    stats = llm.engine.get_stats()
    assert stats.num_preemptions > 0
    assert stats.kv_blocks_free == blocks
