"""Tensor parallelism: two processes (gloo on loopback) give the tokens one process gives.

Float32, so the only difference between TP=1 and TP=2 is the order of the sums that the
all-reduce splits: logprobs agree within 1e-4 and greedy tokens exactly. Each LLM(...,
tensor_parallel_size=2) starts one worker process; every test shuts its engines down.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from near_ties import assert_bf16_runs_agree

from tacit import LLM, SamplingParams
from tacit.distributed.communicators import COMMUNICATORS
from tacit.distributed.shm_communicator import ShmCommunicator
from tacit.engine.executor import WorkerDiedError
from tacit.kernels.cpu_fused_decode import ShardedDecoder
from tacit.kernels.cpu_kernels import load_cpu_kernels
from tacit.kernels.ggml_quant import FP8_E4M3
from tacit.layers.moe import FusedMoE
from tacit.loader.gguf_writer import export_hf_to_gguf

ARCHS = ["llama", "llama3", "qwen2", "qwen3", "llama_odd_vocab"]
LENGTHS = [1, 7, 45, 130]
MAX_NEW = 10
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=3)


def prompts_for(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(3, vocab - 1, (n,), generator=g).tolist() for n in LENGTHS]


def assert_same(ref, got):
    for a, b in zip(ref, got):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for lp_a, lp_b in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            for token, lp in lp_a.items():
                assert abs(lp.logprob - lp_b[token].logprob) < 1e-4


def run_pair(path, prompts, params, **kwargs):
    ref = LLM(str(path), dtype="float32", **kwargs).generate(prompts, params)
    llm = LLM(str(path), dtype="float32", tensor_parallel_size=2, **kwargs)
    try:
        return ref, llm.generate(prompts, params), llm
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize("name", sorted(COMMUNICATORS))
def test_every_registered_communicator_gives_one_process_tokens(tiny_model_factory, name):
    """communicator=NAME picks that implementation through the registry, and each gives the
    tokens and logprobs one process gives (float32: only the order of the sums differs)."""
    model, _, path = tiny_model_factory("qwen3")
    prompts = prompts_for(model.config.vocab_size)
    ref, got, llm = run_pair(path, prompts, GREEDY, communicator=name)
    assert isinstance(llm.engine.model.comm, COMMUNICATORS[name])
    assert_same(ref, got)


def test_an_unknown_communicator_is_refused_by_name(tiny_llama):
    with pytest.raises(ValueError, match="communicator='mpi' is not known; valid: auto, shm, torch"):
        LLM(str(tiny_llama[2]), dtype="float32", tensor_parallel_size=2, communicator="mpi")


@pytest.mark.parametrize("arch", ARCHS)
def test_tp2_matches_tp1(tiny_model_factory, arch):
    model, _, path = tiny_model_factory(arch)
    # A small step budget: chunked prefill and mixed prefill/decode steps on both ranks.
    ref, got, llm = run_pair(path, prompts_for(model.config.vocab_size), GREEDY, max_num_batched_tokens=64)
    assert_same(ref, got)
    embed = llm.engine.model.model.embed_tokens
    assert embed.sharded == (arch != "llama_odd_vocab")
    # float32 runs the torch path: each parallel module counts the seconds its collectives took.
    comm = llm.engine.runner.communication_seconds()
    layers = [f"model.layers.{i}.{m}" for i in range(2) for m in ("self_attn.o_proj", "mlp.down_proj")]
    sharded = ["model.embed_tokens", "lm_head"] if embed.sharded else []
    assert sorted(comm) == sorted(layers + sharded) and all(comm[k] > 0 for k in comm)
    heads = llm.engine.model.model.layers[0].self_attn
    assert (heads.num_heads, heads.num_kv_heads) == (2, 1)  # half of the tiny models' 4 and 2


def test_gemma3_tp2_matches_tp1(tiny_model_factory):
    """Gemma 3's heads split (4 and 2: 2 and 1 a rank), its post-attention and post-MLP norms
    applied to the all-reduced sums, each rank's sliding layers keeping their window; the 130-
    token prompt reaches past the tiny model's 32-token window."""
    model, _, path = tiny_model_factory("gemma3")
    ref, got, llm = run_pair(path, prompts_for(model.config.vocab_size), GREEDY, max_num_batched_tokens=64)
    assert_same(ref, got)
    layers = llm.engine.model.model.layers
    assert (layers[0].self_attn.num_heads, layers[0].self_attn.num_kv_heads) == (2, 1)
    assert [layer.self_attn.attn.sliding_window for layer in layers] == [32] * 5 + [None]


