"""Write a Hugging Face directory (config.json + model.safetensors) from a GGUF file.

The transformers peer gets the same dequantized weights tacit runs: transformers 5 would
otherwise keep a GGUF's blocks packed and dequantize inside every matmul, which measures a
different computation.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

_MODEL_TYPES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}


def gguf_to_hf_dir(gguf_path: Path, out: Path, dtype: torch.dtype) -> Path:
    from tacit.kernels.ggml_quant import GGMLTensor
    from tacit.loader.gguf_file import GGUFFile

    gguf = GGUFFile(gguf_path)
    cfg = gguf.hf_config()
    cfg["model_type"] = _MODEL_TYPES[cfg["architectures"][0]]
    cfg["eos_token_id"] = (gguf.eos_token_ids() or [None])[0]
    out.mkdir(parents=True, exist_ok=True)
    tensors = {
        name: (t.dequantize() if isinstance(t, GGMLTensor) else t).to(dtype).contiguous() for name, t in gguf.tensors()
    }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    # The GGUF's tokenizer too, so the directory is a model tacit (or transformers) opens alone.
    tok = gguf.tokenizer()
    tok.tokenizer.save(str(out / "tokenizer.json"))
    special = {"chat_template": tok.chat_template, "bos_token": tok.bos_token, "eos_token": tok.eos_token}
    (out / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in special.items() if v is not None}))
    return out
