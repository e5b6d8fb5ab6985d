"""Random-weight models of real shapes for benchmarks (`--model random:qwen3-100m`).

Speed depends on shapes, not on trained values, so a seeded random checkpoint of a named
shape gives every engine the same bytes to stream without downloading anything. Built once
with transformers (a benchmark dependency) into the cache.
"""

from __future__ import annotations

import json
from pathlib import Path

from tacit.loader.default_model import cache_dir

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
    name = spec.removeprefix("random:")
    if name not in SHAPES:
        raise ValueError(f"random model {name!r} is not known; valid: {', '.join('random:' + s for s in SHAPES)}")
    path = cache_dir() / f"random-{name}"
    if (path / "model.safetensors").exists():
        return path
    import torch
    import transformers

    shape = dict(SHAPES[name])
    cfg = getattr(transformers, shape.pop("arch"))(**shape, eos_token_id=shape["vocab_size"] - 1)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    _byte_level_tokenizer(shape["vocab_size"]).save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return path


def resolve_bench_model(model: str | None) -> str | None:
    return str(ensure_random_model(model)) if model and model.startswith("random:") else model
