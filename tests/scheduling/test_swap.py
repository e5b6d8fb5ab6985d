"""Preemption by swap to host memory as well as recompute: identical tokens either way, the
cheaper one chosen from measured costs, and the swap space accounted for."""

import pytest
import torch
from torch import nn

from tacit import LLM, SamplingParams
from tacit.config import SchedulerConfig
from tacit.engine.llm_engine import LLMEngine
from tacit.engine.metrics import ServingMetrics
from tacit.layers.kv_cache import KVCacheLayer
from tacit.memory.paged_kv_cache_manager import PagedKVCacheManager
from tacit.memory.swap import SwapSpace
from tacit.scheduling.policy import get_policy
from tacit.scheduling.scheduler import Scheduler
from tacit.worker.swap_store import KVSwapStore

from helpers import FakeClock, make_req, run_step

PARAMS = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPTS = [[5 + i] * (40 + 10 * i) for i in range(6)]


def preempting_run(path: str, mode: str, **kw) -> tuple[list[list[int]], LLMEngine]:
    """Three low-priority requests start, three urgent ones push them out of max_num_seqs=2."""
    llm = LLM(path, dtype="float32", scheduling_policy="priority", max_num_seqs=2, preemption_mode=mode, **kw)
    e = llm.engine
    ids = [e.add_request(p, PARAMS, priority=9) for p in PROMPTS[:3]]
    for _ in range(3):
        e.step()
    ids += [e.add_request(p, PARAMS, priority=0) for p in PROMPTS[3:]]
    results = {}
    while e.has_unfinished_requests():
        for out in e.step():
            if out.finished:
                results[out.request_id] = out.outputs[0].token_ids
    return [results[i] for i in ids], e


@pytest.mark.parametrize("arch", ["llama", "deepseek_v3"])
def test_swap_and_recompute_resume_with_identical_tokens(tiny_model_factory, arch):
    path = str(tiny_model_factory(arch)[2])
    ref = [o.outputs[0].token_ids for o in LLM(path, dtype="float32").generate(PROMPTS, PARAMS)]
    swapped, engine = preempting_run(path, "swap")
    s = engine.scheduler
    assert s.num_preemptions > 0 and s.swapper.num_swapped_out == s.num_preemptions
    assert s.swapper.num_swapped_in == s.swapper.num_swapped_out and s.swapper.used_blocks == 0
    assert swapped == ref
    metrics = ServingMetrics(snapshot=engine.get_stats())
    text = metrics.render_prometheus("m")
    assert f'tacit_num_swapped_out_total{{model_name="m"}} {s.num_preemptions}' in text
    assert f'tacit_num_swapped_in_total{{model_name="m"}} {s.num_preemptions}' in text
    recomputed, engine = preempting_run(path, "recompute")
    s = engine.scheduler
    assert s.num_preemptions > 0 and s.swapper.num_swapped_out == 0
    assert recomputed == ref


