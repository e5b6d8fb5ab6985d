import random
from dataclasses import replace

import pytest

from tacit.perf_model.efficiency import fitted_roofs, load_profile
from tacit.perf_model.layout import place
from tacit.perf_model.micro_batch_overlap import (
    DECODE_PLAN,
    PREFILL_PLAN,
    TENSOR_PARALLEL_PLAN,
    deepgemm_sm_share,
    layer_segments,
    overlapped_layers_seconds,
    tensor_parallel_segments,
    two_batch_seconds,
)
from tacit.perf_model.model_shape import load_hf_config, shape_from_hf
from tacit.perf_model.operators import Parallel, StepShape
from tacit.perf_model.predict import Workload, predict, step_time
from tacit.perf_model.step_model import Chunk, MixedStep, Pricing, mixed_step_seconds, mixed_step_times
from tacit.platforms.hardware_table import get_hardware_spec

COMPUTE = ("attn_0", "attn_1", "gate", "shared", "experts")


def test_a_decode_layer_by_hand():
    # A runs two stages alone, then A and B alternate:
    # A attn_0 [0,1], A attn_1 [1,3], A sends dispatch (wire 3-6) and runs shared [3,3.5],
    # B attn_0 [3.5,4.5], A waits for its dispatch until 6, experts [6,7], sends combine (wire 7-8),
    # B attn_1 [7,9], A's combine is in (8 < 9), B sends dispatch (wire 9-12), shared [9,9.5],
    # B waits until 12, experts [12,13], sends combine (wire 13-14), waits until 14.
    segments = {"attn_0": 1, "attn_1": 2, "gate": 0, "shared": 0.5, "experts": 1, "dispatch": 3, "combine": 1}
    assert overlapped_layers_seconds(DECODE_PLAN, segments, 1) == pytest.approx(14)


def test_without_transfers_the_micro_batches_just_take_turns():
    segments = {"attn_0": 1, "attn_1": 2, "gate": 0.1, "shared": 0.5, "experts": 1}
    for plan in (DECODE_PLAN, PREFILL_PLAN):
        assert overlapped_layers_seconds(plan, segments, 7) == pytest.approx(2 * 7 * 4.6)


@pytest.mark.parametrize("plan", [DECODE_PLAN, PREFILL_PLAN])
def test_overlap_lies_between_perfect_and_none(plan):
    rng = random.Random(0)
    for _ in range(200):
        segments = {name: rng.uniform(0, 1) for name in (*COMPUTE, "dispatch", "combine")}
        layers = rng.randint(1, 6)
        compute = 2 * layers * sum(segments[n] for n in COMPUTE)
        wire = 2 * layers * (segments["dispatch"] + segments["combine"])
        t = overlapped_layers_seconds(plan, segments, layers)
        assert max(compute, wire) - 1e-9 <= t <= compute + wire + 1e-9


def test_transfers_shorter_than_the_compute_around_them_cost_nothing():
    # each transfer shorter than what runs between its send and its wait
    segments = {"attn_0": 1, "attn_1": 1, "gate": 0, "shared": 0.2, "experts": 1, "dispatch": 1.1, "combine": 0.9}
    # but B's last layer: nothing of A's is left to run, so its dispatch waits out all but its
    # own shared experts (1.1 - 0.2) and its combine all of its 0.9
    drain = (1.1 - 0.2) + 0.9
    assert overlapped_layers_seconds(DECODE_PLAN, segments, 5) == pytest.approx(2 * 5 * 3.2 + drain)


