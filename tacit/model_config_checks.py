"""Sanity checks on a checkpoint's architecture numbers, before anything is built or allocated.

A corrupt or hostile config.json (or GGUF metadata) used to hang the loader (num_hidden_layers
1e9 builds a billion modules), try a 196 TB allocation (hidden_size 1e9), or end in a traceback
(a string, zero or a negative where a size goes). Each field is checked here for type and range,
and the error names the file, the field and what is valid.
"""

from __future__ import annotations

from numbers import Integral
from typing import Any

# field -> largest value accepted. Generous against every public model (DeepSeek-V3: 61 layers,
# hidden 7168, 256 experts; Llama 3.1 405B: 126 layers, hidden 16384; vocabularies up to ~260k;
# contexts up to 10M tokens); far below what would exhaust memory just building the model.
SIZE_LIMITS: dict[str, int] = {
    "hidden_size": 1 << 17,
    "intermediate_size": 1 << 20,
    "moe_intermediate_size": 1 << 20,
    "num_hidden_layers": 1024,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "head_dim": 4096,
    "vocab_size": 1 << 24,
    "num_experts": 4096,
    "num_local_experts": 4096,
    "n_routed_experts": 4096,
    "num_experts_per_tok": 4096,
    "n_shared_experts": 64,
    "kv_lora_rank": 1 << 16,
    "q_lora_rank": 1 << 16,
    "qk_rope_head_dim": 4096,
    "qk_nope_head_dim": 4096,
    "v_head_dim": 4096,
}
# Sizes with no upper limit of their own. max_position_embeddings allocates nothing: the engine
# caps the max_model_len it derives from it at the tokens its KV cache holds
# (EngineConfig.fit_kv_capacity), so 10**12 costs nothing and serves what memory allows.
UNBOUNDED = ("max_position_embeddings",)
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


def check_required_sizes(path: str, hf: dict[str, Any]) -> None:
    """Called once the architecture is known to be supported (an unsupported one is the more
    useful error), before the model is built."""
    missing = [k for k in REQUIRED if hf.get(k) is None]
    if missing:
        raise ValueError(f"{path}: the model config lacks {', '.join(missing)}")


def check_size(path: str, field: str, value: Any, limit: int | None) -> None:
    """One size: a positive integer (a bool, a float like 1e9 or a string is refused), at most limit."""
    if not isinstance(value, Integral) or isinstance(value, bool) or value < 1 or (limit is not None and value > limit):
        valid = "an integer >= 1" if limit is None else f"an integer in [1, {limit}]"
        raise ValueError(f"{path}: {field}={value!r} is invalid: must be {valid}")


def check_architecture_numbers(path: str, hf: Any) -> None:
    """Type and range of every size the config gives (absent ones are checked later)."""
    if not isinstance(hf, dict):
        raise ValueError(f"{path}: the model config must be a JSON object of settings, got {type(hf).__name__}")
    for key, limit in [*SIZE_LIMITS.items(), *((k, None) for k in UNBOUNDED)]:
        if hf.get(key) is not None:
            check_size(path, key, hf[key], limit)
    heads = hf.get("num_attention_heads")
    if heads is None:
        return
    kv_heads = hf.get("num_key_value_heads") or heads
    if heads % kv_heads:
        raise ValueError(f"{path}: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    if hf.get("head_dim") is None and hf.get("hidden_size") is not None and hf["hidden_size"] % heads:
        raise ValueError(
            f"{path}: hidden_size={hf['hidden_size']} is not a multiple of num_attention_heads={heads} "
            f"and the config gives no head_dim"
        )
