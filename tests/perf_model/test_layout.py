"""Per-part layouts of `tacit predict`: DeepEP dispatch counted by hand, the busiest expert rank,
redundant experts, collectives by algorithm across node links, pipeline stages, replicas,
two-batch overlap, and every refused layout's message."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tacit.perf_model.efficiency import load_profile
from tacit.perf_model.layout import place, resolve_layout
from tacit.perf_model.memory import device_memory, weight_bytes
from tacit.perf_model.model_shape import load_hf_config, shape_from_hf
from tacit.perf_model.moe_dispatch import expert_load_factor
from tacit.perf_model.operators import Parallel, StepShape, step_ops
from tacit.perf_model.parallel import Link, all_reduce_seconds, ring_all_reduce
from tacit.perf_model.predict import Workload, fitted_roofs, predict, step_time
from tacit.platforms.hardware_table import get_hardware_spec
from tacit.platforms.specs import Sourced

V3 = shape_from_hf(load_hf_config("DeepSeek-V3"))
NVLINK = Link(450e9, 2e-6)
IB = Link(50e9, 5e-6)
SMALL_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 16,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_experts": 10,
    "num_experts_per_tok": 2,
    "vocab_size": 1000,
}


def _ops(s, step, par):
    return {op.name: op for op in step_ops(s, step, par, reduce_bytes=2)}


def _h100_nodes(per_node: int = 8):
    return replace(
        get_hardware_spec("h100-sxm"),
        devices_per_node=per_node,
        inter_node_bandwidth=Sourced(50e9, "test: 400 Gb/s InfiniBand"),
        inter_node_latency=Sourced(5e-6, "test"),
    )


def test_deepep_dispatch_bytes_of_a_deepseek_v3_layout_by_hand():
    """DeepSeek-V3, 4 nodes of 8: attention TP 8 in each of 4 DP groups, EP 32, 128 sequences
    decoding. A group attends over 32 of them; each of its 8 devices dispatches 4 tokens. Low
    latency: each token's 8 experts, 8 * 7/32 = 1.75 copies to the node's other 7 ranks and
    8 * 24/32 = 6 to the other nodes' 24, fp8 (7168 bytes and 56 float32 scales a row), every one
    of the 58 MoE layers; the combine returns the same copies in bf16."""
    par = replace(Parallel(tp=8, dp=4, ep=True, expert_load_imbalance=1.0), devices_per_node=8)
    assert par.backend == "deepep" and par.expert_ranks == 32
    ops = _ops(V3, StepShape(128, 1, 1000), par)
    row = 4 * (7168 + 7168 / 128 * 4)
    d, c = ops["moe_dispatch"], ops["moe_combine"]
    assert d.bytes == pytest.approx(58 * row * (1.75 + 6)) and d.inter_bytes == pytest.approx(58 * row * 6)
    assert c.bytes == pytest.approx(58 * 4 * 7168 * 2 * 7.75) and d.algorithm == "low_latency"
    assert d.launches == 58 and d.participants == 32
    # attention's sums: all-reduced in the 3 dense layers (their MLPs too: 6), reduce-scattered
    # before the 58 MoE ones (each device keeps its 4 tokens) and all-gathered after the combine
    assert ops["all_reduce"].launches == 6 and ops["attn_reduce_scatter"].launches == 58
    assert ops["moe_all_gather"].bytes == 58 * 32 * 7168 * 2 and ops["moe_all_gather"].participants == 8
    # normal mode (a prefill): one copy a destination rank, across nodes once a node
    pre = _ops(V3, StepShape(128, 4, 0), par)["moe_dispatch"]
    p = 1 - (31 / 32) ** 8
    local = 7 * p + 24 * p * 7 / 8
    nodes = 4 * (1 - (3 / 4) ** 8) * 3 / 4
    row16 = 16 * (7168 + 7168 / 128 * 4)
    assert pre.algorithm == "normal" and pre.bytes == pytest.approx(58 * row16 * (local + nodes))


def test_dp_attention_with_deepep_charges_each_device_its_own_tokens():
    """16 devices, attention TP 1: with DeepEP each norms, routes and samples its 4 of the 64
    sequences; tacit's engine (allgather) gathers all 64 onto every device."""
    step = StepShape(64, 1, 500)
    deepep = _ops(V3, step, Parallel(tp=16, ep=True, dp_attention=True))
    gather = _ops(V3, step, Parallel(tp=16, ep=True, dp_attention=True, a2a_backend="allgather"))
    assert deepep["norms_residual_act"].rows == 4 and gather["norms_residual_act"].rows == 64
    assert deepep["router"].rows == 4 and gather["router"].rows == 64
    assert deepep["sampler"].rows == 4 and gather["sampler"].rows == 64
    assert "moe_dispatch" in deepep and "moe_dispatch" not in gather
    # the experts compute the same busiest-rank pairs either way; shared experts whole on own tokens
    assert deepep["experts"].flops == gather["experts"].flops
    assert deepep["shared_gate_up"].rows == 4
    mem = {
        b: device_memory(V3, Parallel(tp=16, ep=True, dp_attention=True, a2a_backend=b), "fp8", "bf16", 64, 2048, 1)
        for b in ("deepep", "allgather")
    }
    assert mem["deepep"].activations < mem["allgather"].activations / 8


def test_ep_need_not_divide_the_experts_and_redundant_experts_even_the_load():
    s = shape_from_hf(SMALL_MOE)  # 10 experts of 3 * 64 * 32 bf16 values
    expert = 3 * 64 * 32 * 2
    four = Parallel(tp=4, ep=True)
    base = weight_bytes(s, Parallel(tp=4, ep=True, ep_size=1), "bf16")  # EP 1: TP 4 inside all 10
    assert weight_bytes(s, four, "bf16") - base == pytest.approx(2 * (3 * expert - 10 * expert / 4))
    eplb = Parallel(tp=4, ep=True, redundant_experts=2)  # 12 slots: still 3 a rank, now even
    assert weight_bytes(s, eplb, "bf16") == weight_bytes(s, four, "bf16")
    draws = 64.0
    # the busiest of 4 ranks: over the mean without EPLB (a trained router's hot experts, and 3
    # of the 10 experts where the mean rank holds 2.5); EPLB's 12 even slots bring it near the mean
    skewed, balanced = expert_load_factor(s, four, draws), expert_load_factor(s, eplb, draws)
    assert 1 < balanced < skewed
    assert expert_load_factor(s, replace(four, expert_load_imbalance=1.5), draws) == 1.5
    assert _ops(s, StepShape(64, 1, 9), four)["experts"].flops > _ops(s, StepShape(64, 1, 9), eplb)["experts"].flops


def test_one_shot_wins_small_messages_and_loses_large_ones_inside_a_node():
    small, large = 16e3, 256e6
    one = all_reduce_seconds(small, 8, NVLINK, IB, 8, "one_shot")
    ring = all_reduce_seconds(small, 8, NVLINK, IB, 8, "ring")
    assert one == pytest.approx(7 * small / 450e9 + 2e-6) and ring == pytest.approx(ring_all_reduce(small, 8, NVLINK))
    assert one < ring / 5 and all_reduce_seconds(small, 8, NVLINK, IB, 8) == one
    big_one = all_reduce_seconds(large, 8, NVLINK, IB, 8, "one_shot")
    big_auto = all_reduce_seconds(large, 8, NVLINK, IB, 8)
    assert big_one > 3 * big_auto
    assert big_auto == pytest.approx(all_reduce_seconds(large, 8, NVLINK, IB, 8, "two_shot"))


def test_a_group_across_nodes_is_slower_than_within_and_goes_hierarchical():
    m = 64e6
    inside = all_reduce_seconds(m, 16, NVLINK, IB, 16)
    across = all_reduce_seconds(m, 16, NVLINK, IB, 8)
    assert across > 1.5 * inside
    # hierarchical: reduce-scatter and all-gather in the node, the 2 nodes all-reduce an eighth
    hier = 2 * (7 / 8 * m / 450e9 + 7 * 2e-6) + min(m / 8 / 50e9 + 2 * 5e-6, 2 * m / 8 / 50e9 + 2 * 5e-6)
    assert across == pytest.approx(hier) and across < all_reduce_seconds(m, 16, NVLINK, IB, 8, "ring")


