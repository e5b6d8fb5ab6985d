"""Random-weight models of real shapes for benchmarks (`--model random:qwen3-100m`).

Speed depends on shapes, not on trained values, so a seeded random checkpoint of a named
shape gives every engine the same bytes to stream without downloading anything. Built once
with transformers (a benchmark dependency) into the cache.
"""

from __future__ import annotations

import json
from pathlib import Path

from tacit.paths import cache_dir

FP8_SUFFIX = "-fp8"
# The shapes whose checkpoints carry an MTP layer (bench/random_mtp.py), as DeepSeek's do.
MTP_ARCHS = ("DeepseekV3Config", "DeepseekV32Config")
SHAPES = {
    # The issue-4 reference shape: 100M parameters, 200 MB in bf16.
    "qwen3-100m": dict(
        arch="Qwen3Config",
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        head_dim=64,
        intermediate_size=2048,
        vocab_size=32000,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
    ),
    # TinyLlama-1.1B's shape (Llama 2 layout, 4:1 GQA): 2.2 GB in bf16, 1.2 GB as Q8_0, so the
    # weights of every GGUF type exceed this machine's caches (the issue-12 1 GB target).
    "llama-1b": dict(
        arch="LlamaConfig",
        hidden_size=2048,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        intermediate_size=5632,
        vocab_size=32000,
        tie_word_embeddings=False,
        max_position_embeddings=4096,
    ),
    # Qwen3-30B-A3B's proportions (128 experts, top-8, expert width 0.375x hidden, 16:2 GQA with
    # 128-wide heads) at 1.0B parameters, 1.9 GB in bf16; 118M active per token (236 MB).
    "qwen3-moe-2b": dict(
        arch="Qwen3MoeConfig",
        hidden_size=1024,
        num_hidden_layers=6,
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=128,
        intermediate_size=3072,
        moe_intermediate_size=384,
        num_experts=128,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        vocab_size=32000,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
    ),
    # DeepSeek-V3's attention (MLA with V3's kv_lora_rank 512 + rope 64: 576 latent values a token)
    # and routing (sigmoid scores, 8 groups, top-4 groups, top-8 of 128 experts, one shared
    # expert, the first layer dense) at 0.84B parameters, 1.7 GB in bf16.
    "deepseek-v3-1b": dict(
        arch="DeepseekV3Config",
        hidden_size=1024,
        num_hidden_layers=6,
        first_k_dense_replace=1,
        num_attention_heads=16,
        num_key_value_heads=16,
        q_lora_rank=384,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        intermediate_size=2048,
        moe_intermediate_size=384,
        n_routed_experts=128,
        n_shared_experts=1,
        num_experts_per_tok=8,
        n_group=8,
        topk_group=4,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        vocab_size=32000,
        tie_word_embeddings=False,
        max_position_embeddings=4096,
    ),
    # gpt-oss-20b's attention (64 query heads, 8 kv heads of 64, hidden 2880, q/k/v/o biases,
    # sinks, 128-token windows alternating with full layers, YaRN to 131072 positions) at 4 of
    # its 24 layers. 8 experts of its real width (2880), top-4 as in gpt-oss: a token's expert
    # work per layer is the real model's, so a decode step's share of attention is not inflated.
    # 1.09B parameters, 2.2 GB in bf16.
    "gpt-oss-1b": dict(
        arch="GptOssConfig",
        hidden_size=2880,
        num_hidden_layers=4,
        layer_types=["sliding_attention", "full_attention"] * 2,
        sliding_window=128,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=64,
        intermediate_size=2880,
        num_local_experts=8,
        num_experts_per_tok=4,
        vocab_size=32000,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
    ),
    # Gemma-3-1B's decoder (google/gemma-3-1b-it's config.json, recipes/configs/SOURCES.md): 26
    # layers, five 512-token sliding-window layers to one global, 4 query heads over 1 kv head of
    # 256, query_pre_attn_scalar 256, rope bases 10k (sliding) and 1M (global). 0.73B parameters,
    # 1.5 GB in bf16. The vocabulary is 32,000 as the other shapes' rather than its 262,144: the
    # byte-level tokenizer here has at most 65,792 entries (bytes and byte pairs), and the real
    # table would add 0.27B parameters to every decode step's tied head (a 604 MB read in bf16).
    "gemma3-1b": dict(
        arch="Gemma3TextConfig",
        hidden_size=1152,
        num_hidden_layers=26,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        intermediate_size=6912,
        query_pre_attn_scalar=256,
        sliding_window=512,
        rope_theta=1000000.0,
        rope_local_base_freq=10000.0,
        hidden_activation="gelu_pytorch_tanh",
        vocab_size=32000,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
    ),
    # DeepSeek-V3.2's sparse attention (DSA) at deepseek-v3-1b's scale, with a small index_topk
    # (256) so prompts past 256 tokens run sparse: 0.22B parameters, 0.44 GB in bf16.
    "deepseek-v32-small": dict(
        arch="DeepseekV32Config",
        hidden_size=1024,
        num_hidden_layers=4,
        first_k_dense_replace=1,
        num_attention_heads=16,
        num_key_value_heads=16,
        q_lora_rank=384,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        intermediate_size=2048,
        moe_intermediate_size=384,
        n_routed_experts=32,
        n_shared_experts=1,
        num_experts_per_tok=4,
        n_group=4,
        topk_group=2,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        index_n_heads=16,
        index_head_dim=128,
        index_topk=256,
        vocab_size=32000,
        tie_word_embeddings=False,
        max_position_embeddings=8192,
    ),
    # DeepSeek-V3.2's own attention (hidden 7168, 128 heads, q_lora 1536, kv_lora 512, rope 64,
    # nope 128, v 128, 64 index heads of 128, index_topk 2048) in two layers, the first dense,
    # with 8 small experts and a 16k vocabulary: 0.78B parameters, 1.6 GB in bf16. Positions to
    # 40,960, so a 32k context fits: the DSA-against-dense attention comparison's shape
    # (tacit bench attention --model random:deepseek-v32-attn --context 32768 --dsa).
    "deepseek-v32-attn": dict(
        arch="DeepseekV32Config",
        hidden_size=7168,
        num_hidden_layers=2,
        first_k_dense_replace=1,
        num_attention_heads=128,
        num_key_value_heads=128,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        intermediate_size=2048,
        moe_intermediate_size=512,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        index_n_heads=64,
        index_head_dim=128,
        index_topk=2048,
        vocab_size=16384,
        tie_word_embeddings=False,
        max_position_embeddings=40960,
    ),
}


