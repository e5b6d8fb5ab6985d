"""ModelConfig: a model's architecture and how it is loaded (dtype, quantization, length)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from tacit.config.quantization import HF_QUANTIZATIONS, check_quantization, check_quantization_overrides
from tacit.model_config_checks import check_architecture_numbers

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


_KEY_ALIASES = [("num_experts", "num_local_experts"), ("n_routed_experts", "num_local_experts")]


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    name = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}.get(dtype, dtype)
    if name not in _DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; valid: {', '.join(_DTYPES)}")
    return _DTYPES[name]


def model_max_len(hf: dict[str, Any], max_model_len: int | None = None) -> int:
    """The max_model_len the engine resolves before its KV pool is sized: the user's, else the
    model's max_position_embeddings (2048 where its config has none). The scheduler's budget is
    resolved from this one (EngineArgs.create_scheduler_config: without chunked prefill it is
    raised to it); only the model's own is capped later, at the pool (fit_kv_capacity)."""
    return max_model_len or int(hf.get("max_position_embeddings") or 2048)


def normalize_rope(hf: dict[str, Any]) -> dict[str, Any]:
    """One rope dict whatever the checkpoint's era.

    Older configs say `rope_theta` + `rope_scaling`; transformers 5 writes `rope_parameters`.
    """
    params = dict(hf.get("rope_parameters") or {})
    scaling = hf.get("rope_scaling") or {}
    params.update({k: v for k, v in scaling.items() if k not in params})
    params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type") or params.get("type") or "default"
    params["rope_type"] = rope_type
    return params


def layer_sliding_windows(hf: dict[str, Any]) -> list[int | None]:
    """Each decoder layer's sliding window, None for full attention, as transformers reads a
    config: `layer_types` ("sliding_attention" layers attend to their last `sliding_window`
    positions); else, in Gemma 3 configs written before it, every `sliding_window_pattern`-th
    layer full and the others sliding; else, in Qwen2/Qwen3 configs, `use_sliding_window` on the
    layers from `max_window_layers` on. `use_sliding_window: false` outranks layer_types (it
    does in transformers' Qwen2/Qwen3)."""
    layers = int(hf["num_hidden_layers"])
    if hf.get("use_sliding_window") is False:
        return [None] * layers
    types = hf.get("layer_types")
    if types is not None:
        if len(types) != layers:
            raise ValueError(f"layer_types has {len(types)} entries; num_hidden_layers is {layers}")
        sliding = [t == "sliding_attention" for t in types]
    elif hf.get("sliding_window_pattern") or hf.get("_sliding_window_pattern"):
        pattern = int(hf.get("sliding_window_pattern") or hf["_sliding_window_pattern"])
        sliding = [(i + 1) % pattern != 0 for i in range(layers)]
    else:
        first = int(hf.get("max_window_layers") or 0)
        sliding = [bool(hf.get("use_sliding_window")) and i >= first for i in range(layers)]
    if not any(sliding):
        return [None] * layers
    window = hf.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ValueError(f"the config has sliding-window layers but sliding_window={window!r}; must be an integer >= 1")
    return [window if s else None for s in sliding]


