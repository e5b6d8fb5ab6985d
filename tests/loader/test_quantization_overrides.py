"""--quantization-overrides: a type per linear layer (fnmatch patterns over HF module names, the
first match wins) of a Hugging Face checkpoint quantized at load.

The reference is test_hf_quantized.py's: the same checkpoint with each overridden weight
replaced by its dequantized value, run unquantized in float32, where the torch reference
multiplies the same float32 weights, so tokens and logprobs agree.
"""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_hf_quantized import KERNELS, assert_same_tokens_and_logprobs, copy_model_dir, ggml_layers, run

from tacit import LLM
from tacit.cli import build_parser
from tacit.config import parse_quantization_overrides
from tacit.config.engine_args import EngineArgs, load_recipe
from tacit.kernels.cpu_kernels import load_cpu_kernels
from tacit.kernels.weight_quant import quantize_int4_groupwise, quantize_int8_per_channel
from tacit.loader.gguf_writer import export_hf_to_gguf

MIXED = {"*.o_proj": "int8", "*.down_proj": "int8", "lm_head": "int8"}


@pytest.fixture(scope="module")
def tiny_llama_dir(tiny_model_factory):
    return tiny_model_factory("llama")[2]


def dequantized_as(src: Path, dst: Path, types: dict[str, str], group: int = 32) -> Path:
    """The checkpoint with each weight named in `types` ({HF weight name: int8 | int4})
    replaced by dequantize(quantize(w))."""
    copy_model_dir(src, dst)
    tensors = load_file(str(src / "model.safetensors"))
    for name, qtype in types.items():
        t = tensors[name]
        q = quantize_int8_per_channel(t) if qtype == "int8" else quantize_int4_groupwise(t, group)
        tensors[name] = q.dequantize(t.dtype)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def weight_types(layer_types: dict[str, str], num_layers: int = 2) -> dict[str, str]:
    """{HF weight name: int8 | int4} from {q_proj..down_proj / lm_head: type}."""
    out = {}
    for short, t in layer_types.items():
        if short == "lm_head":
            out["lm_head.weight"] = t
            continue
        block = "self_attn" if short in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
        out.update({f"model.layers.{i}.{block}.{short}.weight": t for i in range(num_layers)})
    return out


def test_patterns_select_the_layers_and_the_first_match_wins(tiny_llama_dir):
    overrides = {"model.layers.0.*": "int8", "*.o_proj": "none", "*.down_proj.weight": "int8", "lm_head": "int4"}
    _, llm = run(tiny_llama_dir, dtype="float32", quantization="int4", quantization_overrides=overrides)
    assert ggml_layers(llm) == {
        # layer 0: the first pattern wins over *.o_proj=none
        "model.layers.0.self_attn.qkv_proj": "Q8_0",
        "model.layers.0.self_attn.o_proj": "Q8_0",
        "model.layers.0.mlp.gate_up_proj": "Q8_0",
        "model.layers.0.mlp.down_proj": "Q8_0",
        # layer 1: o_proj kept dense, down_proj int8 (a pattern may name the weight), the rest int4
        "model.layers.1.self_attn.qkv_proj": "Q4_1",
        "model.layers.1.mlp.gate_up_proj": "Q4_1",
        "model.layers.1.mlp.down_proj": "Q8_0",
        "lm_head": "Q4_1",  # by default kept dense; an override quantizes it
    }
    assert llm.engine.model.model.layers[1].self_attn.o_proj.weight.dtype == torch.float32
    assert llm.engine.config.model.quantization_overrides == overrides