def test_swap_when_the_kv_pool_runs_dry(tiny_llama):
    path = str(tiny_llama[2])
    prompts = [[7 + i] * 30 for i in range(5)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    ref = [o.outputs[0].token_ids for o in LLM(path, dtype="float32").generate(prompts, params)]
    llm = LLM(path, dtype="float32", num_kv_blocks=16, block_size=8, preemption_mode="swap")
    out = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    s = llm.engine.scheduler
    assert s.num_preemptions > 0 and s.swapper.num_swapped_out > 0
    assert out == ref


class FakeMLA(nn.Module, KVCacheLayer):
    kv_block_dim = 0

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__()
        self.allocate_kv_cache(num_blocks, block_size, torch.float32, torch.device("cpu"))
        self.kv_cache.copy_(torch.arange(self.kv_cache.numel(), dtype=torch.float32).view_as(self.kv_cache))

    def allocate_kv_cache(self, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device) -> None:
        self.kv_cache = torch.zeros(num_blocks, block_size, 3, dtype=dtype, device=device)


def test_kv_layers_declare_their_block_axis():
    from tacit.kernels.torch_attention import TorchAttentionBackend
    from tacit.layers.attention import Attention

    attn = Attention(num_heads=4, head_dim=16, num_kv_heads=2, scale=1.0)
    attn.set_attention_backend(TorchAttentionBackend())  # the cache's shape is the spec it declares
    attn.allocate_kv_cache(2, 16, torch.float32, torch.device("cpu"))  # [2, 2, 16, 2, 16]: ambiguous by shape
    assert attn.kv_block_dim == 1 and FakeMLA(10, 4).kv_block_dim == 0
    space, store = SwapSpace(16, 2 * 16 * 2 * 16 * 4, 1e9), KVSwapStore([attn])
    before = attn.kv_cache[:, 1].clone()
    space.swap_out("r", [1])
    store.apply(space.take_ops())
    attn.kv_cache.zero_()
    space.swap_in("r", [0])
    store.apply(space.take_ops())
    assert torch.equal(attn.kv_cache[:, 0], before)
    undeclared = nn.Module()
    undeclared.kv_cache = torch.zeros(4, 4, 3)
    with pytest.raises(TypeError, match="does not declare the interface"):
        KVSwapStore([undeclared])


def test_swap_round_trip_restores_blocks_and_accounts_space():
    """The scheduler's SwapSpace decides and accounts; the runner's KVSwapStore copies, in the
    order of the ops it is handed."""
    layer = FakeMLA(8, 2)
    space, store = SwapSpace(3, 2 * 3 * 4, 1e9), KVSwapStore([layer])
    assert store.probe(2) > 0
    before = layer.kv_cache[[1, 4]].clone()
    space.swap_out("r", [1, 4])
    assert space.holds("r") and space.used_blocks == 2 and not space.has_room(2)
    assert store.apply(space.take_ops())[0] == 2 and space.take_ops() == []
    layer.kv_cache.zero_()
    space.swap_in("r", [6, 2, 7])
    ops = space.take_ops()
    assert [(o.kind, o.block_ids) for o in ops] == [("in", (6, 2))]  # only as many as were saved
    store.apply(ops)
    assert torch.equal(layer.kv_cache[[6, 2]], before) and space.used_blocks == 0 and not store._stored
    space.swap_out("a", [0])
    space.drop("a")  # an abort while swapped gives the space back, and the runner its copy
    assert space.used_blocks == 0 and not space.holds("a")
    store.apply(space.take_ops())
    assert not store._stored
    space.drop("never-swapped")  # nothing to say
    assert space.take_ops() == []


def test_auto_mode_picks_the_cheaper_preemption():
    def victim_after(per_token_s: float, bytes_per_s: float) -> tuple[int, int]:
        kv = PagedKVCacheManager(num_blocks=8, block_size=4)
        s = Scheduler(SchedulerConfig(max_num_seqs=1, policy="priority"), kv, get_policy("priority"), clock=FakeClock())
        s.swapper = SwapSpace(1 << 10, 1 << 20, bytes_per_s)
        for _ in range(3):
            s.cost.observe(100, 0, per_token_s * 100)
        low = make_req("low", 12, priority=5)
        s.add_request(low)
        run_step(s)
        s.add_request(make_req("urgent", 4, priority=0))
        run_step(s)
        return s.swapper.num_swapped_out, low.num_computed_tokens

    # 3 blocks of 1 MiB out and in at 10 GB/s: 0.6 ms, against 12 tokens x 1 ms to recompute.
    assert victim_after(per_token_s=1e-3, bytes_per_s=1e10) == (1, 12)
    # At 1 MB/s the copy would take 6 s: recompute 12 ms instead, from token 0.
    assert victim_after(per_token_s=1e-3, bytes_per_s=1e6) == (0, 0)


def test_swap_needs_swap_space():
    with pytest.raises(ValueError, match="preemption_mode='swap' needs swap_space > 0"):
        from tacit.config import CacheConfig, EngineConfig

        EngineConfig(model=None, cache=CacheConfig(swap_space=0), scheduler=SchedulerConfig(preemption_mode="swap"))
