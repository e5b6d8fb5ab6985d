"""Data-parallel attention: two ranks, each attending over its own requests with the whole
attention and its own KV pool, the MLPs split over every rank's tokens (gathered before,
reduce-scattered after), give the tokens one process gives.

Float32, so only the order of the sums differs: logprobs within 1e-4, greedy tokens exactly.
"""

import pytest
from near_ties import assert_bf16_runs_agree

from tacit import LLM, SamplingParams
from tacit.kernels.cpu_fused_decode import ShardedDecoder
from tacit.kernels.cpu_kernels import load_cpu_kernels
from tacit.layers.moe import FusedMoE
from tests.distributed.test_tensor_parallel import GREEDY, assert_same, prompts_for

DP = dict(tensor_parallel_size=2, data_parallel_attention=True)


def run_dp(path, prompts, params, dtype="float32", rank_of=None, **kwargs):
    """(the outputs, the ranks the driver's runner saw requests on, its engine) of a two-rank
    run; rank_of, if given, gets {request id: rank}."""
    llm = LLM(str(path), dtype=dtype, **DP, **kwargs)
    engine = llm.engine
    runner, ranks = engine.runner, set()
    execute = runner.execute
    rank_of = {} if rank_of is None else rank_of

    def execute_noting_ranks(*args, **kw):
        out = execute(*args, **kw)
        rank_of.update({s.req_id: s.dp_rank for s in runner.requests.values()})
        ranks.update(rank_of.values())
        return out

    runner.execute = execute_noting_ranks
    try:
        return llm.generate(prompts, params), ranks, engine
    finally:
        engine.shutdown()


@pytest.mark.parametrize(
    "arch, expert_parallel",
    [
        ("deepseek_v3", True),
        ("deepseek_v3_qlora", False),
        ("deepseek_v32", False),
        ("qwen3_moe", True),
        ("llama", False),
        ("gemma3", False),
    ],
)
def test_dp_attention_matches_tp1(tiny_model_factory, arch, expert_parallel):
    """Four prompts of 1-130 tokens under a 64-token step budget: chunked prefills and mixed
    steps, rows of both ranks in one step, experts split by expert or by feature, DeepSeek's
    dense first layer and shared expert split by feature."""
    model, _, path = tiny_model_factory(arch)
    prompts = prompts_for(model.config.vocab_size)
    ref = LLM(str(path), dtype="float32", max_num_batched_tokens=64).generate(prompts, GREEDY)
    got, ranks, engine = run_dp(path, prompts, GREEDY, max_num_batched_tokens=64, expert_parallel=expert_parallel)
    assert_same(ref, got)
    assert ranks == {0, 1}  # the requests were spread over both ranks' pools
    # Attention whole on each rank (the tiny models have 4 heads); the MLPs, the embedding and
    # the head still split.
    assert engine.model.model.layers[0].self_attn.num_heads == 4
    assert engine.model.model.embed_tokens.sharded
    moe = [m for m in engine.model.modules() if isinstance(m, FusedMoE)]
    for m in moe:
        assert m.w13.shape[0] == (m.num_experts // 2 if expert_parallel else m.num_experts)
    # One pool per rank: the scheduler places requests in twice the blocks one rank holds.
    kv = engine.scheduler.kv
    assert kv.num_pools == 2 and kv.num_blocks == engine.num_kv_blocks == 2 * engine.runner.num_blocks
    # Each decoder layer, the embedding and the head count the seconds their collectives blocked.
    comm = engine.runner.communication_seconds()
    assert all(comm[f"model.layers.{i}"] > 0 for i in range(model.config.num_hidden_layers))
    assert comm["model.embed_tokens"] > 0 and comm["lm_head"] > 0


@pytest.mark.parametrize("dtype, arch", [("float32", "deepseek_v3_qlora"), ("bfloat16", "llama")])
def test_a_rank_with_no_requests_still_joins_the_mlps(tiny_model_factory, tiny_bf16_valued_model_factory, dtype, arch):
    """One request: rank 1 has no rows in any step, yet each MLP needs its collectives. In bf16
    its empty norms and head must not reach the 1-8-row kernels (they once refused 0 rows and
    killed the worker), and its C++ decode steps run no attention. bf16 on the dense shape: the
    tiny MoE shapes meet router near-ties in bf16 within a few steps of this prompt whichever
    way the sums are split (TP=2 EP parts from one process at step 3 too)."""
    factory = tiny_model_factory if dtype == "float32" else tiny_bf16_valued_model_factory
    model, _, path = factory(arch)
    prompts = prompts_for(model.config.vocab_size)[2:3]
    ref = LLM(str(path), dtype=dtype).generate(prompts, GREEDY)
    got, ranks, _ = run_dp(path, prompts, GREEDY, dtype=dtype, expert_parallel=True)
    if dtype == "float32":
        assert_same(ref, got)
    else:
        assert_bf16_runs_agree(LLM(str(path), dtype="float32"), prompts, ref, got)
    assert ranks == {0}


def test_prompt_logprobs_and_seeded_sampling(tiny_model_factory):
    """Requests scoring their prompts on either rank score what one process scores (every rank
    takes the scored rows through the vocabulary-split head); seeded sampling draws the same."""
    model, _, path = tiny_model_factory("deepseek_v3")
    short, *longer = prompts_for(model.config.vocab_size)
    prompts = longer[:2] + [short] + longer[2:]  # 7 and 45 prompt tokens to score
    params = [  # the first two start in one step, so they go to different ranks
        SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=1),
        SamplingParams(temperature=0.8, seed=11, max_tokens=8, ignore_eos=True),
        SamplingParams(temperature=1.0, seed=5, max_tokens=8, ignore_eos=True),
    ]
    ref = LLM(str(path), dtype="float32").generate(prompts, params)
    rank_of = {}
    got, ranks, _ = run_dp(path, prompts, params, rank_of=rank_of, expert_parallel=True)
    assert {rank_of[o.request_id] for o, p in zip(got, params) if p.prompt_logprobs} == {0, 1}
    for a, b in zip(ref, got):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        if a.prompt_logprobs is None:
            assert b.prompt_logprobs is None
            continue
        assert len(a.prompt_logprobs) == len(b.prompt_logprobs)
        for pa, pb in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:]):
            assert pa.keys() == pb.keys()
            assert all(abs(pa[t].logprob - pb[t].logprob) < 1e-4 for t in pa)


