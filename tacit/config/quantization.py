"""The quantization settings a model is loaded with: which, how coarse, and per-layer overrides."""

from __future__ import annotations

from typing import Any

from tacit.kernels.weight_quant import GROUP_SIZES

# auto | gguf | none: what happens to a GGUF's GGML blocks. int8 | int4: a Hugging Face
# checkpoint's linear weights quantized at load (kernels/weight_quant.py).
QUANTIZATIONS = ("auto", "gguf", "none", "int8", "int4")
HF_QUANTIZATIONS = ("int8", "int4")


def check_quantization(value: str, group_size: int | None = None) -> None:
    if value not in QUANTIZATIONS:
        raise ValueError(
            f"quantization={value!r} is not supported; valid: {', '.join(QUANTIZATIONS)} "
            f"(auto|gguf|none: a GGUF's quantized weights; int8|int4: quantize a Hugging Face checkpoint at load)"
        )
    if group_size is not None and (group_size not in GROUP_SIZES or isinstance(group_size, bool)):
        raise ValueError(
            f"quantization_group_size={group_size!r} is not supported; valid: "
            f"{', '.join(map(str, GROUP_SIZES))} (values of a row per int4 scale and min or per int8 scale), "
            f"or unset (int4: 32; int8: one scale per output channel)"
        )


# --quantization-overrides: a layer's type, whatever --quantization says (none: the model's dtype).
QUANTIZATION_OVERRIDE_TYPES = ("none", "int8", "int4")


def check_quantization_overrides(overrides: Any) -> None:
    """{fnmatch pattern over HF module names: none | int8 | int4}; which layers each pattern
    matches is checked against the model (models/quantize_at_load.py)."""
    if not isinstance(overrides, dict):
        raise ValueError(
            f"quantization_overrides={overrides!r} is invalid: must be a mapping of pattern to type, "
            f"e.g. {{'*.down_proj': 'int8'}}"
        )
    for pattern, qtype in overrides.items():
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"quantization_overrides: pattern {pattern!r} is invalid: must be a non-empty string")
        if qtype not in QUANTIZATION_OVERRIDE_TYPES:
            raise ValueError(
                f"quantization_overrides[{pattern!r}]={qtype!r} is not a type; valid: "
                f"{', '.join(QUANTIZATION_OVERRIDE_TYPES)}"
            )


def parse_quantization_overrides(spec: str) -> dict[str, str]:
    """'*.o_proj=int8,lm_head=int8' -> {'*.o_proj': 'int8', 'lm_head': 'int8'}, in order (the
    CLI's --quantization-overrides)."""
    overrides: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in spec.split(","))):
        pattern, sep, qtype = pair.rpartition("=")
        if not sep or not pattern.strip():
            raise ValueError(
                f"--quantization-overrides {spec!r} is invalid at {pair!r}; write PATTERN=TYPE pairs separated "
                f"by commas, e.g. '*.o_proj=int8,*.down_proj=int8,lm_head=int8'"
            )
        overrides.setdefault(pattern.strip(), qtype.strip())  # first match wins: a repeat never would
    check_quantization_overrides(overrides)
    return overrides
