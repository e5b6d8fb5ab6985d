"""cpu_kernels and ggml_bf16_activations are engine settings, not process-wide switches: two
engines in one process each run as configured, whatever the other does in between."""

import argparse
import os

import pytest
import torch

from tacit import LLM, SamplingParams
from tacit.config.engine_args import EngineArgs
from tacit.kernels.cpu_fused_moe import CPUFusedMoEKernel
from tacit.kernels.cpu_kernels import cpu_supports_avx512_bf16, load_cpu_kernels
from tacit.kernels.torch_moe import TorchMoEKernel
from tacit.layers.cpu_linear_method import CpuBf16GemvLinearMethod
from tacit.layers.ggml_linear_method import GGMLLinearMethod
from tacit.layers.linear import LinearBase
from tacit.layers.linear_method import UnquantizedLinearMethod
from tacit.layers.moe import FusedMoE
from tacit.loader.gguf_writer import export_hf_to_gguf
from tacit.worker.paths.fused_decode import FusedDecodePath
from tacit.worker.request_state import update_request_states

pytestmark = pytest.mark.skipif(
    not cpu_supports_avx512_bf16() or bool(os.environ.get("TACIT_NO_CPU_KERNELS")),
    reason="CPU lacks AVX512-BF16, or TACIT_NO_CPU_KERNELS is set",
)
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def linear_methods(engine) -> set[type]:
    return {type(m.linear_method) for m in engine.model.modules() if isinstance(m, LinearBase)}


def test_cpu_kernels_off_in_one_engine_leaves_the_other_on(tiny_model_factory):
    path = str(tiny_model_factory("qwen3_moe")[2])
    off = LLM(path, dtype="bfloat16", cpu_kernels=False)
    on = LLM(path, dtype="bfloat16")
    assert off.engine.config.model.cpu_kernels is False and on.engine.config.model.cpu_kernels is True
    for llm, fused, methods, moe in (
        (off, False, {UnquantizedLinearMethod}, TorchMoEKernel),
        (on, True, {CpuBf16GemvLinearMethod}, CPUFusedMoEKernel),
    ):
        engine = llm.engine
        assert (engine.runner.fused_decode is not None) is fused
        assert linear_methods(engine) == methods
        assert {type(m.kernel) for m in engine.model.modules() if isinstance(m, FusedMoE)} == {moe}
    # Each still generates after the other ran (nothing either chose leaked into the process).
    for llm in (off, on, off):
        assert len(llm.generate([[5, 6, 7]], PARAMS)[0].outputs[0].token_ids) == 6


def fused_step_logits(engine) -> torch.Tensor:
    """The logits of the first decode step of one request, on the fused path."""
    engine.add_request([5, 9, 11, 3], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    engine.step()  # the prefill
    sched = engine.scheduler.schedule()
    update_request_states(engine.runner.requests, sched)
    rows = engine.runner.rows(sched)
    assert isinstance(engine.runner.path_for(rows), FusedDecodePath)
    return engine.runner.compute_logits(rows)[1].float()


def test_ggml_activations_are_each_engines_own(tiny_model_factory, tmp_path, monkeypatch):
    monkeypatch.delenv("TACIT_GGML_BF16_ACTIVATIONS", raising=False)
    gguf = str(export_hf_to_gguf(tiny_model_factory("llama")[2], tmp_path / "q.gguf", ggml_types={"": "Q4_0"}))
    bf16 = LLM(gguf, dtype="bfloat16", ggml_bf16_activations=True).engine
    int8 = LLM(gguf, dtype="bfloat16").engine
    assert bf16.runner.fused_decode.ggml_int8_activations is False
    assert int8.runner.fused_decode.ggml_int8_activations is True
    kernels = load_cpu_kernels()
    x = torch.randn(1, bf16.model.model.layers[0].mlp.down_proj.in_features, generator=torch.Generator().manual_seed(0))
    x = x.bfloat16()
    outs = {}
    # Interleaved: a process-wide switch flipped by one engine would show in the other's next call.
    for name, engine, int8_activations in (("bf16", bf16, False), ("int8", int8, True), ("bf16 again", bf16, False)):
        layer = engine.model.model.layers[0].mlp.down_proj
        assert isinstance(layer.linear_method, GGMLLinearMethod)
        got = layer(x)
        want = kernels.gemm_ggml_skinny(layer.weight.data, layer.linear_method.ggml_type, x, int8_activations)
        assert torch.equal(got, want), name
        outs[name] = got
    assert not torch.equal(outs["bf16"], outs["int8"]), "int8 and bf16 activations should round differently here"
    assert torch.equal(outs["bf16"], outs["bf16 again"])
    # The fused step multiplies as its engine says too.
    assert not torch.equal(fused_step_logits(bf16), fused_step_logits(int8))


def test_fields_default_to_the_environment_and_an_explicit_value_wins(tiny_model_factory, monkeypatch):
    args = EngineArgs()
    assert args.cpu_kernels is None and args.ggml_bf16_activations is None  # unsaid: the environment's
    monkeypatch.setenv("TACIT_NO_CPU_KERNELS", "1")
    monkeypatch.setenv("TACIT_GGML_BF16_ACTIVATIONS", "1")
    from tacit.kernels.cpu_kernels import cpu_kernels_default, ggml_bf16_activations_default

    assert cpu_kernels_default() is False and ggml_bf16_activations_default() is True
    assert load_cpu_kernels() is None and load_cpu_kernels(True) is not None
    path = str(tiny_model_factory("llama")[2])
    unsaid, said = LLM(path, dtype="bfloat16").engine, LLM(path, dtype="bfloat16", cpu_kernels=True).engine
    assert unsaid.config.model.cpu_kernels is False and unsaid.runner.fused_decode is None
    assert unsaid.config.model.ggml_bf16_activations is True
    assert said.config.model.cpu_kernels is True and said.runner.fused_decode is not None
    flags = EngineArgs.from_cli_args(
        EngineArgs.add_cli_args(argparse.ArgumentParser()).parse_args(["--no-cpu-kernels", "--ggml-bf16-activations"])
    )
    assert flags.cpu_kernels is False and flags.ggml_bf16_activations is True
    with pytest.raises(ValueError, match="cpu_kernels='yes' is invalid: must be true or false"):
        EngineArgs(cpu_kernels="yes").check()
