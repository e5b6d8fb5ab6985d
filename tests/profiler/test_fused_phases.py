"""The fused C++ decode step's own per-layer phase timers (FusedDecoder.set_phase_timing)."""

import os
import time

import pytest

from tacit import LLM, SamplingParams
from tacit.kernels.cpu_kernels import cpu_supports_avx512_bf16

pytestmark = pytest.mark.skipif(
    not cpu_supports_avx512_bf16() or bool(os.environ.get("TACIT_NO_CPU_KERNELS")),
    reason="CPU lacks AVX512-BF16, or TACIT_NO_CPU_KERNELS is set",
)


def decode_steps(engine, n_steps):
    """Run the prefill, then time n_steps decode steps' fused forward (run_layers)."""
    for i in range(3):
        engine.add_request([5 + i] * (4 + i), SamplingParams(temperature=0.0, max_tokens=n_steps + 2, ignore_eos=True))
    engine.step()
    fused = engine.runner.fused_decode
    real, spent = fused.run_layers, [0.0]

    class Timed:  # the runner calls fused.run_layers: time exactly that call
        num_layers = fused.num_layers
        embed, final_norm = fused.embed, fused.final_norm

        def run_layers(self, *args):
            t = time.perf_counter()
            real(*args)
            spent[0] += time.perf_counter() - t

    engine.runner.fused_decode = Timed()
    try:
        for _ in range(n_steps):
            engine.step()
    finally:
        engine.runner.fused_decode = fused
    return spent[0]


@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
def test_phase_timers_are_nonzero_and_within_the_step(tiny_model_factory, arch):
    _, _, path = tiny_model_factory(arch)
    engine = LLM(str(path), dtype="bfloat16").engine
    fused = engine.runner.fused_decode
    assert fused is not None
    names = list(fused.phase_names)
    assert names == ["norm", "gemm", "attention", "moe_routing", "experts"]
    assert list(fused.phase_seconds) == [] and not fused.phase_timing  # off unless asked
    fused.set_phase_timing(True)
    run_s = decode_steps(engine, 4)
    seconds = list(fused.phase_seconds)
    assert len(seconds) == len(names) * fused.num_layers
    per_layer = [dict(zip(names, seconds[i * len(names) : (i + 1) * len(names)])) for i in range(fused.num_layers)]
    for layer in per_layer:
        assert layer["norm"] > 0 and layer["attention"] > 0
    if arch == "llama":
        assert all(layer["gemm"] > 0 and layer["experts"] == 0 == layer["moe_routing"] for layer in per_layer)
    else:  # layer 0 sparse, layer 1 dense (mlp_only_layers=[1])
        assert per_layer[0]["moe_routing"] > 0 and per_layer[0]["experts"] > 0
        assert per_layer[1]["experts"] == 0 and per_layer[1]["gemm"] > 0
    assert sum(seconds) <= run_s
    fused.set_phase_timing(False)
    assert list(fused.phase_seconds) == []