@pytest.mark.parametrize(
    "quantization,overrides,layer_types",
    [
        (
            "int4",
            MIXED,
            {
                **dict.fromkeys(("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"), "int4"),
                **dict.fromkeys(("o_proj", "down_proj", "lm_head"), "int8"),
            },
        ),
        # quantization none as the base: only the named layers are quantized
        (
            "none",
            {"*.mlp.*": "int4", "lm_head": "int8"},
            {"gate_proj": "int4", "up_proj": "int4", "down_proj": "int4", "lm_head": "int8"},
        ),
    ],
)
def test_mixed_layers_run_exactly_their_own_quantization(
    tiny_llama_dir, tmp_path, quantization, overrides, layer_types
):
    outs, llm = run(tiny_llama_dir, dtype="float32", quantization=quantization, quantization_overrides=overrides)
    expected = {"int8": "Q8_0", "int4": "Q4_1"}
    layers = ggml_layers(llm)
    assert layers["lm_head"] == expected[layer_types["lm_head"]]
    assert layers["model.layers.1.mlp.down_proj"] == expected[layer_types["down_proj"]]
    assert ("model.layers.1.self_attn.o_proj" in layers) == ("o_proj" in layer_types)
    ref_outs, ref = run(dequantized_as(tiny_llama_dir, tmp_path / "deq", weight_types(layer_types)), dtype="float32")
    assert ggml_layers(ref) == {}
    assert_same_tokens_and_logprobs(outs, ref_outs)


def test_tied_head_override_gets_its_own_blocks_of_the_table(tiny_model_factory):
    """llama3 tiny ties the head to the embeddings: overridden, the head holds the table's
    int8 blocks and the lookup table stays in float32."""
    outs, llm = run(tiny_model_factory("llama3")[2], dtype="float32", quantization_overrides={"lm_head": "int8"})
    model = llm.engine.model
    assert ggml_layers(llm) == {"lm_head": "Q8_0"}
    table = model.model.embed_tokens.weight
    assert table.dtype == torch.float32 and model.lm_head.weight is not table
    assert torch.equal(model.lm_head.weight, quantize_int8_per_channel(table).data)
    assert all(len(o.outputs[0].token_ids) == 12 for o in outs)


def test_unknown_type_is_refused_listing_the_valid_ones(tiny_llama_dir):
    with pytest.raises(
        ValueError, match=r"quantization_overrides\['\*.o_proj'\]='q4' is not a type; valid: none, int8, int4"
    ):
        LLM(str(tiny_llama_dir), quantization_overrides={"*.o_proj": "q4"})


def test_pattern_that_matches_no_layer_is_named(tiny_llama_dir):
    with pytest.raises(
        ValueError,
        match=r"pattern '\*.o_prj' matches no linear layer; patterns are fnmatch patterns over Hugging Face "
        r"module names such as model.layers.0.self_attn.q_proj, model.layers.0.self_attn.k_proj",
    ):
        LLM(
            str(tiny_llama_dir),
            dtype="float32",
            quantization="int4",
            quantization_overrides=MIXED | {"*.o_prj": "int8"},
        )


def test_layers_the_model_reads_directly_refuse_an_override(tiny_model_factory):
    moe = tiny_model_factory("qwen3_moe")[2]
    with pytest.raises(
        ValueError,
        match=r"'\*.mlp.gate' makes model.layers.0.mlp.gate int8, but the model reads this layer's weight "
        r"directly .* put 'model.layers.0.mlp.gate=none' before it",
    ):
        LLM(str(moe), dtype="float32", quantization_overrides={"*.mlp.gate": "int8"})
    # "none" for such a layer is what it is anyway
    _, llm = run(moe, dtype="float32", quantization="int8", quantization_overrides={"*.mlp.gate": "none"})
    assert "model.layers.0.mlp.gate" not in ggml_layers(llm)


def test_merged_shards_need_one_type(tiny_llama_dir):
    with pytest.raises(
        ValueError,
        match="model.layers.0.self_attn.qkv_proj is one merged layer whose shards need one type; "
        "got q_proj: int4, k_proj: int4, v_proj: int8",
    ):
        LLM(str(tiny_llama_dir), dtype="float32", quantization="int4", quantization_overrides={"*.v_proj": "int8"})