def test_pipeline_stages_halve_the_layers_a_device_holds_and_add_sends():
    s = shape_from_hf(load_hf_config("Llama-3.1-8B"))  # 32 layers, untied embedding and head
    vocab = s.vocab_size * s.hidden_size * 2
    one, two = weight_bytes(s, Parallel(), "bf16"), weight_bytes(s, Parallel(pp=2), "bf16")
    assert two == pytest.approx((one - 2 * vocab) / 2 + vocab)
    spec = get_hardware_spec("h100-sxm")
    a = predict(s, spec, Workload(8, 512, 64))
    b = predict(s, spec, Workload(8, 512, 64, parallel=Parallel(pp=2)))
    assert any(t.op.name == "pp_send" and t.op.launches == 1 for t in b.decode_ops)
    assert b.memory.kv_cache == pytest.approx(a.memory.kv_cache / 2)
    # a step carries one micro-batch of 4 sequences through both stages; the replica's 8
    # sequences each take a token every such pass
    profile = load_profile(spec.efficiency_profile)
    par, roofs = place(Parallel(pp=2), fitted_roofs(spec, profile))
    direct, _ = step_time(s, roofs, profile, Workload(4, 512, 64, parallel=par), StepShape(4, 1, b.decode_context))
    assert b.tpot_s == pytest.approx(direct)
    assert b.throughput_tok_s == pytest.approx(8 * 64 / (b.ttft_s + 63 * b.tpot_s))


def test_data_parallel_replicas_double_a_dense_models_throughput():
    s = shape_from_hf(load_hf_config("Llama-3.1-8B"))
    spec = get_hardware_spec("h100-sxm")
    one = predict(s, spec, Workload(8, 512, 64))
    two = predict(s, spec, Workload(16, 512, 64, parallel=Parallel(dp=2)))
    assert two.layout.replicas == 2 and two.layout.dp == 1
    assert two.tpot_s == pytest.approx(one.tpot_s) and two.throughput_tok_s == pytest.approx(2 * one.throughput_tok_s)
    assert two.memory == one.memory


def test_two_batch_overlap_hides_communication_when_compute_dominates():
    s = shape_from_hf(load_hf_config("Llama-3.1-70B"))
    spec = _h100_nodes()
    profile = load_profile(spec.efficiency_profile)
    spec = fitted_roofs(spec, profile)
    par, spec = place(Parallel(tp=8), spec)

    def step(p, shape):
        return step_time(s, spec, profile, Workload(8, 2048, 2, parallel=p), shape)

    prefill = StepShape(8, 2048, 0)
    serial, times = step(par, prefill)
    comm = sum(t.seconds for t in times if t.op.op_class == "communication")
    assert comm > 0.02 * serial
    overlapped, _ = step(replace(par, two_batch_overlap=True), prefill)
    assert overlapped < serial - 0.5 * comm
    # a memory-bound decode reads every weight once per micro-batch: overlap costs it time
    decode = StepShape(8, 1, 2048)
    assert step(replace(par, two_batch_overlap=True), decode)[0] > step(par, decode)[0]


