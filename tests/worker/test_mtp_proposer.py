"""Speculative decoding with DeepSeek-V3's MTP layer (vLLM's "mtp"): the layer's logits equal
transformers' MtpModel on the same weights, its KV entries live in the target's blocks (so the
prefix cache, preemption and int8 KV keep working), and greedy output is that of no speculation
and of transformers."""

from __future__ import annotations

import shutil

import pytest
import torch
from near_ties import assert_bf16_runs_agree, save_bf16_valued

from tacit import LLM, SamplingParams
from tacit.bench.random_mtp import write_mtp_layer

from tiny_models import build_hf_model

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 40, 41], list(range(30, 70)), [9, 10] * 12]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


def mtp_config(k: int) -> dict:
    # Every draft verified: the controller's choice depends on this host's step times.
    return {"method": "mtp", "num_speculative_tokens": k, "min_speculative_tokens": k}


@pytest.fixture(scope="module")
def deepseek_mtp(tmp_path_factory):
    path = tmp_path_factory.mktemp("deepseek_v3_mtp")
    model, _ = build_hf_model("deepseek_v3", path)
    return model, write_mtp_layer(model, path), path


def tokens(outs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outs]


def test_mtp_logits_equal_transformers_mtp_model(deepseek_mtp):
    from transformers.cache_utils import MtpCache

    hf, mtp, path = deepseek_mtp
    llm = LLM(str(path), dtype="float32", speculative_config=mtp_config(1))
    drafter = llm.engine.runner.drafter
    seen = []
    real = drafter._forward

    def capture(rows, previous):
        out = real(rows, previous)
        seen.append(out[1].clone())
        return out

    drafter._forward = capture
    prompt = PROMPTS[1]
    llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    with torch.no_grad():
        out = hf(torch.tensor([prompt]), output_hidden_states=True)
        sampled = int(out.logits[0, -1].argmax())
        # transformers' layout: entry p (tokens 1..P) at position p, after the target's hidden states 0..P-1.
        _, want, _ = mtp(
            input_ids=torch.tensor([prompt[1:] + [sampled]]),
            last_hidden_states=out.hidden_states[-1],
            attention_mask=None,
            position_ids=torch.arange(1, len(prompt) + 1)[None],
            mtp_cache=MtpCache(config=hf.config.get_mtp_config()),
        )
    torch.testing.assert_close(seen[0][0], want[0, -1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_output_is_unchanged_and_equals_transformers(deepseek_mtp, k):
    hf, _, path = deepseek_mtp
    want = tokens(LLM(str(path), dtype="float32").generate(PROMPTS, GREEDY))
    spec = LLM(str(path), dtype="float32", speculative_config=mtp_config(k))
    assert tokens(spec.generate(PROMPTS, GREEDY)) == want
    for p, w in zip(PROMPTS, want):
        ref = hf.generate(torch.tensor([p]), max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert ref[0, len(p) :].tolist() == w
    stats = spec.engine.get_stats()
    assert stats.spec_decode_num_draft_tokens > 0
    assert not spec.engine.runner.drafter.entries  # finished requests' entries dropped
    assert stats.kv_blocks_used == 0  # lookahead blocks freed with the request


@pytest.mark.parametrize(
    "engine_kw",
    [
        {"max_num_batched_tokens": 16, "enable_chunked_prefill": True},
        {"kv_cache_dtype": "int8"},
        {"enable_prefix_caching": False, "num_kv_blocks": 6},  # 2 + 4 + 3 blocks wanted: preemptions
    ],
    ids=["chunked-prefill", "int8-kv", "preempted"],
)
def test_greedy_output_is_unchanged_under_engine_settings(deepseek_mtp, engine_kw):
    path = str(deepseek_mtp[2])
    want = tokens(LLM(path, dtype="float32", **engine_kw).generate(PROMPTS, GREEDY))
    spec = LLM(path, dtype="float32", speculative_config=mtp_config(2), **engine_kw)
    assert tokens(spec.generate(PROMPTS, GREEDY)) == want
    stats = spec.engine.get_stats()
    assert stats.spec_decode_num_draft_tokens > 0
    assert stats.num_preemptions > 0 or "num_kv_blocks" not in engine_kw


def test_a_prefix_hit_recomputes_its_last_block_and_drafts_as_without_the_hit(deepseek_mtp):
    """The second request shares the first's 40-token prompt: its hit gives back the last
    block (the MTP entry before the first computed token needs that token's hidden state), and
    its drafts are those of a run without any cache."""
    path = str(deepseek_mtp[2])
    prompt = PROMPTS[1]
    cold = LLM(path, dtype="float32", enable_prefix_caching=False, speculative_config=mtp_config(2))
    cold_drafts = []
    cold.engine.runner.drafter.propose = _recording(cold.engine.runner.drafter.propose, cold_drafts)
    want = tokens(cold.generate([prompt], GREEDY))
    warm = LLM(path, dtype="float32", speculative_config=mtp_config(2))
    warm.generate([prompt], GREEDY)
    warm_drafts = []
    warm.engine.runner.drafter.propose = _recording(warm.engine.runner.drafter.propose, warm_drafts)
    assert tokens(warm.generate([prompt], GREEDY)) == want
    assert warm.engine.get_stats().prefix_cache_hits > 0
    assert warm_drafts == cold_drafts


def _recording(propose, into: list):
    def wrapped(requests):
        out = propose(requests)
        into.append(sorted(out.values()))
        return out

    return wrapped


def test_seeded_sampling_is_reproducible(deepseek_mtp):
    path = str(deepseek_mtp[2])
    spec = LLM(path, dtype="float32", speculative_config=mtp_config(2))
    params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=3)
    assert tokens(spec.generate(PROMPTS, params)) == tokens(spec.generate(PROMPTS[::-1], params))[::-1]


def test_mtp_is_refused_where_it_cannot_run(deepseek_mtp, tiny_llama, tmp_path):
    with pytest.raises(ValueError, match="runs DeepSeek-V3/R1/V3.2's MTP layers; .* is LlamaForCausalLM"):
        LLM(str(tiny_llama[2]), dtype="float32", speculative_config=mtp_config(1))
    bare = tmp_path / "no_mtp"
    shutil.copytree(deepseek_mtp[2], bare)
    (bare / "model-mtp.safetensors").unlink()
    with pytest.raises(ValueError, match=r"holds no whole MTP layer under model.layers.3. \(checkpoint is missing"):
        LLM(str(bare), dtype="float32", speculative_config=mtp_config(1))
    with pytest.raises(ValueError, match="tensor_parallel_size > 1 is not supported yet"):
        LLM(str(deepseek_mtp[2]), dtype="float32", tensor_parallel_size=2, speculative_config=mtp_config(1))


def test_bf16_output_parts_from_no_speculation_only_at_near_ties(tmp_path):
    """In bf16 a verify row attends over rows written in the same forward (a prefill's
    attention), not over the cache alone (a decode's), so its logits round otherwise: greedy
    output may part from one token a step only where the top two are within the bf16 noise
    derived from this host's own arithmetic (near_ties.py). Measured here before this test:
    every parting was a near tie (top-two gaps 0.006-0.04 on logits near 3)."""
    model, _ = build_hf_model("deepseek_v3", tmp_path)
    save_bf16_valued(model, tmp_path)
    write_mtp_layer(model, tmp_path)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=3)
    plain = LLM(str(tmp_path), dtype="bfloat16")
    spec = LLM(str(tmp_path), dtype="bfloat16", speculative_config=mtp_config(3))
    # The MTP layer built into the model keeps no decode step off the fused decoder (its float32
    # router once made the binder refuse the whole model).
    assert spec.engine.runner.decode_path == plain.engine.runner.decode_path
    ref = plain.generate(PROMPTS, params)
    got = spec.generate(PROMPTS, params)
    assert spec.engine.get_stats().spec_decode_num_draft_tokens > 0
    assert_bf16_runs_agree(LLM(str(tmp_path), dtype="float32"), PROMPTS, ref, got)


def test_deepseek_v32_mtp_layer_runs_sparse_attention(tmp_path):
    """DeepSeek-V3.2's MTP layer is a V3.2 decoder layer (its indexer loaded from the checkpoint):
    prompts past index_topk (24) decode as without speculation."""
    from tacit.models.deepseek_v32 import DSAAttention

    model, _ = build_hf_model("deepseek_v32", tmp_path)
    write_mtp_layer(model, tmp_path)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 384, (n,), generator=g).tolist() for n in (10, 60, 130)]
    want = tokens(LLM(str(tmp_path), dtype="float32").generate(prompts, GREEDY))
    spec = LLM(str(tmp_path), dtype="float32", speculative_config=mtp_config(3))
    assert isinstance(spec.engine.runner.drafter.layers[0].self_attn, DSAAttention)
    assert tokens(spec.generate(prompts, GREEDY)) == want
    assert spec.engine.get_stats().spec_decode_num_draft_tokens > 0
