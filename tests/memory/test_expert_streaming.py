"""--expert-cache-memory: MoE experts read from the checkpoint through a small cache give the
resident model's outputs exactly, report their hit rates, and refuse a cache too small to run."""

import os

import pytest
import torch

from tacit import LLM, SamplingParams
from tacit.engine.metrics import ServingMetrics
from tacit.kernels.cpu_kernels import cpu_supports_avx512_bf16
from tacit.memory.expert_cache import ExpertCache, TensorLocation

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], list(range(20, 52)), [3] * 9]
PARAMS = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=2)
EXPERT_BYTES_F32 = 3 * 64 * 32 * 4  # tiny deepseek_v3: hidden 64, expert width 32, float32


def outputs(llm: LLM):
    return [
        (o.outputs[0].token_ids, [{t: lp.logprob for t, lp in d.items()} for d in o.outputs[0].logprobs])
        for o in llm.generate(PROMPTS, PARAMS)
    ]


@pytest.mark.parametrize(
    "arch,dtype", [("deepseek_v3", "float32"), ("deepseek_v3", "bfloat16"), ("qwen3_moe_all", "bfloat16")]
)
def test_streamed_experts_give_the_resident_models_outputs_exactly(tiny_model_factory, arch, dtype):
    if dtype == "bfloat16" and (not cpu_supports_avx512_bf16() or os.environ.get("TACIT_NO_CPU_KERNELS")):
        pytest.skip("the bf16 run exercises the CPU MoE kernel's slot table")
    path = str(tiny_model_factory(arch)[2])
    # 2 MoE layers of 8 experts; 2-token steps use at most 4 experts of a layer at once.
    kw = dict(dtype=dtype, max_num_batched_tokens=2, max_num_seqs=2)
    resident = outputs(LLM(path, **kw))
    per_expert = EXPERT_BYTES_F32 // (2 if dtype == "bfloat16" else 1)
    llm = LLM(path, expert_cache_memory=5 * per_expert, **kw)  # 5 of the 16 experts
    runner = llm.engine.runner
    assert runner.expert_cache is not None and runner.expert_cache.num_slots == 5
    # Qwen3-MoE's decode steps stay one C++ call, which asks the cache for each layer's experts.
    assert (runner.fused_decode is not None) == (arch == "qwen3_moe_all")
    assert all(m.experts.w13.numel() == 0 for m in runner.model.modules() if hasattr(m, "experts"))
    assert outputs(llm) == resident  # tokens and logprobs, bit for bit
    stats = runner.expert_cache.stats
    assert stats.bytes_read > 0 and 0 < stats.hits < stats.acquired and stats.predictable > 0
    snap = llm.engine.get_stats()
    assert 0 < snap.expert_cache_hit_rate < 1 and snap.expert_bytes_read_per_token > 0
    text = ServingMetrics(snapshot=snap).render_prometheus("m")
    assert f'tacit_expert_cache_hit_rate{{model_name="m"}} {snap.expert_cache_hit_rate}' in text


def test_a_cache_too_small_for_one_layers_experts_names_the_minimum(tiny_model_factory):
    path = str(tiny_model_factory("deepseek_v3")[2])
    with pytest.raises(ValueError, match=rf"at least {4 * EXPERT_BYTES_F32} bytes"):
        LLM(path, dtype="float32", max_num_batched_tokens=2, max_num_seqs=2, expert_cache_memory=3 * EXPERT_BYTES_F32)


def test_streaming_refuses_what_it_cannot_stream(tiny_model_factory):
    with pytest.raises(ValueError, match="only MoE experts stream"):
        LLM(str(tiny_model_factory("llama")[2]), dtype="float32", expert_cache_memory=1 << 20)
    with pytest.raises(ValueError, match="unquantized safetensors"):
        LLM(str(tiny_model_factory("deepseek_v3")[2]), quantization="int8", expert_cache_memory=1 << 20)
    with pytest.raises(ValueError, match="must be > 0 bytes"):
        LLM(str(tiny_model_factory("deepseek_v3")[2]), expert_cache_memory=0)


def test_cache_evicts_least_recently_used_and_never_the_running_layers_experts(tmp_path):
    hidden, inter = 4, 2
    data = torch.arange(12 * 3 * hidden * inter, dtype=torch.float32)
    f = tmp_path / "experts.bin"
    f.write_bytes(data.numpy().tobytes())
    n = hidden * inter * 4
    locs = {
        (0, e): tuple(TensorLocation(f, (3 * e + p) * n, n, torch.float32, (inter, hidden)) for p in range(2))
        + (TensorLocation(f, (3 * e + 2) * n, n, torch.float32, (hidden, inter)),)
        for e in range(12)
    }
    cache = ExpertCache(locs, num_slots=4, hidden_size=hidden, intermediate_size=inter, dtype=torch.float32)
    slots = cache.acquire(0, [1, 3], num_tokens=1)
    assert torch.equal(cache.w13[slots[3], :inter].flatten(), data[9 * 8 : 10 * 8])  # expert 3's gate
    assert torch.equal(cache.w2[slots[1]].flatten(), data[5 * 8 : 6 * 8])  # expert 1's down
    cache.prefetch(0, [5, 6, 7])  # two free slots: 5 and 6 fit, 7 would evict a running expert
    cache.acquire(0, [5, 6], num_tokens=1)
    assert cache.stats.prefetch_hits == 2 and cache.stats.predictable == 2
    with pytest.raises(RuntimeError, match="cannot hold layer 0's 5 active experts"):
        cache.acquire(0, [0, 1, 2, 3, 4], num_tokens=1)
    cache.close()


def test_a_layer_waits_for_prefetch_reads_in_flight_instead_of_failing(tmp_path):
    """Slots a prefetch is still reading cannot be evicted; the running layer waits for them
    rather than failing (a slow read under load once ended a run: "5 slots cannot hold 3")."""
    import threading
    import time
    from concurrent.futures import Future

    import torch

    from tacit.memory.expert_cache import ExpertCache, TensorLocation, _Slot

    f = tmp_path / "experts.bin"
    f.write_bytes(bytes(64))
    loc = TensorLocation(f, 0, 64, torch.float32, (4, 4))
    cache = ExpertCache({(0, e): (loc, loc, loc) for e in range(8)}, 4, 4, 4, torch.float32)
    reading = [Future() for _ in range(3)]
    for slot, (e, fut) in enumerate(zip((5, 6, 7), reading)):  # a prefetch's reads, unfinished
        cache._slots[slot] = _Slot((0, e), fut)
        cache._where[(0, e)] = slot
    result = {}
    worker = threading.Thread(target=lambda: result.update(table=cache.acquire(0, [0, 1, 2], 2)))
    worker.start()
    time.sleep(0.2)
    assert worker.is_alive()  # one slot is free; it waits for the reads, it does not fail
    for fut in reading:
        fut.set_result(None)
    worker.join(timeout=10)
    table = result["table"]
    assert sorted(table[[0, 1, 2]].tolist()) == sorted(set(table[[0, 1, 2]].tolist())) and (table[:3] >= 0).all()
    cache.close()
