"""The fused decode step's binders: picked by architecture, refusing what they do not serve, and
the models themselves free of the fused step (issue 32: the binding left models/)."""

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from tacit import LLM, SamplingParams
from tacit.kernels.cpu_kernels import cpu_supports_avx512_bf16
from tacit.models import registry
from tacit.models.llama import LlamaForCausalLM
from tacit.worker.paths.fused_binders import binder_for, build_fused_decoder, fused_decoder_unsupported_reason
from tacit.worker.paths.fused_binders.deepseek_v3 import DeepseekV3FusedBinder
from tacit.worker.paths.fused_binders.llama import LlamaFusedBinder
from tacit.worker.paths.fused_decode import FusedDecodePath

needs_kernels = pytest.mark.skipif(
    not cpu_supports_avx512_bf16() or bool(os.environ.get("TACIT_NO_CPU_KERNELS")),
    reason="CPU lacks AVX512-BF16, or TACIT_NO_CPU_KERNELS is set",
)
MODELS = Path(__file__).resolve().parents[2] / "tacit" / "models"


@needs_kernels
@pytest.mark.parametrize(
    "arch, binder",
    [
        ("llama", LlamaFusedBinder),
        ("qwen2", LlamaFusedBinder),
        ("qwen3", LlamaFusedBinder),
        ("qwen3_moe", LlamaFusedBinder),
        ("deepseek_v3", DeepseekV3FusedBinder),
    ],
)
def test_each_family_gets_its_binder_and_the_fused_step(tiny_model_factory, arch, binder):
    engine = LLM(str(tiny_model_factory(arch)[2]), dtype="bfloat16").engine
    assert type(binder_for(engine.model)) is binder
    assert fused_decoder_unsupported_reason(engine.model) is None
    assert engine.runner.fused_decode is not None


class UnknownForCausalLM(LlamaForCausalLM):
    """A Llama-shaped architecture no binder is registered for."""


def test_an_architecture_without_a_binder_is_refused_by_name_and_runs_on_torch(
    tiny_model_factory, tmp_path, monkeypatch
):
    src = tiny_model_factory("llama")[2]
    path = tmp_path / "unknown"
    shutil.copytree(src, path)
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["UnknownForCausalLM"]
    (path / "config.json").write_text(json.dumps(config))
    monkeypatch.setitem(registry.MODEL_REGISTRY, "UnknownForCausalLM", UnknownForCausalLM)

    llm = LLM(str(path), dtype="bfloat16")
    engine = llm.engine
    assert binder_for(engine.model) is None
    reason = fused_decoder_unsupported_reason(engine.model)
    assert reason is not None and "UnknownForCausalLM has no fused decode step" in reason
    assert "LlamaForCausalLM" in reason and "DeepseekV3ForCausalLM" in reason  # names the ones that have one
    from tacit.kernels.cpu_kernels import load_cpu_kernels

    assert build_fused_decoder(engine.model, load_cpu_kernels(), 16, 64) is None
    assert engine.runner.fused_decode is None
    # The torch path runs it: the same tokens as the registered architecture on the torch path.
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    got = llm.generate([[5, 6, 7]], params)[0].outputs[0].token_ids
    ref_llm = LLM(str(src), dtype="bfloat16")
    ref_llm.engine.runner.fused_decode = None
    assert got == ref_llm.generate([[5, 6, 7]], params)[0].outputs[0].token_ids
    assert len(got) == 8


@needs_kernels
def test_a_model_its_binder_cannot_run_keeps_the_torch_path_with_the_reason(tiny_model_factory):
    engine = LLM(str(tiny_model_factory("llama")[2]), dtype="float32").engine
    assert type(binder_for(engine.model)) is LlamaFusedBinder
    assert fused_decoder_unsupported_reason(engine.model) is not None
    assert engine.runner.fused_decode is None
    engine.add_request([5, 6], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    engine.step()
    rows = engine.runner.rows(engine.scheduler.schedule())
    assert not isinstance(engine.runner.path_for(rows), FusedDecodePath)


def test_models_hold_no_fused_decoder_plumbing(tiny_model_factory):
    """A complement to the behaviour above: the model classes carry no binding methods and no
    file under models/ names the fused step or its kernels."""
    for cls in registry.MODEL_REGISTRY.values():
        for attr in (
            "build_fused_decoder",
            "_bind_fused_decoder",
            "fused_decoder_unsupported_reason",
            "fused_mlp_weights",
            "fused_mlp_unsupported_reason",
            "fused_tensor_parallel_reason",
        ):
            assert not hasattr(cls, attr), f"{cls.__name__}.{attr}"
    pattern = re.compile(r"cpu_fused_decode|FusedDecoder|fused[_ ]decode|bind_\w+_decoder|fused_binders")
    hits = [
        f"{p.name}:{i}"
        for p in sorted(MODELS.glob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []
