"""Tiny random models built with transformers at test time, saved as HF directories.

Weights are drawn with a larger std than transformers' default 0.02 so the logits are peaked:
with near-flat logits greedy decoding would hinge on 1e-7 rounding and no two correct
implementations could agree token for token.
"""

from __future__ import annotations

from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog. ",
    "Paris is the capital of France; Berlin is the capital of Germany. ",
    "Numbers 0123456789 and symbols !?@#$%^&*() appear in text. ",
    "Grüße aus München, naïve café, 東京, Привет мир, emoji 🙂🚀. ",
    "def main():\n    return 42\n",
]


def build_tokenizer(vocab_size: int = 384):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    return tok


def save_tokenizer(path: Path, tok) -> None:
    import json

    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "chat_template": CHAT_TEMPLATE,
                "tokenizer_class": "PreTrainedTokenizerFast",
            }
        )
    )


def common_kwargs(vocab: int) -> dict:
    return dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        eos_token_id=2,
        bos_token_id=0,
        pad_token_id=0,
        tie_word_embeddings=False,
    )


def make_config(arch: str, vocab: int):
    import transformers as tf

    kw = common_kwargs(vocab)
    if arch == "llama":
        return tf.LlamaConfig(**kw, rope_theta=10000.0)
    if arch == "llama_draft":  # one layer, the same tokenizer: a draft model for every tiny target
        kw.update(num_hidden_layers=1)
        return tf.LlamaConfig(**kw, rope_theta=10000.0)
    if arch == "llama_odd_vocab":  # a vocabulary no tensor-parallel size divides: embedding replicated
        kw.update(vocab_size=vocab + 1)
        return tf.LlamaConfig(**kw, rope_theta=10000.0)
    if arch == "llama_256":  # every linear layer reads a multiple of 256 values: whole K-quant blocks
        kw.update(hidden_size=256, intermediate_size=512)
        return tf.LlamaConfig(**kw, rope_theta=10000.0)
    if arch == "llama3":  # llama3 rope scaling, tied embeddings, attention bias
        kw.update(tie_word_embeddings=True)
        return tf.LlamaConfig(
            **kw,
            attention_bias=True,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            rope_theta=500000.0,
        )
    if arch == "qwen2":
        return tf.Qwen2Config(**kw, rope_theta=1000000.0)
    if arch == "qwen2_odd":  # widths that are not multiples of 16 or 32: the kernels' scalar tails
        kw.update(hidden_size=72, intermediate_size=100, num_attention_heads=3, num_key_value_heads=1)
        return tf.Qwen2Config(**kw, rope_theta=1000000.0)
    if arch == "qwen3":
        return tf.Qwen3Config(**kw, head_dim=32)
    if arch == "qwen3_sliding":  # layer 1 attends to its last 24 positions: the hybrid KV cache's two groups
        return tf.Qwen3Config(**kw, head_dim=32, use_sliding_window=True, sliding_window=24, max_window_layers=1)
    if arch == "qwen3_moe":
        return tf.Qwen3MoeConfig(
            **kw,
            head_dim=16,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[1],
        )
    if arch == "qwen3_moe_all":  # experts in every layer, top-k renormalized: all llama.cpp's qwen3moe runs
        return tf.Qwen3MoeConfig(
            **kw,
            head_dim=16,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    if arch == "qwen3_moe_256":  # qwen3_moe_all with 256-value expert rows: whole K-quant blocks
        kw.update(hidden_size=256, intermediate_size=512)
        return tf.Qwen3MoeConfig(
            **kw,
            head_dim=64,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=256,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    if arch == "qwen3_moe_nonorm":
        kw.update(num_hidden_layers=3)
        return tf.Qwen3MoeConfig(
            **kw,
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=False,
            decoder_sparse_step=2,
            mlp_only_layers=[],
        )
    if arch in ("deepseek_v3", "deepseek_v3_qlora", "deepseek_v3_wide"):
        kw.update(num_key_value_heads=4, num_hidden_layers=3)
        extra = dict(q_lora_rank=24) if arch == "deepseek_v3_qlora" else dict(q_lora_rank=None)
        # wide: value heads of 32, so the absorbed products run csrc/head_bmm.cpp (N a multiple of 32)
        extra["v_head_dim"] = 32 if arch == "deepseek_v3_wide" else 16
        if arch == "deepseek_v3_qlora":
            extra["rope_scaling"] = {
                "rope_type": "yarn",
                "factor": 4.0,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "original_max_position_embeddings": 256,
                "beta_fast": 32,
                "beta_slow": 1,
            }
        return tf.DeepseekV3Config(
            **kw,
            moe_intermediate_size=32,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=4,
            topk_group=2,
            n_shared_experts=1,
            routed_scaling_factor=2.5,
            kv_lora_rank=32,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            first_k_dense_replace=1,
            norm_topk_prob=True,
            **extra,
        )
    if arch == "gpt_oss":
        # A 24-token window (not a whole number of 16-token blocks) that the 45..300-token test
        # prompts outrun; YaRN over an original context of 64, so these contexts interpolate.
        return tf.GptOssConfig(
            **{**kw, "intermediate_size": 32},
            head_dim=16,
            num_local_experts=8,
            num_experts_per_tok=2,
            sliding_window=24,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 16.0,  # max_position_embeddings 1024 / 64, as transformers expects
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 64,
            },
        )
    if arch == "gemma3":
        # Six layers in Gemma 3's 5:1 pattern, a 32-token window (the parity prompts reach 300
        # tokens), query_pre_attn_scalar apart from head_dim, linear x8 rope on the global layer,
        # its tied head and its final-logit softcapping (off in the real checkpoints; on here so
        # the test covers it).
        kw.update(num_hidden_layers=6, tie_word_embeddings=True)
        return tf.Gemma3TextConfig(
            **kw,
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=32,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            },
            final_logit_softcapping=30.0,
        )
    if arch in ("deepseek_v32", "glm_moe_dsa"):
        # index_topk 24 < the longer test prompts (45..300 tokens): most queries attend sparsely.
        # 32 index heads: a key scores exactly 0 when every head's ReLU is off, odds ~2^-32 here.
        # With 8 heads (odds 2^-8) a 201-token prompt had zero-score ties at the top-k edge of
        # queries whose head weights were mostly negative (zeros then outrank every key), and
        # torch.topk breaks ties by shape: tacit's padded batch and transformers' lone prompt
        # picked different keys, both correctly.
        kw.update(num_key_value_heads=4, num_hidden_layers=3)
        # GLM-5's layer 1 reuses layer 0's top-k (no indexer of its own); its indexer's rope is interleaved.
        glm = dict(indexer_types=["full", "shared", "full"]) if arch == "glm_moe_dsa" else {}
        return (tf.GlmMoeDsaConfig if arch == "glm_moe_dsa" else tf.DeepseekV32Config)(
            **kw,
            **glm,
            moe_intermediate_size=32,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=4,
            topk_group=2,
            n_shared_experts=1,
            routed_scaling_factor=2.5,
            kv_lora_rank=32,
            q_lora_rank=24,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
            first_k_dense_replace=1,
            norm_topk_prob=True,
            index_n_heads=32,
            index_head_dim=16,
            index_topk=24,
        )
    raise KeyError(arch)


def build_hf_model(arch: str, path: Path, seed: int = 0, std: float = 0.15):
    import transformers as tf

    path.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    cfg = make_config(arch, tok.get_vocab_size())
    cfg.initializer_range = std
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "e_score_correction_bias" in name:
                p.copy_(torch.randn_like(p) * 0.1)
            elif arch == "gpt_oss" and name.endswith(
                "experts.gate_up_proj"
            ):  # pre-activations past +-7: the clamp bites
                p.copy_(torch.randn_like(p) * 0.6)
            elif name.endswith("self_attn.sinks"):  # gpt-oss: sinks that take a real share of each softmax
                p.copy_(torch.randn_like(p))
            elif "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif p.dim() >= 1 and "bias" in name:
                p.copy_(0.05 * torch.randn_like(p))
    for name, buf in model.named_buffers():
        if "e_score_correction_bias" in name:
            buf.copy_(torch.randn_like(buf) * 0.1)
    model.eval()
    model.save_pretrained(path)
    save_tokenizer(path, tok)
    return model, tok