def test_preemption_recomputes_within_a_rank(tiny_model_factory):
    """Pools too small for the requests placed in them: the victim comes from the pool that ran
    dry, its KV is recomputed (swapping is off under data-parallel attention), the tokens kept."""
    model, _, path = tiny_model_factory("deepseek_v3")
    prompts = [[7 + i] * 30 for i in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    ref = [o.outputs[0].token_ids for o in LLM(str(path), dtype="float32").generate(prompts, params)]
    got, ranks, engine = run_dp(path, prompts, params, num_kv_blocks=12, block_size=8, expert_parallel=True)
    assert [o.outputs[0].token_ids for o in got] == ref
    assert engine.scheduler.num_preemptions > 0 and engine.scheduler.swapper is None
    assert ranks == {0, 1}


@pytest.mark.skipif(load_cpu_kernels() is None, reason="needs the AVX512-BF16 CPU kernels (the C++ decoder)")
@pytest.mark.parametrize("arch, expert_parallel", [("deepseek_v3_qlora", True), ("qwen3_moe", True), ("llama", False)])
def test_bf16_decode_steps_run_in_cpp(tiny_bf16_valued_model_factory, arch, expert_parallel):
    """bf16: decode-only steps run in the C++ decoder, each rank's attention over its own rows and
    every MLP over all ranks' rows (gathered and summed by its C all-reduce); prefill and mixed
    steps take the torch path (the C++ MoE kernel returning partial sums). Only the order of
    float32 sums differs from one process's, so the runs agree within near_ties' derived bound."""
    model, _, path = tiny_bf16_valued_model_factory(arch)
    prompts = prompts_for(model.config.vocab_size)
    ref = LLM(str(path), dtype="bfloat16").generate(prompts, GREEDY)
    llm = LLM(str(path), dtype="bfloat16", expert_parallel=expert_parallel, **DP)
    try:
        fused = llm.engine.runner.fused_decode
        assert isinstance(fused, ShardedDecoder) and fused.data_parallel
        got = llm.generate(prompts, GREEDY)
        comm = llm.engine.runner.communication_seconds()
    finally:
        llm.engine.shutdown()
    assert_bf16_runs_agree(LLM(str(path), dtype="float32"), prompts, ref, got)
    for i in range(model.config.num_hidden_layers):
        assert comm[f"fused.layers.{i}.mlp_gather"] > 0 and comm[f"fused.layers.{i}.mlp"] > 0


def test_refusals(tiny_model_factory):
    _, _, path = tiny_model_factory("deepseek_v3")
    with pytest.raises(ValueError, match="data_parallel_attention=true needs tensor_parallel_size >= 2"):
        LLM(str(path), dtype="float32", data_parallel_attention=True)
    with pytest.raises(ValueError, match="data_parallel_attention and two_batch_overlap"):
        LLM(str(path), dtype="float32", two_batch_overlap=True, **DP)
    with pytest.raises(ValueError, match="preemption_mode='swap' with data_parallel_attention"):
        LLM(str(path), dtype="float32", preemption_mode="swap", **DP)