def _byte_level_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    # Bytes plus pairs of bytes, each pair with its merge: a real (if useless) BPE that
    # llama.cpp accepts too (it refuses a GGUF vocabulary without merges).
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {t: i for i, t in enumerate(alphabet)}
    merges = []
    pairs = ((a, b) for a in alphabet for b in alphabet)
    while len(vocab) < vocab_size - 1:
        a, b = next(pairs)
        vocab[a + b] = len(vocab)
        merges.append((a, b))
    vocab["<|endoftext|>"] = vocab_size - 1
    tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


def ensure_random_model(spec: str) -> Path:
    """random:NAME, a SHAPES entry in bf16, or random:NAME-fp8, the same weights written as an
    FP8 block-scaled checkpoint (loader/fp8_writer.py: DeepSeek-V3's format)."""
    name = spec.removeprefix("random:")
    base = name.removesuffix(FP8_SUFFIX)
    if base not in SHAPES:
        valid = ", ".join(f"random:{s}[{FP8_SUFFIX}]" for s in SHAPES)
        raise ValueError(f"random model {name!r} is not known; valid: {valid}")
    path = cache_dir() / f"random-{name}"
    # DeepSeek-V3 and V3.2 shapes carry an MTP layer (model-mtp.safetensors); a copy written before they
    # did is written again (the same seed gives the same weights).
    with_mtp = SHAPES[base]["arch"] in MTP_ARCHS and name == base
    if (path / "model.safetensors").exists() and (not with_mtp or (path / "model-mtp.safetensors").exists()):
        return path
    if name != base:
        from tacit.loader.fp8_writer import write_fp8_checkpoint

        return write_fp8_checkpoint(ensure_random_model(f"random:{base}"), path)
    return write_random_model(SHAPES[name], path)


def write_random_model(shape: dict, path: Path) -> Path:
    """A seeded random bf16 checkpoint of `shape` (a SHAPES entry: transformers config class
    name as "arch", then its fields) with a byte-level tokenizer, written to path."""
    import torch
    import transformers

    shape = dict(shape)
    cfg = getattr(transformers, shape.pop("arch"))(**shape, eos_token_id=shape["vocab_size"] - 1)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    if type(cfg).__name__ in MTP_ARCHS:  # its MTP layer, for speculative_config method mtp
        from tacit.bench.random_mtp import write_mtp_layer

        write_mtp_layer(model, path, std=0.02)
    _byte_level_tokenizer(shape["vocab_size"]).save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return path


def resolve_bench_model(model: str | None) -> str | None:
    return str(ensure_random_model(model)) if model and model.startswith("random:") else model
