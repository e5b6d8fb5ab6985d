"""Speculative decoding with a draft model (vLLM's "draft_model"): a one-layer llama with the
targets' tokenizer drafts, its own KV cache rewound past rejected drafts; greedy output equals
speculation off and transformers, whatever the draft proposes; a draft of another vocabulary is
refused naming both."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from tacit import LLM, SamplingParams
from tacit.config.speculative import SpeculativeConfig
from tacit.kernels.cpu_kernels import cpu_supports_avx512_bf16
from tacit.sampling_params import StructuredOutputsParams

from tiny_models import build_tokenizer, save_tokenizer

PROMPTS = [[5, 6, 7, 8] * 6, list(range(30, 50)), [9, 10] * 10, [3, 14, 15, 92, 65, 35, 89, 79]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


def draft_config(path, k: int = 3, **kw) -> dict:
    # Every draft verified: the controller's choice depends on this host's step times
    # (tests/scheduling/test_spec_controller.py tests it).
    return {"method": "draft_model", "model": str(path), "num_speculative_tokens": k, "min_speculative_tokens": k, **kw}


@pytest.fixture(scope="module")
def draft(tiny_model_factory):
    return tiny_model_factory("llama_draft")[2]


def tokens(outs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outs]


def test_greedy_output_is_unchanged_and_equals_transformers(tiny_llama, draft):
    hf, _, path = tiny_llama
    want = tokens(LLM(str(path), dtype="float32").generate(PROMPTS, GREEDY))
    spec = LLM(str(path), dtype="float32", speculative_config=draft_config(draft))
    assert tokens(spec.generate(PROMPTS, GREEDY)) == want
    for p, w in zip(PROMPTS, want):
        ref = hf.generate(torch.tensor([p]), max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert ref[0, len(p) :].tolist() == w
    stats = spec.engine.get_stats()
    assert stats.spec_decode_num_draft_tokens > 0  # a random draft: some right, most wrong
    assert not spec.engine.runner.drafter.states  # finished requests' draft KV freed
    blocks = spec.engine.runner.drafter.runner.num_blocks
    assert len(spec.engine.runner.drafter.free_blocks) == blocks


def test_the_target_as_its_own_draft_has_every_draft_accepted(tiny_llama):
    """A draft computing what the target computes proposes the target's greedy tokens: all
    accepted, so 20 tokens take the prefill's first and then 4 a step."""
    path = tiny_llama[2]
    want = tokens(LLM(str(path), dtype="float32").generate(PROMPTS[:1], GREEDY))
    spec = LLM(str(path), dtype="float32", speculative_config=draft_config(path))
    assert tokens(spec.generate(PROMPTS[:1], GREEDY)) == want
    stats = spec.engine.get_stats()
    assert stats.spec_decode_num_accepted_tokens == stats.spec_decode_num_draft_tokens > 0
    assert spec.engine.num_steps == 1 + -(-19 // 4)


@pytest.mark.parametrize(
    "engine_kw",
    [
        {"max_num_batched_tokens": 16, "enable_chunked_prefill": True},  # prompts over several steps
        {"kv_cache_dtype": "int8"},
        {"enable_prefix_caching": False, "num_kv_blocks": 7},  # 4 x 3 blocks wanted: requests preempted
    ],
    ids=["chunked-prefill", "int8-kv", "preempted"],
)
def test_greedy_output_is_unchanged_under_engine_settings(tiny_llama, draft, engine_kw):
    path = str(tiny_llama[2])
    want = tokens(LLM(path, dtype="float32", **engine_kw).generate(PROMPTS, GREEDY))
    spec = LLM(path, dtype="float32", speculative_config=draft_config(draft, k=4), **engine_kw)
    assert tokens(spec.generate(PROMPTS, GREEDY)) == want
    stats = spec.engine.get_stats()
    assert stats.spec_decode_num_draft_tokens > 0
    assert stats.num_preemptions > 0 or "num_kv_blocks" not in engine_kw


def test_a_full_draft_pool_evicts_the_least_recent_and_output_is_unchanged(tiny_llama, draft):
    path = str(tiny_llama[2])
    want = tokens(LLM(path, dtype="float32").generate(PROMPTS, GREEDY))
    spec = LLM(path, dtype="float32", speculative_config=draft_config(draft))
    drafter = spec.engine.runner.drafter
    drafter.free_blocks = drafter.free_blocks[-5:]  # room for two requests' 28-33 tokens, not four
    assert tokens(spec.generate(PROMPTS, GREEDY)) == want
    assert spec.engine.get_stats().spec_decode_num_draft_tokens > 0
    assert len(drafter.free_blocks) == 5


def test_seeded_sampling_is_reproducible_and_structured_output_holds(tiny_llama, draft):
    path = str(tiny_llama[2])
    spec = LLM(path, dtype="float32", speculative_config=draft_config(draft))
    sampled = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, ignore_eos=True, seed=7)
    first = tokens(spec.generate(PROMPTS, sampled))
    assert tokens(spec.generate(PROMPTS[::-1], sampled))[::-1] == first  # batch order changes nothing
    regex = SamplingParams(
        temperature=0.0,
        max_tokens=10,
        ignore_eos=True,
        structured_outputs=StructuredOutputsParams(regex="[a-z ]{3,12}"),
    )
    plain = LLM(path, dtype="float32")
    assert [o.outputs[0].text for o in spec.generate(["Paris is"], regex)] == [
        o.outputs[0].text for o in plain.generate(["Paris is"], regex)
    ]


def test_a_draft_with_another_vocabulary_is_refused_naming_both(tiny_llama, draft, tmp_path):
    other = tmp_path / "other_vocab"
    shutil.copytree(draft, other)
    save_tokenizer(other, build_tokenizer(vocab_size=300))
    with pytest.raises(ValueError, match=r"has another vocabulary than the target .*: \d+ tokens against \d+"):
        LLM(str(tiny_llama[2]), dtype="float32", speculative_config=draft_config(other))


@pytest.mark.parametrize(
    "value, match",
    [
        ({"method": "draft_model", "num_speculative_tokens": 2}, 'needs "model"'),
        ({"method": "ngram", "num_speculative_tokens": 2, "model": "x"}, r"keys \['model'\] belong to another method"),
        (
            {"model": "x", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 2},
            "draft_tensor_parallel_size=2 is not supported",
        ),
        ({"model": "x", "num_speculative_tokens": 2, "quantization": "fp3"}, "speculative_config quantization='fp3'"),
    ],
)
def test_bad_draft_configs_are_named(value, match):
    with pytest.raises(ValueError, match=match):
        SpeculativeConfig.from_dict(value)


def test_a_config_naming_only_a_model_means_a_draft_model():
    config = SpeculativeConfig.from_dict({"model": "small", "num_speculative_tokens": 2})
    assert config.method == "draft_model" and config.model == "small"


def test_a_missing_draft_checkpoint_fails_at_start_naming_it(tiny_llama, tmp_path):
    with pytest.raises((FileNotFoundError, ValueError), match="nowhere"):
        LLM(str(tiny_llama[2]), dtype="float32", speculative_config=draft_config(tmp_path / "nowhere"))


@pytest.mark.skipif(
    not cpu_supports_avx512_bf16() or bool(os.environ.get("TACIT_NO_CPU_KERNELS")),
    reason="the fused C++ decoder needs the CPU kernels",
)
def test_bf16_int4_draft_on_the_fused_decoder_changes_no_token(tiny_llama, draft):
    """The default model's kind: bf16 on int4 weights, target and draft. The draft's one-token
    steps run on its own fused decoder; the target's verify rows (k=3: 4 rows at batch 1, the
    GEMVs' range that rounds as one row) give the tokens of one token a step."""
    path = str(tiny_llama[2])
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    plain = LLM(path, dtype="bfloat16", quantization="int4")
    want = [tokens(plain.generate([p], params))[0] for p in PROMPTS]
    spec = LLM(path, dtype="bfloat16", quantization="int4", speculative_config=draft_config(draft, quantization="int4"))
    assert spec.engine.runner.drafter.runner.fused_decode is not None
    assert [tokens(spec.generate([p], params))[0] for p in PROMPTS] == want
    assert spec.engine.get_stats().spec_decode_num_draft_tokens > 0


def test_the_proposers_time_is_priced_apart_from_the_step(tiny_llama, draft):
    """A step's execute_s includes the draft model's forwards; the step cost model learns the
    step without them and the controller prices each proposed token with them instead."""
    spec = LLM(str(tiny_llama[2]), dtype="float32", speculative_config=draft_config(draft))
    engine = spec.engine
    outs, fed = [], []
    execute, observe = engine.runner.execute, engine.scheduler.cost.observe
    engine.runner.execute = lambda so, *a, **k: outs.append(execute(so, *a, **k)) or outs[-1]
    engine.scheduler.cost.observe = lambda *args: fed.append(args) or observe(*args)
    spec.generate(PROMPTS[:2], GREEDY)
    proposing = [(o, f) for o, f in zip(outs, fed) if o.draft_token_ids]
    assert proposing and all(o.propose_s > o.propose_catch_up_s >= 0 for o, _ in proposing)
    assert any(o.propose_catch_up_s > 0 for o in outs)  # the prompts, prefilled through the draft
    assert all(f[2] == pytest.approx(o.execute_s - o.propose_s) for o, f in zip(outs, fed))
    assert engine.scheduler.spec.propose_s_per_token > 0