@pytest.mark.parametrize("qtype", ["int4", "int8"])
def test_overrides_check_the_group_size_per_layer(tiny_llama_dir, qtype):
    """Group 128 (int4's scale and min, or int8's scale): down_proj reads 128 values and may be
    quantized; o_proj reads 64 and may not."""
    _, llm = run(
        tiny_llama_dir, dtype="float32", quantization_group_size=128, quantization_overrides={"*.down_proj": qtype}
    )
    assert set(ggml_layers(llm)) == {f"model.layers.{i}.mlp.down_proj" for i in (0, 1)}
    with pytest.raises(
        ValueError,
        match=rf"quantization='{qtype}' with quantization_group_size=128: model.layers.0.self_attn.o_proj "
        r"\(64 inputs\), .*\(here: 32, 64\)",
    ):
        LLM(
            str(tiny_llama_dir),
            dtype="float32",
            quantization_group_size=128,
            quantization_overrides={"*.o_proj": qtype},
        )


def test_overrides_on_a_gguf_are_refused(tiny_llama_dir, tmp_path):
    path = export_hf_to_gguf(tiny_llama_dir, tmp_path / "tiny.gguf", ggml_types={"": "Q8_0"})
    with pytest.raises(
        ValueError,
        match="quantization_overrides apply to a Hugging Face checkpoint quantized at load; "
        "a GGUF's tensor types are fixed by the file",
    ):
        LLM(str(path), quantization_overrides={"*.o_proj": "int8"})


def test_cli_string_form():
    args = build_parser().parse_args(
        ["generate", "--prompt", "x", "--quantization", "int4", "--quantization-overrides", MIXED_CLI]
    )
    a = EngineArgs.from_cli_args(args)
    assert a.quantization_overrides == MIXED and list(a.quantization_overrides) == list(MIXED)  # order kept
    assert parse_quantization_overrides(" lm_head = none ,") == {"lm_head": "none"}
    with pytest.raises(ValueError, match=r"--quantization-overrides '\*.o_proj:int8' is invalid at '\*.o_proj:int8'"):
        parse_quantization_overrides("*.o_proj:int8")
    with pytest.raises(ValueError, match=r"quantization_overrides\['lm_head'\]='int2' is not a type"):
        parse_quantization_overrides("lm_head=int2")


MIXED_CLI = "*.o_proj=int8,*.down_proj=int8,lm_head=int8"


def test_recipe_mapping_form(tiny_llama_dir, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"model:\n  path: {tiny_llama_dir}\n  dtype: float32\n  quantization: int4\n"
        "  quantization_overrides:\n    '*.o_proj': int8\n    '*.down_proj': int8\n    lm_head: int8\n"
    )
    assert load_recipe(recipe).engine_args["quantization_overrides"] == MIXED
    layers = ggml_layers(LLM(recipe=str(recipe)))
    assert layers["model.layers.0.self_attn.o_proj"] == "Q8_0" and layers["model.layers.0.mlp.gate_up_proj"] == "Q4_1"
    recipe.write_text("model:\n  quantization_overrides: {'*.o_proj': int3}\n")
    with pytest.raises(ValueError, match=r"recipe .*recipe.yaml: quantization_overrides\['\*.o_proj'\]='int3'"):
        load_recipe(recipe)


@pytest.mark.skipif(not KERNELS or load_cpu_kernels() is None, reason="no AVX512-BF16 CPU kernels")
def test_bf16_fused_decoder_runs_mixed_types_with_the_dequantized_tokens(
    tiny_llama_dir, tmp_path, bf16_ggml_activations
):
    """The fused decode step takes a GGML type per projection: Q4_1 and Q8_0 layers side by side."""
    outs, llm = run(tiny_llama_dir, dtype="bfloat16", quantization="int4", quantization_overrides=MIXED)
    assert set(ggml_layers(llm).values()) == {"Q4_1", "Q8_0"} and ggml_layers(llm)["lm_head"] == "Q8_0"
    assert llm.engine.runner.fused_decode is not None
    types = {
        **dict.fromkeys(("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"), "int4"),
        **dict.fromkeys(("o_proj", "down_proj", "lm_head"), "int8"),
    }
    ref_outs, ref = run(dequantized_as(tiny_llama_dir, tmp_path / "deq", weight_types(types)), dtype="bfloat16")
    assert ggml_layers(ref) == {}
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in ref_outs]