@pytest.mark.parametrize(
    "par, model, message",
    [
        (Parallel(tp=3), "Llama-3.1-8B", "--tensor-parallel-size 3 must divide the model's 32 attention heads"),
        (Parallel(tp=4, ep=True), "Llama-3.1-8B", "--enable-expert-parallel needs a MoE model"),
        (
            Parallel(tp=8, dp=4, ep=True, ep_size=12),
            "DeepSeek-V3",
            "--expert-parallel-size 12 must divide a stage's 32",
        ),
        (Parallel(tp=8, dp=64, ep=True), "DeepSeek-V3", "exceeds the model's 256 experts + 0 redundant"),
        (Parallel(tp=4, redundant_experts=8), "DeepSeek-V3", "--num-redundant-experts needs --enable-expert-parallel"),
        (Parallel(tp=8, ep=True, a2a_backend="deepep", ep_size=4), "DeepSeek-V3", "--moe-a2a-backend deepep"),
        (Parallel(tp=8, dp_lm_head=True), "DeepSeek-V3", "--enable-dp-lm-head needs data-parallel attention"),
        (Parallel(tp=8, dense_tp=3), "DeepSeek-V3", "--moe-dense-tp-size 3 must divide"),
        (Parallel(tp=8, all_reduce_algorithm="butterfly"), "DeepSeek-V3", "--all-reduce-algorithm 'butterfly'"),
        (Parallel(tp=8, ep=True, expert_load_imbalance=0.5), "DeepSeek-V3", "--expert-load-imbalance 0.5"),
        (Parallel(pp=200), "Llama-3.1-8B", "--pipeline-parallel-size 200 exceeds the model's 32 layers"),
        (Parallel(tp=1, dp_attention=True), "Llama-3.1-8B", "--data-parallel-attention needs --tensor-parallel-size"),
        (Parallel(tp=0), "Llama-3.1-8B", "--tensor-parallel-size must be an integer >= 1, got 0"),
    ],
)
def test_each_bad_layout_is_refused_naming_its_flag(par, model, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")):
        resolve_layout(par, shape_from_hf(load_hf_config(model)))


def test_the_layout_flags_reach_the_prediction(capsys):
    from tacit.cli import main

    argv = ["predict", "--model", "DeepSeek-V3", "--hardware", "h200-sxm", "--quantization", "fp8"]
    argv += ["--tensor-parallel-size", "8", "--data-parallel-size", "4", "--enable-expert-parallel"]
    argv += ["--num-redundant-experts", "32", "--devices-per-node", "8", "--batch-size", "256", "--ops"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "TP=8 EP=32 DP=4 MoE via deepep" in out and "moe_dispatch" in out
    assert main(argv + ["--expert-parallel-size", "5"]) == 2
    assert "--expert-parallel-size 5 must divide" in capsys.readouterr().err


def test_place_takes_the_flag_then_the_hardware_and_a_part_without_a_network_is_one_node():
    bare = replace(get_hardware_spec("a100-80g"), devices_per_node=1, inter_node_bandwidth=None)
    assert place(Parallel(tp=8), bare)[1].devices_per_node == 8
    par, spec = place(Parallel(tp=16, devices_per_node=4), _h100_nodes())
    assert par.devices_per_node == spec.devices_per_node == 4
    assert place(Parallel(tp=16), _h100_nodes())[0].devices_per_node == 8


def test_small_tp8_decode_all_reduces_take_one_shot_not_a_ring():
    """Llama-3.1-70B at TP 8, batch 1: each all-reduce is 16 KB, where the ring's 14 latencies
    are most of its time and one-shot pays one."""
    s = shape_from_hf(load_hf_config("Llama-3.1-70B"))
    spec = _h100_nodes()
    ring, auto = (
        predict(s, spec, Workload(1, 128, 16, parallel=Parallel(tp=8, all_reduce_algorithm=alg)))
        for alg in ("ring", "auto")
    )
    t_ring, t_auto = (next(x.seconds for x in p.decode_ops if x.op.name == "all_reduce") for p in (ring, auto))
    assert t_auto < t_ring / 4 and auto.tpot_s < ring.tpot_s


def test_dense_tp_1_and_dp_lm_head_keep_each_device_to_its_own_sequences():
    """SGLang's --moe-dense-tp-size 1 --enable-dp-lm-head under DP attention over 16 devices:
    the dense layers and the head run whole on each device over its 4 of 64 sequences, with no
    gather around them; by default both split over all 16 and gather every sequence."""
    step = StepShape(64, 1, 500)
    base = Parallel(tp=16, ep=True, dp_attention=True)
    own = _ops(V3, step, replace(base, dense_tp=1, dp_lm_head=True))
    wide = _ops(V3, step, base)
    assert own["gate_up_proj"].rows == 4 and wide["gate_up_proj"].rows == 64
    assert own["gate_up_proj"].flops == wide["gate_up_proj"].flops  # 1/16 the rows, 16x the width
    assert own["lm_head"].rows == 4 and own["lm_head"].flops == wide["lm_head"].flops
    assert not any("gather" in n or "scatter" in n for n in own if n != "moe_all_gather")
    assert "head_all_gather" in wide and "mlp_all_gather" in wide
