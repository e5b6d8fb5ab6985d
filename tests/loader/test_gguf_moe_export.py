"""The MoE GGUF writer (qwen3moe, deepseek2) against llama.cpp: the file it writes for a tiny HF
model loads in llama.cpp and computes what transformers computes."""

import numpy as np
import pytest
import torch

from tacit.loader.gguf_writer import export_hf_to_gguf

ARCHS = ["qwen3_moe_all", "deepseek_v3", "deepseek_v3_qlora"]  # deepseek_v3_qlora: q_a/q_b and yarn rope
PROMPT = [5, 9, 11, 3, 200, 17, 40, 41, 42, 100, 7, 250, 31]


def llamacpp_logits(path, ids: list[int]) -> np.ndarray:
    import llama_cpp

    # An f32 K/V cache: llama.cpp's default f16 one moves these logits by ~5e-3.
    llm = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=128,
        logits_all=True,
        verbose=False,
        n_threads=2,
        type_k=llama_cpp.GGML_TYPE_F32,
        type_v=llama_cpp.GGML_TYPE_F32,
    )
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)])


def hf_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


@pytest.mark.parametrize("arch", ARCHS)
def test_llamacpp_runs_the_float32_export_as_transformers(arch, tiny_model_factory, tmp_path):
    """Every logit of a 13-token prompt within 1e-4 (measured 2e-6 to 6e-6): the metadata
    (grouped sigmoid routing, yarn, leading dense layer, q_lora_rank 0 for q_proj) and the tensor
    layouts (expert stacks, k_b/v_b) say what the HF model does. Greedy continuations agree too."""
    pytest.importorskip("llama_cpp")
    model, _, hf_dir = tiny_model_factory(arch)
    path = export_hf_to_gguf(hf_dir, tmp_path / "m.gguf")
    ours, ref = llamacpp_logits(path, PROMPT), hf_logits(model, PROMPT)
    assert np.abs(ours - ref).max() < 1e-4
    ids = list(PROMPT)
    for _ in range(6):  # greedy, one token at a time, each step checked against transformers
        nxt = int(hf_logits(model, ids)[-1].argmax())
        assert int(llamacpp_logits(path, ids)[-1].argmax()) == nxt
        ids.append(nxt)


@pytest.mark.parametrize("arch", ["qwen3_moe_all", "deepseek_v3_qlora"])
@pytest.mark.parametrize("kind", ["bf16", "Q8_0 experts"])
def test_llamacpp_runs_the_lower_precision_exports(arch, kind, tiny_model_factory, tmp_path):
    """bf16 matrices / Q8_0 expert stacks (3-D tensors quantized row by row): logits within 0.25
    of float32 transformers (measured at most 0.11 on logits up to 4.7; bf16 keeps 8 mantissa
    bits, Q8_0 about 7 per value) and the same argmax at every prompt position."""
    pytest.importorskip("llama_cpp")
    model, _, hf_dir = tiny_model_factory(arch)
    if kind == "bf16":
        path = export_hf_to_gguf(hf_dir, tmp_path / "m.gguf", bf16=True)
    else:
        path = export_hf_to_gguf(hf_dir, tmp_path / "m.gguf", ggml_types={"_exps.weight": "Q8_0"})
    ours, ref = llamacpp_logits(path, PROMPT), hf_logits(model, PROMPT)
    assert np.abs(ours - ref).max() < 0.25
    assert (ours.argmax(-1) == ref.argmax(-1)).all()


def test_expert_stacks_are_written_whole(tiny_model_factory, tmp_path):
    """One [experts, rows, cols] tensor per projection and layer, expert e's slice expert e's weights."""
    import gguf

    from tacit.loader.hf import iter_safetensors

    _, _, hf_dir = tiny_model_factory("qwen3_moe_all")
    hf = dict(iter_safetensors(hf_dir))
    path = export_hf_to_gguf(hf_dir, tmp_path / "m.gguf", ggml_types={"ffn_down_exps.weight": "Q8_0"})
    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    gate = tensors["blk.1.ffn_gate_exps.weight"]
    got = np.asarray(gate.data).reshape(8, 32, 64)
    for e in range(8):
        assert np.array_equal(got[e], hf[f"model.layers.1.mlp.experts.{e}.gate_proj.weight"].numpy())
    down = tensors["blk.1.ffn_down_exps.weight"]
    assert down.tensor_type == gguf.GGMLQuantizationType.Q8_0
    deq = gguf.quants.dequantize(np.asarray(down.data), down.tensor_type).reshape(8, 64, 32)
    for e in range(8):
        ref = hf[f"model.layers.1.mlp.experts.{e}.down_proj.weight"].numpy()
        assert np.abs(deq[e] - ref).max() < 0.01 * np.abs(ref).max()
    assert tensors["blk.0.ffn_gate_inp.weight"].tensor_type == gguf.GGMLQuantizationType.F32  # the router


def test_dense_layers_are_refused_for_qwen3moe(tiny_model_factory, tmp_path):
    _, _, hf_dir = tiny_model_factory("qwen3_moe")  # mlp_only_layers=[1]
    with pytest.raises(ValueError, match=r"qwen3moe has experts in every layer.*mlp_only_layers=\[1\]"):
        export_hf_to_gguf(hf_dir, tmp_path / "m.gguf")


def test_unquantizable_rows_name_the_tensor(tiny_model_factory, tmp_path):
    _, _, hf_dir = tiny_model_factory("deepseek_v3")
    # k_b's rows are qk_nope_head_dim = 16 values: not one 32-value Q8_0 block.
    with pytest.raises(ValueError, match=r"blk\.0\.attn_k_b\.weight: rows of 16 values are not whole 32-value Q8_0"):
        export_hf_to_gguf(hf_dir, tmp_path / "m.gguf", ggml_types={"": "Q8_0"})


def test_k_quants_the_gguf_package_cannot_make_are_named(tiny_model_factory, tmp_path):
    _, _, hf_dir = tiny_model_factory("qwen3_moe_256")
    with pytest.raises(
        ValueError, match=r"blk\.0\.ffn_(gate|up|down)_exps\.weight: the gguf package cannot quantize to Q4_K"
    ):
        export_hf_to_gguf(hf_dir, tmp_path / "m.gguf", ggml_types={"_exps.weight": "Q4_K"})