@pytest.mark.parametrize(
    "arch", ["qwen3_moe", "qwen3_moe_all", "deepseek_v3", "deepseek_v3_qlora", "deepseek_v32", "glm_moe_dsa"]
)
@pytest.mark.parametrize("expert_parallel", [False, True])
def test_moe_tp2_and_ep2_match_tp1(tiny_model_factory, arch, expert_parallel):
    """Experts split by feature (each rank 1/2 of every expert) or by expert (EP: each rank half
    of the whole experts, the others' tokens skipped); a dense layer splits as a MLP; DeepSeek's
    MLA heads split (the latent cache whole on each rank) and its shared expert by feature."""
    model, _, path = tiny_model_factory(arch)
    kwargs = dict(max_num_batched_tokens=64, expert_parallel=expert_parallel)
    ref = LLM(str(path), dtype="float32", max_num_batched_tokens=64).generate(
        prompts_for(model.config.vocab_size), GREEDY
    )
    llm = LLM(str(path), dtype="float32", tensor_parallel_size=2, **kwargs)
    try:
        got = llm.generate(prompts_for(model.config.vocab_size), GREEDY)
        experts = next(m for m in llm.engine.model.modules() if isinstance(m, FusedMoE))
    finally:
        llm.engine.shutdown()
    assert_same(ref, got)
    cfg = model.config
    e, inter = getattr(cfg, "num_experts", None) or cfg.n_routed_experts, cfg.moe_intermediate_size
    if expert_parallel:
        assert tuple(experts.w13.shape[:2]) == (e // 2, 2 * inter)
        assert experts.expert_slots().tolist() == list(range(e // 2)) + [-1] * (e // 2)
    else:
        assert tuple(experts.w13.shape[:2]) == (e, inter)


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_gpt_oss_tp2_and_ep2_match_tp1(tiny_model_factory, expert_parallel):
    """gpt-oss: each rank holds its heads' sinks, and its experts' part of transformers'
    interleaved gate_up stacks (by feature: the contiguous columns [2 start, 2 (start + n));
    by expert: whole experts), the down bias added once; prompts of 45 and 130 tokens outrun
    the 24-token window."""
    model, _, path = tiny_model_factory("gpt_oss")
    prompts = prompts_for(model.config.vocab_size)
    ref = LLM(str(path), dtype="float32", max_num_batched_tokens=64).generate(prompts, GREEDY)
    llm = LLM(
        str(path), dtype="float32", max_num_batched_tokens=64, tensor_parallel_size=2, expert_parallel=expert_parallel
    )
    try:
        got = llm.generate(prompts, GREEDY)
        layer = llm.engine.model.model.layers[0]
    finally:
        llm.engine.shutdown()
    assert_same(ref, got)
    assert tuple(layer.self_attn.attn.sinks.shape) == (2,)
    e, inter = model.config.num_local_experts, model.config.intermediate_size
    want = (e // 2, 2 * inter) if expert_parallel else (e, inter)
    assert tuple(layer.mlp.experts.w13.shape[:2]) == want


@pytest.mark.parametrize(
    "arch, expert_parallel",
    [("llama3", False), ("qwen2", False), ("qwen3_moe", True), ("deepseek_v3", False), ("gemma3", False)],
)
def test_two_batch_overlap_matches_tp1(tiny_model_factory, arch, expert_parallel):
    """Steps of 2+ requests as two micro-batches whose all-reduces overlap each other's compute:
    the same tokens as one process (llama3's o_proj bias is added once, by rank 0's partial sum;
    float32 runs every step, decodes too, on the torch path)."""
    model, _, path = tiny_model_factory(arch)
    prompts = prompts_for(model.config.vocab_size)
    ref = LLM(str(path), dtype="float32", max_num_batched_tokens=64).generate(prompts, GREEDY)
    llm = LLM(
        str(path),
        dtype="float32",
        max_num_batched_tokens=64,
        tensor_parallel_size=2,
        expert_parallel=expert_parallel,
        two_batch_overlap=True,
    )
    try:
        got = llm.generate(prompts, GREEDY)
        exposed, hidden = llm.engine.runner.communication_seconds(), llm.engine.runner.hidden_communication_seconds()
    finally:
        llm.engine.shutdown()
    assert_same(ref, got)
    # Every decoder layer's sums went through the overlapped path, and each was in flight a while.
    layers = [f"model.layers.{i}" for i in range(model.config.num_hidden_layers)]
    assert sorted(hidden) == layers and all(hidden[k] > 0 for k in layers)
    assert all(k in exposed for k in layers)


@pytest.mark.parametrize("arch", ["qwen3_moe_256", "deepseek_v3_qlora"])
@pytest.mark.parametrize("expert_parallel", [False, True])
def test_gguf_expert_stacks_split_over_ranks(tiny_model_factory, tmp_path, arch, expert_parallel):
    """A GGUF's stacked Q8_0 experts under TP=2: each rank keeps its experts' blocks (by
    expert), or every expert's rows of gate/up and whole blocks of down's columns (by feature:
    qwen3_moe_256's 128 features a rank are 4 blocks; deepseek's 16 cut a 32-value block, so
    its ranks hold down in floats) — the same tokens as one process on the same file."""
    from tacit.loader.gguf_writer import export_hf_to_gguf

    model, _, hf_dir = tiny_model_factory(arch)
    q8 = export_hf_to_gguf(hf_dir, tmp_path / "q8.gguf", ggml_types={"_exps.weight": "Q8_0"})
    prompts = prompts_for(model.config.vocab_size)
    ref = LLM(str(q8), dtype="float32", quantization="gguf").generate(prompts, GREEDY)
    llm = LLM(str(q8), dtype="float32", quantization="gguf", tensor_parallel_size=2, expert_parallel=expert_parallel)
    try:
        got = llm.generate(prompts, GREEDY)
        moe = [m for m in llm.engine.model.modules() if isinstance(m, FusedMoE)]
    finally:
        llm.engine.shutdown()
    assert_same(ref, got)
    down_blocks = expert_parallel or arch == "qwen3_moe_256"
    assert moe and all(m.w13_type == 8 and m.w2_type == (8 if down_blocks else None) for m in moe)
    experts = moe[0].num_experts
    assert all(m.w13.shape[0] == (experts // 2 if expert_parallel else experts) for m in moe)


def test_fp8_checkpoint_split_over_ranks(tiny_model_factory, tmp_path):
    """An FP8 block-scaled DeepSeek-V3 (MLA heads and experts split, experts by expert) kept
    in its FP8_E4M3 blocks: each rank's rows and whole-block columns, the same tokens as one
    process on the same checkpoint."""
    from fp8_checkpoints import write_fp8_checkpoint

    model, _, hf_dir = tiny_model_factory("deepseek_v3")
    path, _ = write_fp8_checkpoint(hf_dir, tmp_path / "fp8")
    prompts = prompts_for(model.config.vocab_size)
    ref, got, llm = run_pair(path, prompts, GREEDY, quantization="gguf", expert_parallel=True)
    assert_same(ref, got)
    moe = [m for m in llm.engine.model.modules() if isinstance(m, FusedMoE)]
    o_proj = llm.engine.model.model.layers[0].self_attn.o_proj
    assert moe and all(m.w13_type == m.w2_type == FP8_E4M3 for m in moe)
    assert o_proj.weight.dtype == torch.uint8 and o_proj.linear_method.ggml_type == FP8_E4M3


def test_a_dropped_engine_stops_its_workers_so_another_can_start(tiny_llama):
    import gc

    _, _, path = tiny_llama
    llm = LLM(str(path), dtype="float32", tensor_parallel_size=2)
    procs = list(llm.engine.executor.procs)
    del llm
    gc.collect()
    assert procs and not any(p.is_alive() for p in procs)
    llm = LLM(str(path), dtype="float32", tensor_parallel_size=2)  # a second process group
    try:
        assert llm.generate([[5, 9, 11]], GREEDY)[0].outputs[0].token_ids
    finally:
        llm.engine.shutdown()


def test_tp2_seeded_sampling_and_prompt_logprobs(tiny_llama):
    model, _, path = tiny_llama
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=MAX_NEW, ignore_eos=True, seed=3, prompt_logprobs=2)
    ref, got, _ = run_pair(path, prompts_for(model.config.vocab_size), params)
    for a, b in zip(ref, got):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for pa, pb in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:]):
            for token, lp in pa.items():
                assert abs(lp.logprob - pb[token].logprob) < 1e-4


@pytest.mark.parametrize("types", [{"": "Q8_0"}, {"": "Q8_0", "attn_v.weight": "Q4_0"}], ids=["Q8_0", "mixed-qkv"])
def test_tp2_native_gguf_blocks(tiny_llama, tmp_path, types):
    """Q8_0 matrices kept in their blocks (the torch reference multiplies them in float32): each
    rank's rows and whole-block columns are sliced from the file's blocks; with v in Q4_0 each
    rank's q/k/v shards keep their own types (MixedGGMLLinearMethod)."""
    from tacit.layers.ggml_linear_method import MixedGGMLLinearMethod

    _, _, path = tiny_llama
    gguf = export_hf_to_gguf(path, tmp_path / "tiny.gguf", ggml_types=types)
    ref, got, llm = run_pair(gguf, prompts_for(384), GREEDY, quantization="gguf")
    assert_same(ref, got)
    layer = llm.engine.model.model.layers[0]
    assert layer.mlp.down_proj.weight.dtype == torch.uint8
    assert isinstance(layer.self_attn.qkv_proj.linear_method, MixedGGMLLinearMethod) == ("attn_v.weight" in types)


def test_sizes_that_do_not_divide_are_refused(tiny_llama, tiny_model_factory):
    _, _, path = tiny_llama
    with pytest.raises(ValueError, match=r"tensor_parallel_size=3 does not divide num_attention_heads=4"):
        LLM(str(path), dtype="float32", tensor_parallel_size=3)
    with pytest.raises(ValueError, match=r"tensor_parallel_size=0 is invalid"):
        LLM(str(path), dtype="float32", tensor_parallel_size=0)
    _, _, moe = tiny_model_factory("qwen3_moe")
    with pytest.raises(ValueError, match=r"tensor_parallel_size=4 does not divide num_key_value_heads=2"):
        LLM(str(moe), dtype="float32", tensor_parallel_size=4)
    _, _, mla = tiny_model_factory("deepseek_v3")
    with pytest.raises(ValueError, match=r"tensor_parallel_size=8 does not divide num_attention_heads=4"):
        LLM(str(mla), dtype="float32", tensor_parallel_size=8)


@pytest.mark.skipif(load_cpu_kernels() is None, reason="no AVX512-BF16 CPU kernels: no fused decode step")
@pytest.mark.parametrize(
    "arch, expert_parallel",
    [
        ("llama", False),
        ("qwen3_moe", False),
        ("qwen3_moe", True),
        ("deepseek_v3_qlora", False),
        ("deepseek_v3_qlora", True),
    ],
)
def test_tp2_fused_decode_step_all_reduces_in_cpp(tiny_bf16_valued_model_factory, arch, expert_parallel):
    """bf16: each rank's decode steps run in the C++ decoder, which calls the shared-memory
    all-reduce itself after o_proj and the MLP or MoE layer (float32 partial sums: only the
    order of the sums differs from one rank's), so the two runs agree within the bound
    near_ties derives from the reference's own distance to float32 arithmetic."""
    model, _, path = tiny_bf16_valued_model_factory(arch)
    prompts = prompts_for(model.config.vocab_size)
    ref = LLM(str(path), dtype="bfloat16").generate(prompts, GREEDY)
    llm = LLM(str(path), dtype="bfloat16", tensor_parallel_size=2, expert_parallel=expert_parallel)
    try:
        assert isinstance(llm.engine.runner.fused_decode, ShardedDecoder)
        assert isinstance(llm.engine.model.comm, ShmCommunicator)
        got = llm.generate(prompts, GREEDY)
        comm = llm.engine.runner.communication_seconds()
    finally:
        llm.engine.shutdown()
    assert_bf16_runs_agree(LLM(str(path), dtype="float32"), prompts, ref, got)
    # The C++ step's all-reduces per layer, after attention and after the MLP / MoE.
    for i in range(model.config.num_hidden_layers):
        assert comm[f"fused.layers.{i}.self_attn"] > 0 and comm[f"fused.layers.{i}.mlp"] > 0


_ORPHAN = """
import multiprocessing, os, sys
from tacit.config.engine_args import EngineArgs
from tacit.loader import open_model
from tacit.platforms import get_platform
from tacit.worker.rank import spawned_worker
if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    recv_end, _ = ctx.Pipe(duplex=False)
    config = EngineArgs(model=sys.argv[2]).create_engine_config(open_model(sys.argv[2]), get_platform("cpu"))
    worker = ctx.Process(target=spawned_worker, args=(1, 2, sys.argv[1], config, "cpu", recv_end))
    worker.start()
    print(worker.pid, flush=True)
    os._exit(0)  # the driver gone before rank 0 ever joins the rendezvous
"""


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="watches the worker process through /proc")
def test_a_worker_whose_driver_exits_before_the_rendezvous_exits_too(tiny_llama, tmp_path):
    _, _, path = tiny_llama
    script = tmp_path / "orphan.py"
    script.write_text(_ORPHAN)
    driver = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "rendezvous"), str(path)], stdout=subprocess.PIPE, text=True
    )
    worker = int(driver.stdout.readline())  # not to EOF: the worker holds the pipe too
    driver.wait()
    driver.stdout.close()
    start = time.monotonic()
    while _running(worker) and time.monotonic() - start < 60:  # it imports torch first (~2-5 s)
        time.sleep(0.1)
    if _running(worker):
        os.kill(worker, signal.SIGKILL)
        pytest.fail("the orphaned worker still waits in the rendezvous after 60 s")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_killed_worker_is_reported_within_seconds(tiny_llama, dtype):
    """float32 waits in the torch path's all-reduce, bf16 in the fused C++ step's."""
    model, _, path = tiny_llama
    llm = LLM(str(path), dtype=dtype, tensor_parallel_size=2)
    try:
        llm.generate(prompts_for(model.config.vocab_size)[:1], GREEDY)
        worker = llm.engine.executor.procs[0]
        os.kill(worker.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(WorkerDiedError, match=rf"rank 1 \(pid {worker.pid}, exit code -9\)"):
            llm.generate(prompts_for(model.config.vocab_size), GREEDY)
        assert time.monotonic() - start < 10
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preemption_under_tp_keeps_tokens(tiny_llama, mode):
    """A KV pool too small for five requests: preempted ones resume with the tokens TP=1 gives.
    Swapped, every rank copies its own KV shard out and back (the copies once ran on rank 0's
    shard alone, and 4 of these 5 requests came back with other tokens)."""
    _, _, path = tiny_llama
    prompts = [[7 + i] * 30 for i in range(5)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    ref = [o.outputs[0].token_ids for o in LLM(str(path), dtype="float32").generate(prompts, params)]
    llm = LLM(str(path), dtype="float32", num_kv_blocks=16, block_size=8, tensor_parallel_size=2, preemption_mode=mode)
    try:
        out = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        s = llm.engine.scheduler
        assert s.num_preemptions > 0
        assert s.swapper.num_swapped_out == (s.num_preemptions if mode == "swap" else 0)
        assert s.swapper.used_blocks == 0
    finally:
        llm.engine.shutdown()
    assert out == ref