@dataclass(frozen=True)
class ModelConfig:
    """A model's architecture, read from config.json (or GGUF metadata mapped onto the same keys).

    Frozen: __post_init__ fills in what derives from `hf` (object.__setattr__, at construction
    only); nothing changes it afterwards.
    """

    path: str
    hf: dict[str, Any]
    dtype: torch.dtype
    architecture: str = ""
    eos_token_ids: list[int] = field(default_factory=list)
    # 0: the model's max_position_embeddings, capped once the KV pool is sized (fit_kv_capacity).
    max_model_len: int = 0
    # GGUF weights in GGML blocks: "auto" keeps them where the CPU kernels run, "gguf" always,
    # "none" dequantizes them at load (models/quantization.py keeps_ggml_weights). "int8" / "int4"
    # quantize a Hugging Face checkpoint's linear weights at load (models/quantize_at_load.py).
    quantization: str = "auto"
    # Values of a row per int4 scale and min or per int8 scale (32, 64 or 128); None: int4 groups
    # of 32, int8 one scale per output channel (quantize_at_load.group_size_of).
    quantization_group_size: int | None = None
    # {fnmatch pattern over HF module names: none | int8 | int4}, first match wins: a type per
    # layer of a Hugging Face checkpoint quantized at load, over `quantization`'s.
    quantization_overrides: dict[str, str] = field(default_factory=dict)
    # Bytes of memory for MoE expert weights, which then stay in the checkpoint and are read
    # into this cache as steps need them (memory/expert_cache.py); None: every expert resident.
    expert_cache_memory: int | None = None
    # tacit's AVX512-BF16 CPU kernels for this engine (kernels/cpu_kernels.py); False: torch everywhere.
    cpu_kernels: bool = True
    # GGML decode rows against bf16 activations (the dequantized model's arithmetic) rather than
    # int8-rounded ones (llama.cpp's; csrc/ggml_gemv.h).
    ggml_bf16_activations: bool = False
    # The tokenizer directory when not the model's (--tokenizer): tensor-parallel workers open it too.
    tokenizer: str | None = None
    rope: dict[str, Any] = field(init=False)
    # True when max_model_len came from the model rather than the user: only then is it capped.
    max_model_len_derived: bool = field(init=False)

    def __post_init__(self) -> None:
        check_quantization(self.quantization, self.quantization_group_size)
        if self.quantization in HF_QUANTIZATIONS and str(self.path).endswith(".gguf"):
            raise ValueError(
                f"quantization={self.quantization!r}: int8/int4 quantize a Hugging Face checkpoint at load; "
                f"a GGUF's weights are already quantized: use auto|gguf|none"
            )
        check_quantization_overrides(self.quantization_overrides)
        if self.expert_cache_memory is not None:
            if isinstance(self.expert_cache_memory, bool) or not isinstance(self.expert_cache_memory, int):
                raise ValueError(f"expert_cache_memory={self.expert_cache_memory!r} is invalid: must be a byte count")
            if self.expert_cache_memory <= 0:
                raise ValueError(f"expert_cache_memory={self.expert_cache_memory!r} is invalid: must be > 0 bytes")
            if str(self.path).endswith(".gguf") or self.quantization in HF_QUANTIZATIONS:
                raise ValueError(
                    "expert_cache_memory streams experts from an unquantized safetensors checkpoint; "
                    f"{self.path} with quantization={self.quantization!r} is not one"
                )
        # A copy, so the caller's dict (a recipe's, a CLI's) cannot change a built config.
        object.__setattr__(self, "quantization_overrides", dict(self.quantization_overrides))
        if self.quantization_overrides and (str(self.path).endswith(".gguf") or self.quantization == "gguf"):
            raise ValueError(
                "quantization_overrides apply to a Hugging Face checkpoint quantized at load; a GGUF's tensor "
                "types are fixed by the file (re-quantize it with llama.cpp's --tensor-type to change them)"
            )
        check_architecture_numbers(self.path, self.hf)
        hf = dict(self.hf)
        # transformers 5 writes some keys under their attribute-map alias; real checkpoints use the originals.
        for original, alias in _KEY_ALIASES:
            if hf.get(original) is None and hf.get(alias) is not None:
                hf[original] = hf[alias]
        object.__setattr__(self, "hf", hf)
        archs = hf.get("architectures") or []
        if not self.architecture:
            if not archs:
                raise ValueError(f"{self.path}: config has no 'architectures' entry; cannot tell which model this is")
            object.__setattr__(self, "architecture", archs[0])
        object.__setattr__(self, "rope", normalize_rope(hf))
        limit = model_max_len(hf)
        object.__setattr__(self, "max_model_len_derived", not self.max_model_len)
        if not self.max_model_len:
            object.__setattr__(self, "max_model_len", limit)
        elif self.max_model_len > limit and self.rope["rope_type"] == "default":
            raise ValueError(f"max_model_len={self.max_model_len} exceeds the model's max_position_embeddings={limit}")

    def get(self, key: str, default: Any = None) -> Any:
        value = self.hf.get(key, default)
        return default if value is None else value

    @property
    def max_position_embeddings(self) -> int:
        return model_max_len(self.hf)

    @property
    def num_layers(self) -> int:
        return int(self.hf["num_hidden_layers"])

    def sliding_window_of(self, layer: int) -> int | None:
        """The sliding window of decoder layer `layer`, None for full attention
        (layer_sliding_windows)."""
        return layer_sliding_windows(self.hf)[layer]

    @property
    def head_dim(self) -> int:
        return int(self.get("head_dim") or self.hf["hidden_size"] // self.hf["num_attention_heads"])

    @property
    def num_kv_heads(self) -> int:
        return int(self.get("num_key_value_heads", self.hf["num_attention_heads"]))
