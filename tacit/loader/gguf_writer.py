"""Write GGUF files: re-encode a GGUF at another precision, or convert an HF llama-family or MoE directory.

Used to hand llama.cpp the very weights tacit runs (bf16, not the source's Q4_1) so that
benchmark ratios compare engines, not quantizations.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

import tacit.loader.gguf_gpt_oss as gpt_oss
from tacit.loader.gguf_moe_export import MOE_ARCHS, check_exportable, moe_gguf_tensors, write_moe_metadata

_HF_ARCH = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    **MOE_ARCHS,
    gpt_oss.HF_ARCH: gpt_oss.ARCH,
}
_LAYER = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def _permute(x: np.ndarray, heads: int) -> np.ndarray:
    # llama.cpp's rope for arch "llama" wants q/k rows interleaved per head.
    return x.reshape(heads, 2, x.shape[0] // heads // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


def _add_tensor(writer: Any, name: str, arr: np.ndarray, bf16: bool, ggml_type: str | None = None) -> None:
    import gguf

    # Norms, biases (gpt-oss's expert biases are [experts, rows]) and the MoE router stay
    # float32, as llama.cpp's converter keeps them.
    matrix = arr.ndim >= 2 and not name.endswith(("ffn_gate_inp.weight", ".bias"))
    if ggml_type is not None and matrix:
        qtype = gguf.GGMLQuantizationType[ggml_type]
        block = gguf.GGML_QUANT_SIZES[qtype][0]
        if arr.shape[-1] % block:
            raise ValueError(f"{name}: rows of {arr.shape[-1]} values are not whole {block}-value {ggml_type} blocks")
        # Row-wise, so a 3-D expert stack quantizes as its experts' matrices would one by one.
        try:
            raw = gguf.quants.quantize(arr.astype(np.float32), qtype)
        except NotImplementedError:  # the gguf package dequantizes K-quants but cannot make them
            raise ValueError(
                f"{name}: the gguf package cannot quantize to {ggml_type} (Q8_0, Q4_0, Q4_1, Q5_0, MXFP4 it can)"
            ) from None
        writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
    elif bf16 and matrix:
        raw = gguf.quants.quantize(arr.astype(np.float32), gguf.GGMLQuantizationType.BF16)
        writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
    else:
        writer.add_tensor(name, arr.astype(np.float32))


def add_ggml_blocks(writer: Any, name: str, blocks: torch.Tensor, ggml_type: int) -> None:
    """Blocks already in `ggml_type`, uint8 [..., rows, row_bytes] (an HF checkpoint's MXFP4
    experts re-packed by loader/mxfp4_checkpoint.py), written as they are: no re-quantization, so
    the file holds the checkpoint's own values (llama.cpp's converter writes gpt-oss so)."""
    import gguf

    if blocks.dtype != torch.uint8 or blocks.dim() < 2:
        raise ValueError(
            f"{name}: GGML blocks are uint8 [..., rows, row_bytes]; got {blocks.dtype} {list(blocks.shape)}"
        )
    qtype = gguf.GGMLQuantizationType(ggml_type)
    type_size = gguf.GGML_QUANT_SIZES[qtype][1]
    if blocks.shape[-1] % type_size:
        raise ValueError(f"{name}: rows of {blocks.shape[-1]} bytes are not whole {qtype.name} blocks of {type_size}")
    writer.add_tensor(name, blocks.contiguous().numpy(), raw_dtype=qtype)


def reencode_gguf(src: Path, dst: Path, bf16: bool = True) -> Path:
    """Same metadata, every tensor dequantized (and stored as bf16 when 2-D)."""
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dst), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        arr = dequantize(t.data, t.tensor_type).reshape(tuple(int(d) for d in reversed(t.shape)))
        _add_tensor(writer, t.name, arr, bf16)
    _finish(writer)
    return dst


def export_hf_to_gguf(hf_dir: Path, dst: Path, bf16: bool = False, ggml_types: dict[str, str] | None = None) -> Path:
    """An HF llama/qwen2/qwen3/qwen3_moe/deepseek_v3/gpt_oss directory with a byte-level BPE tokenizer.json -> GGUF.

    ggml_types: {GGUF tensor-name suffix ("attn_q.weight", "ffn_up_exps.weight"; "" for every
    matrix): GGML type name ("Q4_1")}: those matrices (and expert stacks, row by row) are
    quantized, the longest suffix wins."""
    import gguf

    from tacit.loader.hf import iter_safetensors, read_json
    from tacit.tokenizer import Tokenizer

    cfg = read_json(hf_dir / "config.json")
    arch = _HF_ARCH.get((cfg.get("architectures") or [""])[0])
    if arch is None:
        raise ValueError(f"{hf_dir}: only {', '.join(_HF_ARCH)} export to GGUF")
    if arch in MOE_ARCHS.values():
        check_exportable(arch, cfg, str(hf_dir))
    if arch == gpt_oss.ARCH:
        gpt_oss.check_exportable(cfg, str(hf_dir))
    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    rope = cfg.get("rope_parameters") or {}
    w = gguf.GGUFWriter(str(dst), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg.get("max_position_embeddings", 2048))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    if arch in MOE_ARCHS.values():
        write_moe_metadata(w, arch, cfg)
    elif arch == gpt_oss.ARCH:
        gpt_oss.write_metadata(w, cfg)
    else:
        w.add_head_count_kv(kv_heads)
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_freq_base(float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))))
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_vocab_size(cfg["vocab_size"])

    tok = Tokenizer.from_hf_dir(hf_dir)
    model = json.loads(tok.tokenizer.to_str())["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"{hf_dir}: only byte-level BPE tokenizers export to GGUF")
    vocab = tok.tokenizer.get_vocab(with_added_tokens=True)
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    tokens += [f"[PAD{i}]" for i in range(len(tokens), cfg["vocab_size"])]
    specials = set(tok.special_ids)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials else 1 for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])])
    if tok.eos_token_id is not None:
        w.add_eos_token_id(tok.eos_token_id)
    if tok.bos_token_id is not None:
        w.add_bos_token_id(tok.bos_token_id)
    w.add_add_bos_token(False)
    if tok.chat_template:
        w.add_chat_template(tok.chat_template)

    items = iter_safetensors(hf_dir)
    if arch in MOE_ARCHS.values():
        items = moe_gguf_tensors(items, cfg, arch, _LAYER)
    elif arch == gpt_oss.ARCH:
        items = gpt_oss.gguf_tensors(items, cfg)
    for name, tensor in _hf_tensors(items, cfg):
        x = tensor.float().numpy()
        if name.startswith("blk."):
            if arch == "llama" and ".attn_q." in name:
                x = _permute(x, heads)
            elif arch == "llama" and ".attn_k." in name:
                x = _permute(x, kv_heads)
        _add_tensor(w, name, x, bf16, _type_for(name, ggml_types or {}))
    _finish(w)
    return dst


def _type_for(name: str, ggml_types: dict[str, str]) -> str | None:
    hits = [suffix for suffix in ggml_types if name.endswith(suffix)]
    return ggml_types[max(hits, key=len)] if hits else None


def _hf_tensors(items: Iterable[tuple[str, torch.Tensor]], cfg: dict) -> Iterable[tuple[str, torch.Tensor]]:
    for name, tensor in items:
        if name.startswith("blk."):  # already mapped (gguf_moe_export)
            yield name, tensor
            continue
        if name in _GLOBAL:
            if name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
                continue
            yield _GLOBAL[name], tensor
            continue
        parts = name.split(".")
        if len(parts) < 5 or parts[0] != "model" or parts[1] != "layers":
            continue
        inner = ".".join(parts[3:-1])
        if inner in _LAYER:
            yield f"blk.{parts[2]}.{_LAYER[inner]}.{parts[-1]}", tensor


def _finish(writer: Any) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
