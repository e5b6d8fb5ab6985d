"""FusedMoE split over 2 ranks, in bf16 on the fused CPU kernel with a shared expert fused in:
the ranks' all-reduced output equals one rank's whole layer (same routing: the router input is
the same on every rank), by feature and by expert. The model-level float32 tests cover the
torch kernel; this one covers the kernel and split the bf16 path runs."""

import pytest
import torch

from tacit.distributed.parallel_state import TensorParallel
from tacit.distributed.spawn import run_on_ranks
from tacit.distributed.torch_communicator import TorchCommunicator
from tacit.kernels.cpu_kernels import load_cpu_kernels
from tacit.kernels.moe_kernel import ExpertWeights
from tacit.kernels.moe_routing import MoERouting
from tacit.layers.moe import FusedMoE, select_moe_kernel

E, H, I, TOKENS = 8, 64, 96, 13
ROUTING = MoERouting(top_k=3, scoring="sigmoid", num_groups=4, topk_groups=2, scaling=2.5)


def weights():
    g = torch.Generator().manual_seed(0)
    w13 = torch.randn(E, 2 * I, H, generator=g) * H**-0.5
    w2 = torch.randn(E, H, I, generator=g) * I**-0.5
    shared13 = torch.randn(1, 2 * I, H, generator=g) * H**-0.5
    shared2 = torch.randn(1, H, I, generator=g) * I**-0.5
    x = torch.randn(TOKENS, H, generator=g)
    logits = torch.randn(TOKENS, E, generator=g)
    bias = torch.randn(E, generator=g) * 0.1
    return w13, w2, shared13, shared2, x, logits, bias


def layer(tp: TensorParallel) -> tuple[FusedMoE, ExpertWeights, tuple]:
    w13, w2, s13, s2, x, logits, bias = weights()
    moe = FusedMoE(E, H, I, ROUTING, tp=tp).to(torch.bfloat16)
    for e in range(E):
        if not moe.is_local(e):
            continue
        shards = moe.checkpoint_shards("experts")
        for proj, w in (("gate_proj", w13[e, :I]), ("up_proj", w13[e, I:]), ("down_proj", w2[e])):
            shard = shards.get(f"experts.{e}.{proj}.weight")
            if shard is not None:
                w = w.narrow(*shard)
            moe.load_expert_weight(e, proj, w.to(torch.bfloat16))
    start, n = tp.part(I, "shared")
    shared = ExpertWeights(
        torch.cat([s13[:, start : start + n], s13[:, I + start : I + start + n]], dim=1).to(torch.bfloat16),
        s2[:, :, start : start + n].contiguous().to(torch.bfloat16),
    )
    moe.kernel = select_moe_kernel("cpu", torch.bfloat16)
    return moe, shared, (x.to(torch.bfloat16), logits, bias)


def split_layer(rank: int, world: int, expert_parallel: bool) -> torch.Tensor:
    torch.set_num_threads(1)
    moe, shared, (x, logits, bias) = layer(TensorParallel(rank, world, expert_parallel))
    moe.comm = TorchCommunicator()
    return moe(x, logits, bias, shared)


@pytest.mark.skipif(load_cpu_kernels() is None, reason="no AVX512-BF16 CPU kernels")
@pytest.mark.parametrize("expert_parallel", [False, True])
def test_split_moe_layer_sums_to_the_whole(expert_parallel):
    torch.set_num_threads(1)
    moe, shared, (x, logits, bias) = layer(TensorParallel())
    want = moe(x, logits, bias, shared).float()
    outs = run_on_ranks(split_layer, 2, expert_parallel)
    assert torch.equal(outs[0], outs[1])  # every rank holds the same sum
    # Each rank rounds its partial sum to bf16 before the all-reduce: a few bf16 ulps of values ~1.
    torch.testing.assert_close(outs[0].float(), want, rtol=2e-2, atol=2e-2)
    assert (outs[0].float() - want).abs().max() < 0.05 * want.abs().max()


def test_a_size_that_does_not_divide_the_experts_is_refused():
    with pytest.raises(ValueError, match=r"tensor_parallel_size=4 does not divide num_experts=6"):
        FusedMoE(6, H, I, ROUTING, tp=TensorParallel(0, 4, expert_parallel=True))
    with pytest.raises(ValueError, match=r"tensor_parallel_size=4 does not divide moe_intermediate_size=90"):
        FusedMoE(8, H, 90, ROUTING, tp=TensorParallel(0, 4))