def test_layer_segments_spread_a_step_over_its_layers():
    # 4 layers, 3 of them MoE: attention-side operators count over 4, MoE ones over 3
    ops = [
        ("q_a_proj", "attn_proj", 4.0),
        ("attention_latent", "attention", 8.0),
        ("kv_b_absorbed", "attn_proj", 4.0),
        ("norms_residual_act", "norm_elementwise", 8.0),
        ("router", "moe_routing", 0.3),
        ("experts", "experts", 6.0),
        ("shared_down", "experts", 3.0),
        ("moe_dispatch", "communication", 9.0),
        ("moe_combine", "communication", 12.0),
        ("gate_up_proj", "dense_mlp", 0.5),
        ("all_reduce", "communication", 0.25),
        ("lm_head", "lm_head", 2.0),
    ]
    segments, outside = layer_segments(ops, 4, 3)
    assert segments == pytest.approx(
        {
            "attn_0": 1 + 0.5 + 1,
            "attn_1": 2 + 0.5 + 1,
            "gate": 0.1,
            "experts": 2,
            "shared": 1,
            "dispatch": 3,
            "combine": 4,
        }
    )
    # the dense layer's attention side, the dense MLP, the group's all-reduce and the head
    assert outside == pytest.approx((4 + 8 + 4 + 8) / 4 + 0.5 + 0.25 + 2)


def test_deepep_decode_with_overlap_prices_the_stages():
    s = shape_from_hf(load_hf_config("DeepSeek-V3"))
    spec = get_hardware_spec("h100-sxm")
    profile = load_profile(spec.efficiency_profile)
    par = Parallel(tp=1, dp=32, ep=True, a2a_backend="deepep", deepep_mode="low_latency")
    par, roofs = place(par, fitted_roofs(spec, profile))
    step = StepShape(32 * 128, 1, 2000)

    def run(p):
        return step_time(
            s, roofs, profile, Workload(step.batch, 0, 16, weight_dtype="fp8", parallel=p, context=2000), step
        )

    serial, _ = run(par)
    overlapped, times = run(replace(par, two_batch_overlap=True))
    comm = sum(t.seconds for t in times if t.op.op_class == "communication")
    compute = sum(t.seconds for t in times) - comm
    # hides some communication, but not all: each micro-batch's combine outlasts the other's
    # attention kernel, o_proj and router, the only compute between its send and its wait
    half = [(t.op.name, t.op.op_class, t.seconds / 2) for t in times]
    seg, _ = layer_segments(half, s.num_layers, s.num_moe_layers)
    stall = seg["combine"] - seg["attn_1"] - seg["gate"]
    assert stall > 0
    assert overlapped >= compute + 2 * s.num_moe_layers * stall
    assert overlapped < compute + comm
    assert overlapped < serial


def test_tensor_parallel_turns_by_hand():
    # tacit's turn-taking, one layer, B's attention shorter than A's:
    # A attention [0,1], sends (wire 1-1.5); B attention [1,1.2], sends (wire busy: 1.5-2.0);
    # A waits for its sum (1.5), MLP [1.5,2.5], sends (2.5-3.0); B waits (2.0 < 2.5), MLP
    # [2.5,3.5], sends (3.5-4.0); the step ends when B's last sum is in
    a = {"attention": 1, "mlp": 1, "attention_sum": 0.5, "mlp_sum": 0.5}
    b = {**a, "attention": 0.2}
    assert overlapped_layers_seconds(TENSOR_PARALLEL_PLAN, (a, b), 1) == pytest.approx(4.0)


def test_tensor_parallel_segments_spread_the_collectives_over_the_two_sums():
    ops = [
        ("qkv_proj", "attn_proj", 2.0),
        ("attention", "attention", 2.0),
        ("norms_residual_act", "norm_elementwise", 4.0),
        ("gate_up_proj", "dense_mlp", 6.0),
        ("all_reduce", "communication", 8.0),
        ("logits_all_gather", "communication", 0.5),
        ("lm_head", "lm_head", 1.0),
    ]
    segments, outside = tensor_parallel_segments(ops, 2)
    assert segments == pytest.approx({"attention": 3.0, "mlp": 4.0, "attention_sum": 2.0, "mlp_sum": 2.0})
    assert outside == pytest.approx(1.5)


def _llama_tp8(overlap: bool) -> Pricing:
    s = shape_from_hf(load_hf_config("Llama-3.1-70B"))
    spec = get_hardware_spec("h100-sxm")
    profile = load_profile(spec.efficiency_profile)
    par, roofs = place(Parallel(tp=8, two_batch_overlap=overlap), fitted_roofs(spec, profile))
    return Pricing(s, roofs, profile, parallel=par)


