"""A single .gguf file: metadata -> HF-style config, tensors -> HF names, tokenizer -> `tokenizers`.

Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K tensors come out still in their GGML blocks (kernels/ggml_quant.GGMLTensor):
a linear layer built for that type keeps them as they are, anything else dequantizes them as it
loads them; MoE expert stacks of those types come out whole (GGMLExpertStack, gguf_moe_import.py).
gpt-oss's names, keys and expert biases are gguf_gpt_oss.py's.
Tensors of other quantized types are dequantized here, with a message naming the type.
"""

from __future__ import annotations

import re
import struct
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

import tacit.loader.gguf_gpt_oss as gpt_oss
from tacit.kernels.ggml_quant import FP8_E4M3, GGML_TYPES, GGMLTensor
from tacit.loader.gguf_header import GGUFHeader
from tacit.loader.gguf_moe_import import MOE_ARCHS, STACK_PROJ, KVBJoiner, expert_tensors, moe_hf_config, yarn_extras
from tacit.loader.gguf_moe_names import K_B, MOE_LAYER, ROUTER_BIAS_GGUF, ROUTER_BIAS_HF, V_B
from tacit.loader.progress import progress
from tacit.model_config_checks import SIZE_LIMITS, check_size
from tacit.tokenizer import Tokenizer

_ARCHS = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    **MOE_ARCHS,
    gpt_oss.ARCH: gpt_oss.HF_ARCH,
}
_STACKED = {*MOE_ARCHS, gpt_oss.ARCH}  # archs whose experts come as [experts, rows, cols] stacks

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    **{gguf: hf for hf, gguf in MOE_LAYER.items()},
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# GGUF size keys (after the architecture prefix) -> the config.json key each becomes, whose limit
# applies; checked under the GGUF name, so the error names the field the file holds.
_SIZE_KEYS = {
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "context_length": "max_position_embeddings",
    "vocab_size": "vocab_size",
    "expert_count": "num_experts",
    "expert_used_count": "num_experts_per_tok",
    "expert_feed_forward_length": "moe_intermediate_size",
    "expert_shared_count": "n_shared_experts",
    "expert_group_count": "num_experts",
    "expert_group_used_count": "num_experts",
    "attention.q_lora_rank": "q_lora_rank",
    "attention.kv_lora_rank": "kv_lora_rank",
    "attention.key_length_mla": "head_dim",
    "attention.value_length_mla": "v_head_dim",
    "attention.value_length": "v_head_dim",
    "rope.dimension_count": "qk_rope_head_dim",
    "attention.sliding_window": "sliding_window",
}
_BLOCK = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")

# Pre-tokenizer regexes by `tokenizer.ggml.pre`, the split rules the original tokenizer.json had.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _open_header(path: Path) -> GGUFHeader:
    try:
        return GGUFHeader(path)
    except ValueError as e:
        if str(e).startswith(str(path)):
            raise
        raise ValueError(f"{path} is not a readable GGUF file: {e}") from None
    except (struct.error, UnicodeDecodeError, OverflowError, MemoryError) as e:
        raise ValueError(f"{path} is not a readable GGUF file: {e}") from None


class GGUFFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.header = _open_header(path)
        self.arch = self._field("general.architecture")
        if self.arch not in _ARCHS:
            raise ValueError(
                f"{path}: GGUF architecture {self.arch!r} is not supported; supported: {', '.join(sorted(_ARCHS))}"
            )

    def _field(self, key: str, default: Any = None) -> Any:
        value = self.header.fields.get(key)
        return default if value is None else value

    def _meta(self, key: str, default: Any = None) -> Any:
        return self._field(f"{self.arch}.{key}", default)

    def _size(self, key: str, default: int | None = None) -> int:
        """A size from the metadata, checked under its GGUF name (head_count 0 once ended in a
        ZeroDivisionError, block_count 4e9 in a hang); default None: the key is required."""
        value = self._meta(key)
        if value is None:
            if default is None:
                raise ValueError(f"{self.path}: GGUF metadata lacks {self.arch}.{key}")
            return default
        check_size(str(self.path), f"{self.arch}.{key}", value, SIZE_LIMITS.get(_SIZE_KEYS[key]))
        return int(value)

    def hf_config(self) -> dict[str, Any]:
        names = {t.name for t in self.header.tensors}
        heads = self._size("attention.head_count")
        hidden = self._size("embedding_length")
        tokens = self.header.fields.get("tokenizer.ggml.tokens")
        cfg: dict[str, Any] = {
            "architectures": [_ARCHS[self.arch]],
            "hidden_size": hidden,
            "intermediate_size": self._size("feed_forward_length"),
            "num_hidden_layers": self._size("block_count"),
            "num_attention_heads": heads,
            "num_key_value_heads": self._size("attention.head_count_kv", heads),
            "head_dim": self._size("attention.key_length", max(hidden // heads, 1)),
            "max_position_embeddings": self._size("context_length", 2048),
            "rms_norm_eps": float(self._meta("attention.layer_norm_rms_epsilon", 1e-6)),
            "rope_theta": float(self._meta("rope.freq_base", 10000.0)),
            "vocab_size": self._size("vocab_size", len(tokens) if tokens is not None else None),
            "tie_word_embeddings": "output.weight" not in names,
            "attention_bias": "blk.0.attn_q.bias" in names and self.arch == "llama",
        }
        scaling = self._meta("rope.scaling.type")
        if scaling and scaling != "none":
            cfg["rope_scaling"] = {
                "rope_type": scaling,
                "factor": float(self._meta("rope.scaling.factor", 1.0)),
                "original_max_position_embeddings": int(self._meta("rope.scaling.original_context_length", 0)),
            }
            if scaling == "yarn" and self.arch == "deepseek2":
                cfg["rope_scaling"].update(yarn_extras(self._meta))
        if self.arch in MOE_ARCHS:
            cfg.update(moe_hf_config(self.arch, str(self.path), self._meta, self._size, heads))
        if self.arch == gpt_oss.ARCH:
            cfg.update(gpt_oss.hf_config(self._meta, self._size, cfg.get("rope_scaling")))
        return cfg

    def eos_token_ids(self) -> list[int]:
        ids = [self._field(k) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")]
        return sorted({int(i) for i in ids if i is not None})

    def _unpermute(self, w: np.ndarray, heads: int) -> np.ndarray:
        # llama.cpp stores llama q/k rows interleaved for its rope kernel; undo it to HF's half split.
        shape = w.shape
        return w.reshape(heads, shape[0] // heads // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)

    def _hf_name(self, gguf_name: str) -> str | None:
        name = _GLOBAL_NAMES.get(gguf_name)
        if name is None:
            m = _BLOCK.match(gguf_name)
            if m is None:
                return None
            if f"{m.group(2)}.{m.group(3)}" == ROUTER_BIAS_GGUF:
                return f"model.layers.{m.group(1)}.{ROUTER_BIAS_HF}"
            if self.arch == gpt_oss.ARCH and m.group(2) == gpt_oss.SINKS:
                return f"model.layers.{m.group(1)}.self_attn.sinks"  # HF names the sinks without a suffix
            names = gpt_oss.LAYER_HF if self.arch == gpt_oss.ARCH else _LAYER_NAMES
            if m.group(2) not in names:
                return None
            name = f"model.layers.{m.group(1)}.{names[m.group(2)]}.{m.group(3)}"
        return name

    def quantized_weights(self) -> dict[str, int]:
        """{HF name: GGML type id} of the 2-D tensors `tensors()` yields as GGMLTensor and the
        expert stacks it yields as GGMLExpertStack (`...mlp.experts.{proj}.weight`), read from
        the header alone, so the model can build those layers for their type."""
        out = {}
        for t in self.header.tensors:
            if t.ggml_type not in GGML_TYPES:
                continue
            m = _BLOCK.match(t.name)
            stack = m is not None and m.group(2) in STACK_PROJ and m.group(3) == "weight"
            if stack and self.arch in _STACKED and len(t.shape) == 3:
                out[f"model.layers.{m.group(1)}.mlp.experts.{STACK_PROJ[m.group(2)]}.weight"] = t.ggml_type
                continue
            name = self._hf_name(t.name)
            if name is not None and len(t.shape) == 2:
                out[name] = t.ggml_type
        return out

    def tensors(self) -> Iterator[tuple[str, torch.Tensor | GGMLTensor]]:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        cfg = self.hf_config()
        dequantized: dict[str, int] = {}
        kv_b, biases = KVBJoiner(), gpt_oss.BiasJoiner()
        for t in progress(self.header.tensors, desc=f"loading {self.path.name}"):
            m = _BLOCK.match(t.name)
            if m is not None and m.group(2) in STACK_PROJ and m.group(3) == "bias" and self.arch == gpt_oss.ARCH:
                bias = dequantize(self.header.data(t), GGMLQuantizationType(t.ggml_type)).reshape(t.shape)
                joined = biases.add(m.group(1), m.group(2), torch.from_numpy(np.array(bias, dtype=np.float32)))
                if joined is not None:
                    yield joined
                continue
            if m is not None and m.group(2) in STACK_PROJ and self.arch in _STACKED:
                if t.ggml_type not in GGML_TYPES:
                    self._count_dequantized(t.ggml_type, dequantized)
                prefix = f"model.layers.{m.group(1)}.mlp"
                yield from expert_tensors(prefix, m.group(2), t.shape, t.ggml_type, self.header.data(t))
                continue
            if m is not None and m.group(2) in (K_B, V_B) and self.arch == "deepseek2":
                # kv_b_proj is read whole by MLA attention (dense_weight_linears): float.
                self._count_dequantized(t.ggml_type, dequantized)
                arr = dequantize(self.header.data(t), GGMLQuantizationType(t.ggml_type)).reshape(t.shape)
                joined = kv_b.add(m.group(1), m.group(2), torch.from_numpy(np.array(arr, dtype=np.float32)))
                if joined is not None:
                    yield joined
                continue
            name = self._hf_name(t.name)
            if name is None:
                continue
            shape, data = t.shape, self.header.data(t)
            qk = self.arch == "llama" and (".attn_q." in t.name or ".attn_k." in t.name)
            heads = cfg["num_attention_heads"] if ".attn_q." in t.name else cfg["num_key_value_heads"]
            if t.ggml_type in GGML_TYPES and len(shape) == 2:
                raw = data.reshape(shape[0], -1)
                if qk:  # a row permutation: GGML rows are whole blocks, so it moves raw rows as is
                    raw = self._unpermute(raw, heads)
                # A copy: the file is mapped read-only.
                yield name, GGMLTensor(torch.from_numpy(np.array(raw)), t.ggml_type, shape)
                continue
            qtype = GGMLQuantizationType(t.ggml_type)
            self._count_dequantized(t.ggml_type, dequantized)
            arr = dequantize(data, qtype).reshape(shape)
            if qk:
                arr = self._unpermute(arr.reshape(arr.shape[0], -1), heads).reshape(arr.shape)
            yield name, torch.from_numpy(np.array(arr, dtype=np.float32))  # a copy: the file is mapped read-only
        kv_b.check_done(str(self.path))
        biases.check_done(str(self.path))
        self.header.release_data()  # every tensor above was copied out of the mapping
        if dequantized:
            kinds = ", ".join(f"{k} ({n} tensors)" for k, n in sorted(dequantized.items()))
            native = ", ".join(t.name for t in GGML_TYPES.values() if t.id != FP8_E4M3)  # FP8: not a GGUF type
            print(
                f"tacit: {self.path.name}: {kinds} dequantized at load; native GGML kernels take {native}",
                file=sys.stderr,
            )

    @staticmethod
    def _count_dequantized(ggml_type: int, counts: dict[str, int]) -> None:
        from gguf import GGMLQuantizationType

        name = GGMLQuantizationType(ggml_type).name
        if name not in ("F32", "F16", "BF16"):
            counts[name] = counts.get(name, 0) + 1

    def tokenizer(self) -> Tokenizer:
        from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        model = self._field("tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(
                f"{self.path}: GGUF tokenizer model {model!r} is not supported yet; supported: gpt2 (byte-level BPE)"
            )
        tokens = self._field("tokenizer.ggml.tokens")
        types = self._field("tokenizer.ggml.token_type") or [1] * len(tokens)
        merges = [tuple(m.split(" ", 1)) for m in self._field("tokenizer.ggml.merges", [])]
        tok = HFTokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
        pre = self._field("tokenizer.ggml.pre", "default")
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if pre == "smollm":
            tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        elif pre in ("llama-bpe", "llama3", "qwen2"):
            split = pre_tokenizers.Split(Regex(_QWEN2_SPLIT if pre == "qwen2" else _LLAMA3_SPLIT), behavior="isolated")
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
            )
        else:
            tok.pre_tokenizer = byte_level
        tok.decoder = decoders.ByteLevel()
        # CONTROL (3) and USER_DEFINED (4) tokens are matched whole in text, never split by BPE.
        tok.add_special_tokens(
            [AddedToken(tokens[i], special=True, normalized=False) for i in range(len(tokens)) if types[i] == 3]
        )
        tok.add_tokens(
            [AddedToken(tokens[i], special=False, normalized=False) for i in range(len(tokens)) if types[i] == 4]
        )
        bos_id, eos_id = (
            self._field("tokenizer.ggml.bos_token_id"),
            self._field("tokenizer.ggml.eos_token_id"),
        )
        return Tokenizer(
            tok,
            self._field("tokenizer.chat_template"),
            tokens[bos_id] if bos_id is not None else None,
            tokens[eos_id] if eos_id is not None else None,
            add_bos_token=bool(self._field("tokenizer.ggml.add_bos_token", False)),
        )
