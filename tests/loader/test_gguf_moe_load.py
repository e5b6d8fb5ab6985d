"""qwen3moe / deepseek2 GGUF files (as the writer makes them, llama.cpp's layouts) load into
tacit's Qwen3-MoE and DeepSeek-V3 models and run as the HF directory they came from."""

import os

import numpy as np
import pytest
import torch

from tacit import LLM, SamplingParams
from tacit.kernels.cpu_kernels import cpu_supports_avx512_bf16
from tacit.loader.gguf_file import GGUFFile
from tacit.loader.gguf_writer import export_hf_to_gguf, reencode_gguf

ARCHS = ["qwen3_moe_all", "deepseek_v3", "deepseek_v3_qlora"]
PROMPTS = ["Paris is the capital of", [5, 9, 11, 3, 200, 17, 40]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=5)


@pytest.fixture(scope="module")
def exported(tiny_model_factory, tmp_path_factory):
    """arch -> (HF dir, float32 GGUF), each written once."""
    cache = {}

    def get(arch: str):
        if arch not in cache:
            _, _, hf_dir = tiny_model_factory(arch)
            cache[arch] = hf_dir, export_hf_to_gguf(hf_dir, tmp_path_factory.mktemp("moe_gguf") / f"{arch}.gguf")
        return cache[arch]

    return get


def first_logprobs_close(a, b, tol: float) -> None:
    for x, y in zip(a, b):
        for token_id, lp in x.outputs[0].logprobs[0].items():
            other = y.outputs[0].logprobs[0].get(token_id)
            if other is not None:
                assert abs(lp.logprob - other.logprob) < tol


@pytest.mark.parametrize("arch", ARCHS)
def test_float32_gguf_runs_as_the_hf_directory(arch, exported):
    """float32 in and out, and the k_b/v_b split undone exactly: the same tokens, the same log-probabilities."""
    hf_dir, path = exported(arch)
    a = LLM(str(hf_dir), dtype="float32").generate(PROMPTS, GREEDY)
    b = LLM(str(path), dtype="float32").generate(PROMPTS, GREEDY)
    for x, y in zip(a, b):
        assert x.prompt_token_ids == y.prompt_token_ids
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
    first_logprobs_close(a, b, 1e-5)


@pytest.mark.parametrize("arch", ["qwen3_moe_all", "deepseek_v3_qlora"])
def test_q8_0_experts_load_as_their_blocks_say(arch, exported, tmp_path):
    """Q8_0 expert stacks, kept in their blocks (quantization="gguf": FusedMoE.load_expert_stack)
    or dequantized at load ("none"): token for token what the same file dequantized to float32
    by the gguf package gives (each expert's blocks land in its own slice), and the first
    token's top log-probabilities within 0.05 of the float model's (measured 0.013: Q8_0 keeps
    about 7 bits a value; later greedy tokens of a random tiny model may drift apart, so they
    are not compared)."""
    from tacit.layers.moe import FusedMoE

    hf_dir, _ = exported(arch)
    q8 = export_hf_to_gguf(hf_dir, tmp_path / "q8.gguf", ggml_types={"_exps.weight": "Q8_0"})
    deq = reencode_gguf(q8, tmp_path / "deq.gguf", bf16=False)
    want = LLM(str(deq), dtype="float32").generate(PROMPTS, GREEDY)
    for quantization, kept in (("gguf", 8), ("none", None)):
        llm = LLM(str(q8), dtype="float32", quantization=quantization)
        moe = [m for m in llm.engine.model.modules() if isinstance(m, FusedMoE)]
        assert moe and all(m.w13_type == kept and m.w2_type == kept for m in moe)
        got = llm.generate(PROMPTS, GREEDY)
        for x, y in zip(got, want):
            assert x.outputs[0].token_ids == y.outputs[0].token_ids
        first_logprobs_close(got, want, 1e-4)
    first_logprobs_close(want, LLM(str(hf_dir), dtype="float32").generate(PROMPTS, GREEDY), 0.05)