def test_a_mixed_step_under_overlap_runs_as_two_micro_batches():
    step = MixedStep([Chunk(2048, 0, True), Chunk(1024, 0, True), Chunk(1024, 0, True), Chunk(1, 900, True)])
    p = _llama_tp8(True)
    whole, times = mixed_step_times(p, step)
    comm = sum(t.seconds for t in times if t.op.op_class == "communication")
    overlapped = mixed_step_seconds(p, step)
    # tacit's split: 2,048 tokens against 2,049
    halves = tuple(mixed_step_times(p, MixedStep(part))[1] for part in (step.chunks[:1], step.chunks[1:]))
    fixed = whole - sum(t.seconds for t in times)
    assert overlapped == pytest.approx(two_batch_seconds(halves, 80, 0, False) + fixed)
    assert overlapped < whole - 0.5 * comm
    # without the flag, or with one sequence, the step runs whole
    assert mixed_step_seconds(_llama_tp8(False), step) == pytest.approx(whole)
    one = MixedStep([Chunk(4096, 0, True)])
    assert mixed_step_seconds(p, one) == pytest.approx(mixed_step_times(p, one)[0])


def test_ttft_moves_with_the_overlap_as_the_prefill_does():
    s = shape_from_hf(load_hf_config("Llama-3.1-70B"))
    spec = get_hardware_spec("h100-sxm")
    runs = [predict(s, spec, Workload(8, 2048, 2, parallel=Parallel(tp=8, two_batch_overlap=o))) for o in (False, True)]
    assert runs[1].ttft_s < runs[0].ttft_s
    assert runs[1].prefill_step_s < runs[0].prefill_step_s


def test_tacits_fused_decoder_takes_a_decode_step_whole():
    decodes = MixedStep([Chunk(1, 900, True)] * 16)
    p = _llama_tp8(True)
    assert p.profile.decode_path(p.shape.architecture, p.shape.layer_kind) == "decode_fused"
    # the serving engines split a decode step too
    assert mixed_step_seconds(p, decodes) != pytest.approx(mixed_step_times(p, decodes)[0])
    # tacit's engine runs a decode step its fused decoder takes as one C++ call, ahead of its
    # two-batch path
    ours = replace(p, spec=replace(p.spec, name="this-cpu"))
    assert mixed_step_seconds(ours, decodes) == pytest.approx(mixed_step_times(ours, decodes)[0])


def test_an_overlapped_deepep_prefill_runs_deepgemm_on_the_sms_deepep_leaves():
    s = shape_from_hf(load_hf_config("DeepSeek-V3"))
    spec = get_hardware_spec("h100-sxm")
    profile = load_profile(spec.efficiency_profile)
    par, roofs = place(
        Parallel(tp=1, dp=32, ep=True, a2a_backend="deepep", deepep_mode="normal"), fitted_roofs(spec, profile)
    )
    p = Pricing(s, roofs, profile, weight_dtype="fp8", parallel=par)
    _, times = mixed_step_times(p, MixedStep([Chunk(4096, 0, True)] * 32))
    shared = deepgemm_sm_share(times, roofs, decode=False)
    experts = [(a, b) for a, b in zip(times, shared) if a.op.name == "experts"]
    assert len(experts) == 1
    before, after = experts[0]
    assert before.compute_s > before.memory_s  # a prefill's grouped GEMM is compute-bound
    # 132 SMs less DeepEP's 20
    assert after.compute_s == pytest.approx(before.compute_s * 132 / 112)
    assert after.seconds - before.seconds == pytest.approx(after.compute_s - before.compute_s)
    assert [t for t in shared if t.op.name != "experts"] == [t for t in times if t.op.name != "experts"]
    # a decode's low-latency kernels hold no SMs in flight; a part without an SM count is left as it is
    assert deepgemm_sm_share(times, roofs, decode=True) == times
    assert deepgemm_sm_share(times, replace(roofs, sms=None), decode=False) == times
