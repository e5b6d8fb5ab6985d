"""Bytes per stored value of weights and KV cache, scales included, as tacit lays them out."""

from __future__ import annotations

# Weights: per value, including the block's scale (and min).
WEIGHT_BYTES = {
    "bf16": 2.0,
    "fp16": 2.0,
    # fp8 e4m3 with a float32 scale per 128x128 block (DeepSeek-V3's layout): 1 + 4/16384
    "fp8": 1.0 + 4 / (128 * 128),
    # tacit's int8 is GGML Q8_0: 32 int8 values and one fp16 scale, 34 bytes per 32 values
    "int8": 34 / 32,
    # OCP MXFP4 (gpt-oss's experts, GGUF's MXFP4 type): 32 FP4 values in 16 bytes and one E8M0
    # scale byte, 17 bytes per 32 values = 4.25 bits a value
    "mxfp4": 17 / 32,
}
# int4 is GGML Q4_1: 16 bytes of nibbles, an fp16 scale and an fp16 min per group of g values
INT4_GROUP_SIZES = (32, 64, 128)

# The compute dtype whose peak a GEMM on these weights reaches: int8 and fp8 weights feed int8 /
# fp8 tensor units (W8A8, the serving engines' default for these types); int4 and mxfp4 are
# unpacked to 16 bits before the multiply (W4A16), so they run at the bf16 peak.
COMPUTE_DTYPE = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "int8": "int8", "int4": "bf16", "mxfp4": "bf16"}

WEIGHT_DTYPES = ("bf16", "fp16", "fp8", "int8", "int4", "mxfp4")
# Formats that exist for MoE experts only (tacit's MXFP4 kernels run the experts): with one of
# them as the weight dtype the other linear layers stay bf16, as gpt-oss's checkpoint keeps them.
EXPERT_ONLY_DTYPES = ("mxfp4",)


def weight_dtypes_of(expert_dtype: str, weight_dtype: str) -> tuple[str, str]:
    """(the routed experts' dtype, every other quantized linear's): a checkpoint's fixed expert
    dtype (ModelShape.expert_weight_dtype) wins for the experts; an expert-only dtype leaves the
    other linears bf16."""
    experts = expert_dtype or weight_dtype
    return experts, "bf16" if weight_dtype in EXPERT_ONLY_DTYPES else weight_dtype


KV_DTYPES = ("bf16", "fp16", "fp8", "int8")


def weight_bytes_per_value(dtype: str, group_size: int = 32) -> float:
    if dtype == "int4":
        if group_size not in INT4_GROUP_SIZES:
            raise ValueError(f"int4 group size {group_size!r} is not supported; valid: {INT4_GROUP_SIZES}")
        return (group_size / 2 + 4) / group_size  # group 32: 20 bytes per 32 values = 0.625
    if dtype not in WEIGHT_BYTES:
        raise ValueError(f"weight dtype {dtype!r} is not known; valid: {', '.join(WEIGHT_DTYPES)}")
    return WEIGHT_BYTES[dtype]


def kv_bytes_per_row(dtype: str, width: int) -> float:
    """Bytes one token's row of `width` values takes in a cache of `dtype`.
    int8 (kernels/kv_quant.py): the values plus a float32 scale per token and head row."""
    if dtype in ("bf16", "fp16"):
        return 2.0 * width
    if dtype == "fp8":
        return 1.0 * width
    if dtype == "int8":
        return width + 4.0
    raise ValueError(f"kv cache dtype {dtype!r} is not known; valid: {', '.join(KV_DTYPES)}")


def normalize_dtype(name: str | None, default: str = "bf16") -> str:
    """CLI spellings (auto, none, bfloat16, float16) -> the short names above."""
    if name in (None, "", "auto", "none"):
        return default
    return {"bfloat16": "bf16", "float16": "fp16", "float8": "fp8", "fp8_e4m3": "fp8"}.get(name, name)