def test_mxfp4_experts_load_as_their_blocks_say(exported, tmp_path):
    """MXFP4 expert stacks (ggml type 39, gpt-oss's), quantized by the gguf package: kept in their
    blocks (quantization="gguf") or dequantized at load ("none"), token for token the same file
    dequantized to float32; in bf16 the fused MoE kernel streams the blocks (bf16 activations:
    the dequantized model's arithmetic) and gives the dequantized bf16 model's tokens."""
    from tacit.layers.moe import FusedMoE

    hf_dir, _ = exported("qwen3_moe_all")
    path = export_hf_to_gguf(hf_dir, tmp_path / "mxfp4.gguf", ggml_types={"_exps.weight": "MXFP4"})
    want = LLM(str(reencode_gguf(path, tmp_path / "deq.gguf", bf16=False)), dtype="float32").generate(PROMPTS, GREEDY)
    for quantization, kept in (("gguf", 39), ("none", None)):
        llm = LLM(str(path), dtype="float32", quantization=quantization)
        moe = [m for m in llm.engine.model.modules() if isinstance(m, FusedMoE)]
        assert moe and all(m.w13_type == kept and m.w2_type == kept for m in moe)
        got = llm.generate(PROMPTS, GREEDY)
        for x, y in zip(got, want):
            assert x.outputs[0].token_ids == y.outputs[0].token_ids
        first_logprobs_close(got, want, 1e-4)
    kept, deq = (LLM(str(path), dtype="bfloat16", quantization=q, ggml_bf16_activations=True) for q in ("gguf", "none"))
    moe = [m for m in kept.engine.model.modules() if isinstance(m, FusedMoE)]
    assert all(m.w13_type == m.w2_type == 39 and m.w13.dtype == torch.uint8 for m in moe)
    if cpu_supports_avx512_bf16() and not os.environ.get("TACIT_NO_CPU_KERNELS"):
        assert all(m.kernel.name == "cpu_fused" for m in moe)  # the AVX512 kernel streams the blocks
    for x, y in zip(kept.generate(PROMPTS, GREEDY), deq.generate(PROMPTS, GREEDY)):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids


@pytest.mark.parametrize("down, down_id, block_bytes", [("Q4_0", 2, 18), ("Q5_0", 6, 22)])
def test_down_stack_of_another_type_is_kept_too(exported, tmp_path, down, down_id, block_bytes):
    """gate/up in Q8_0, down in Q4_0 (as Q4_K_M files keep ffn_down_exps in Q6_K) or Q5_0 (their
    fallback for rows that are not whole 256-value blocks): each stack keeps its own blocks,
    allocated as blocks from the start (build_model's memory check counts bytes, not float
    experts), and runs as the file dequantized."""
    hf_dir, _ = exported("qwen3_moe_all")
    types = {"_exps.weight": "Q8_0", "ffn_down_exps.weight": down}
    q = export_hf_to_gguf(hf_dir, tmp_path / "mixed.gguf", ggml_types=types)
    llm = LLM(str(q), dtype="float32", quantization="gguf")
    experts = llm.engine.model.model.layers[0].mlp.experts
    assert (experts.w13_type, experts.w2_type) == (8, down_id)
    assert experts.w13.dtype == experts.w2.dtype == torch.uint8
    assert tuple(experts.w2.shape) == (8, 64, 32 // 32 * block_bytes)  # [experts, hidden, down's row bytes]
    want = LLM(str(reencode_gguf(q, tmp_path / "deq.gguf", bf16=False)), dtype="float32").generate(PROMPTS, GREEDY)
    got = llm.generate(PROMPTS, GREEDY)
    for x, y in zip(got, want):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
    first_logprobs_close(got, want, 1e-4)


def test_q4_k_experts_kept_in_their_blocks(exported, tmp_path):
    """Q4_K expert stacks (random blocks, as test_gguf_k_quants makes them: the gguf package
    cannot quantize K-quants) kept in their blocks run as the file dequantized to float32 does:
    the same first-token top log-probabilities. (llama.cpp on such a file is no reference: it
    rounds activations to 8 bits per 256 values, which moves these random models' log-probabilities
    by up to 2, on a dense tiny llama as much as here.)"""
    import gguf
    from test_gguf_k_quants import k_blocks

    rng = np.random.default_rng(0)

    def to_q4_k(arr: np.ndarray):
        blocks = np.stack([k_blocks("Q4_K", arr.shape[1], arr.shape[2], rng) for _ in range(arr.shape[0])])
        return blocks, gguf.GGMLQuantizationType.Q4_K

    _, path = exported("qwen3_moe_256")
    stacks = [f"blk.{i}.ffn_{p}_exps.weight" for i in range(2) for p in ("gate", "up", "down")]
    q4 = copy_gguf(path, tmp_path / "q4k.gguf", retype=dict.fromkeys(stacks, to_q4_k))
    llm = LLM(str(q4), dtype="float32", quantization="gguf")
    assert llm.engine.model.model.layers[0].mlp.experts.w13_type == 12  # Q4_K, kept
    deq = LLM(str(reencode_gguf(q4, tmp_path / "deq.gguf", bf16=False)), dtype="float32")
    a, b = llm.generate(PROMPTS, GREEDY), deq.generate(PROMPTS, GREEDY)
    for x, y in zip(a, b):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
    first_logprobs_close(a, b, 1e-4)


def test_a_quantized_router_is_dequantized(exported, tmp_path):
    """The router is read through F.linear on its weight (dense_weight_linears): a GGUF storing it
    in GGML blocks still loads it as a float matrix, whatever happens to the other blocks."""
    _, path = exported("qwen3_moe_all")
    attn = tuple(f"blk.0.attn_{x}.weight" for x in "qkv")
    q8 = copy_gguf(path, tmp_path / "router.gguf", retype=dict.fromkeys(("blk.0.ffn_gate_inp.weight", *attn), to_q8_0))
    want = LLM(str(reencode_gguf(q8, tmp_path / "deq.gguf", bf16=False)), dtype="float32").generate(PROMPTS, GREEDY)
    llm = LLM(str(q8), dtype="float32", quantization="gguf")
    layer = llm.engine.model.model.layers[0]
    assert layer.mlp.gate.weight.dtype == torch.float32
    assert any(p.dtype == torch.uint8 for p in layer.self_attn.parameters())  # qkv_proj kept its blocks
    for x, y in zip(llm.generate(PROMPTS, GREEDY), want):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids


def test_deepseek2_config_from_metadata(exported):
    _, path = exported("deepseek_v3_qlora")
    cfg = GGUFFile(path).hf_config()
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"]
    want = dict(q_lora_rank=24, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16)
    want.update(n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, n_shared_experts=1)
    want.update(first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.5, moe_intermediate_size=32)
    assert {k: cfg[k] for k in want} == pytest.approx(want)
    assert cfg["rope_scaling"] == pytest.approx(
        dict(
            rope_type="yarn",
            factor=4.0,
            original_max_position_embeddings=256,
            mscale=1.0,
            mscale_all_dim=1.0,
            beta_fast=32.0,
            beta_slow=1.0,
        )
    )
    _, plain = exported("deepseek_v3")
    assert GGUFFile(plain).hf_config()["q_lora_rank"] is None  # written as 0: q_proj, no q_a/q_b


def to_q8_0(arr: np.ndarray):
    import gguf

    return gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0


def copy_gguf(src, dst, drop=(), override=None, drop_tensors=(), retype=None):
    """The same file with metadata keys (or tensors) dropped, keys given other (integer) values,
    or tensors stored otherwise: retype {name: f(float32 array) -> (raw uint8 blocks, GGML type)}."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    writer = gguf.GGUFWriter(str(dst), reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop:
            continue
        if override and key in override:
            writer.add_uint32(key, override[key])
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        if retype and t.name in retype:
            raw, qtype = retype[t.name](np.asarray(t.data))
            writer.add_tensor(t.name, raw, raw_shape=raw.shape, raw_dtype=qtype)
        elif t.name not in drop_tensors:
            shape = tuple(int(d) for d in reversed(t.shape))
            writer.add_tensor(t.name, t.data, raw_shape=shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def test_missing_moe_key_is_named(exported, tmp_path):
    _, path = exported("qwen3_moe_all")
    bad = copy_gguf(path, tmp_path / "bad.gguf", drop=("qwen3moe.expert_count",))
    with pytest.raises(ValueError, match="GGUF metadata lacks qwen3moe.expert_count"):
        LLM(str(bad))


def test_softmax_gated_deepseek2_is_refused(exported, tmp_path):
    _, path = exported("deepseek_v3")
    bad = copy_gguf(path, tmp_path / "v2.gguf", override={"deepseek2.expert_gating_func": 1})
    with pytest.raises(ValueError, match=r"deepseek2\.expert_gating_func is 1 \(softmax\).*sigmoid"):
        LLM(str(bad))
    absent = copy_gguf(path, tmp_path / "v2b.gguf", drop=("deepseek2.expert_gating_func",))
    with pytest.raises(ValueError, match=r"deepseek2\.expert_gating_func is absent"):
        LLM(str(absent))


def test_lone_k_b_is_an_error(exported, tmp_path):
    _, path = exported("deepseek_v3")
    bad = copy_gguf(path, tmp_path / "lone.gguf", drop_tensors=("blk.2.attn_v_b.weight",))
    with pytest.raises(ValueError, match=r"blk\.2\.attn_k_b\.weight has no blk\.2\.attn_v_b\.weight"):
        list(GGUFFile(bad).tensors())


def test_expert_streaming_from_a_gguf_is_refused(exported):
    _, path = exported("qwen3_moe_all")
    with pytest.raises(
        ValueError, match="expert_cache_memory streams experts from an unquantized safetensors checkpoint"
    ):
        LLM(str(path), dtype="float32", expert_cache_memory=1 << 20)
