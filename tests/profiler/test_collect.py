"""The step breakdown on tiny random models: categories add up to each step's wall time."""

import os

import pytest

from tacit import LLM
from tacit.kernels.cpu_kernels import cpu_supports_avx512_bf16
from tacit.profiler.categories import CATEGORIES, HEAD
from tacit.profiler.collect import WorkloadRequest, run_workload

needs_kernels = pytest.mark.skipif(
    not cpu_supports_avx512_bf16() or bool(os.environ.get("TACIT_NO_CPU_KERNELS")),
    reason="CPU lacks AVX512-BF16, or TACIT_NO_CPU_KERNELS is set: no fused decode step",
)


def check_sums(steps):
    for s in steps:
        measured = sum(v for c, v in s.categories.items() if c != "host")
        assert set(s.categories) <= set(CATEGORIES)
        assert measured > 0, f"{s.kind} step measured nothing"
        # host is the remainder: it must not go negative (measured spans are disjoint parts of the step)
        assert s.categories["host"] >= 0, f"{s.kind}: categories {measured} s exceed the step {s.step_s} s"
        assert abs(sum(s.categories.values()) - s.step_s) <= 0.03 * s.step_s


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=needs_kernels)])
def test_categories_add_up_to_the_step(tiny_llama, dtype):
    _, _, path = tiny_llama
    engine = LLM(str(path), dtype=dtype, block_size=4).engine
    # Two requests at step 0, a third arriving at step 2: prefill, decode and mixed steps.
    reqs = [WorkloadRequest(9, 5), WorkloadRequest(13, 5), WorkloadRequest(7, 3, arrival_step=2)]
    steps = run_workload(engine, reqs)
    assert {s.kind for s in steps} == {"prefill", "decode", "mixed"}
    check_sums(steps)
    for s in steps:
        assert {"layers.0", "layers.1", HEAD} <= set(s.layers)
        for layer in ("layers.0", "layers.1"):
            assert s.layers[layer].get("gemm", 0) > 0 and s.layers[layer].get("attention", 0) > 0
            assert s.layers[layer].get("norm", 0) > 0
        assert s.categories.get("sampling", 0) > 0
        assert "communication" not in s.categories  # one process
    fused = engine.runner.fused_decode
    assert type(fused).__name__ != "_TimedFusedDecoder", "the profiler must put the runner back"
    if fused is not None:
        assert not fused.phase_timing, "phase timers must be off again after profiling"


# qwen3_moe: layer 0 sparse, layer 1 dense (mlp_only_layers=[1]); deepseek_v3: MLA attention,
# layer 0 dense, layer 1 sparse with a shared expert. bf16: the fused MoE kernel and decode step.
@pytest.mark.parametrize(
    "arch, dtype, sparse, dense",
    [
        ("qwen3_moe", "float32", "layers.0", "layers.1"),
        pytest.param("qwen3_moe", "bfloat16", "layers.0", "layers.1", marks=needs_kernels),
        ("deepseek_v3", "float32", "layers.1", "layers.0"),
    ],
)
def test_moe_steps_split_routing_from_experts(tiny_model_factory, arch, dtype, sparse, dense):
    from tacit.profiler.roofline import model_shapes, step_work

    _, _, path = tiny_model_factory(arch)
    engine = LLM(str(path), dtype=dtype).engine
    steps = run_workload(engine, [WorkloadRequest(10, 3), WorkloadRequest(6, 3)])
    check_sums(steps)
    for s in steps:
        assert s.layers[sparse].get("moe_routing", 0) > 0
        assert s.layers[sparse].get("experts", 0) > 0
        assert "experts" not in s.layers[dense]
        work = step_work(model_shapes(engine.model), s.rows, s.num_samples)
        for category in ("moe_routing", "experts", "attention", "gemm"):
            flops, nbytes = work[sparse][category]
            assert flops > 0 and nbytes > 0, category


def test_steps_count_the_prompt_tokens_the_prefix_cache_supplied(tiny_llama):
    """A prompt seen before: its step computes only what the cache does not hold, and the
    record says how many prompt tokens came from the cache instead."""
    from tacit import SamplingParams
    from tacit.profiler.collect import Profiler

    engine = LLM(str(tiny_llama[2]), dtype="float32", block_size=4).engine
    prompt, params = list(range(20, 30)), SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    records = []
    with Profiler(engine) as prof:
        for _ in range(2):
            engine.add_request(prompt, params)
            while engine.has_unfinished_requests():
                record = prof.step()
                if record is not None:
                    records.append(record)
    first, again = records[0], records[2]  # prefill, decode; prefill again
    assert (first.cached_tokens, first.rows) == (0, [(10, 0)])
    assert (again.cached_tokens, again.rows) == (8, [(2, 8)])  # 2 full blocks of 4 before the last token
