"""Precision: each weight format's bytes per stored value (scales included) and the dtype its
GEMMs multiply in, the activation dtype, the KV cache's bytes, and which tensors of a checkpoint
take which format (TensorDtypes)."""

from __future__ import annotations

from dataclasses import dataclass

from tacit.perf_model.ggml_mixes import GGML_BLOCKS, GGML_MIXES, GGML_TYPES, ggml_bytes_per_value

# An 8-bit weight with one float32 scale per output channel (W8A8 per-channel) carries 4 bytes a
# row of K values; priced at a 4096-wide row where the GEMM's K is not known (memory): 0.1%.
NOMINAL_ROW = 4096


@dataclass(frozen=True)
class WeightFormat:
    # bytes of a group of `per` values, scales and zeros included: bytes per value = nbytes / per
    # (per = 0: one float32 scale per output channel, 1 + 4/K bytes a value)
    nbytes: float
    per: int
    # the dtype the weights enter the multiply in: fp8 / int8 where tensor units take them as
    # stored; "16" where a kernel widens them first to the activations' 16-bit dtype
    weight_compute: str
    # the activation dtype the serving engines pair it with (--activation-dtype auto)
    usual_activation: str
    # whether the kernels read activations stored in an 8-bit activation dtype (a per-token
    # quantize kernel writes them: vLLM/SGLang W8A8, llama.cpp's src1 in q8 blocks), not bf16
    # rows rounded in registers (tacit's own GGML GEMVs: kernels/csrc/ggml_int8_activations.h)
    stores_activations: bool = True


# int4 (tacit's own) is GGML Q4_1: 16 bytes of nibbles, an fp16 scale and an fp16 min per group
INT4_GROUP_SIZES = (32, 64, 128)
FORMATS = {
    "bf16": WeightFormat(2, 1, "bf16", "bf16"),
    # float32: what tacit's CPU engine computes in where bf16 has no oneDNN matmul (an AVX2-only
    # CPU: platforms/cpu.py's default_dtype), weights and activations alike
    "fp32": WeightFormat(4, 1, "fp32", "fp32"),
    "fp16": WeightFormat(2, 1, "fp16", "fp16"),
    # fp8 e4m3 with a float32 scale per 128x128 block (DeepSeek-V3's checkpoint): 1 + 4/16384.
    # Activations: fp8 per-token groups of 128 on parts with fp8 units (W8A8); elsewhere bf16,
    # the weights widened in the kernel (vLLM's Marlin W8A16 on an A100): activation_dtype()
    "fp8": WeightFormat(128 * 128 + 4, 128 * 128, "fp8", "fp8"),
    # 8-bit with a float32 scale per output channel, activations quantized per token (vLLM's fp8
    # per-channel; SGLang's w8a8_fp8 / w8a8_int8, compressed-tensors' W8A8)
    "w8a8_fp8": WeightFormat(4, 0, "fp8", "fp8"),
    "w8a8_int8": WeightFormat(4, 0, "int8", "int8"),
    # tacit's own int8 is GGML Q8_0 (its CPU kernels' format): 32 int8 values and an fp16 scale,
    # multiplied in int8 against activations rounded in registers
    "int8": WeightFormat(34, 32, "int8", "int8", stores_activations=False),
    "int4": WeightFormat(20, 32, "16", "bf16", stores_activations=False),  # group 32; weight_bytes_per_value
    # int4 in groups of 128, widened to fp16 in the kernel (Marlin / Machete W4A16):
    # compressed-tensors W4A16 is symmetric, an fp16 scale a group: 64 + 2 bytes per 128 values;
    # AutoAWQ and GPTQ add a zero point a group, packed 4 bits (qzeros: 8 a int32): 64 + 2 + 0.5
    "w4a16": WeightFormat(64 + 2, 128, "16", "fp16"),
    "awq": WeightFormat(64 + 2 + 0.5, 128, "16", "fp16"),
    "gptq": WeightFormat(64 + 2 + 0.5, 128, "16", "fp16"),
    # OCP MXFP4 (gpt-oss's experts, GGUF's MXFP4 type): 32 FP4 values in 16 bytes and one E8M0
    # scale byte, 17 bytes per 32 values = 4.25 bits a value; widened to bf16 (no fp4 units before
    # Blackwell)
    "mxfp4": WeightFormat(17, 32, "16", "bf16"),
    # llama.cpp's types: int8 dot products against activations it quantizes to q8_0 / q8_1 /
    # q8_K blocks in its work buffer (ggml-cpu's vec_dot_type; the CUDA MMQ kernels the same)
    **{g: WeightFormat(*GGML_BLOCKS[g], "int8", "int8") for g in GGML_BLOCKS},
    **{m: WeightFormat(*GGML_BLOCKS[GGML_MIXES[m]["default"]], "int8", "int8") for m in GGML_MIXES},
}
WEIGHT_DTYPES = tuple(FORMATS)
# Formats that exist for MoE experts only (tacit's MXFP4 kernels run the experts): with one of
# them as the weight dtype the other linear layers stay bf16, as gpt-oss's checkpoint keeps them.
EXPERT_ONLY_DTYPES = ("mxfp4",)
# Formats tacit's own engine quantizes to at load (models/quantize_at_load.py): it keeps the
# linears it reads directly (DeepSeek's absorbed kv_b_proj, routers) in bf16.
TACIT_LOAD_FORMATS = ("int8", "int4")
KV_DTYPES = ("bf16", "fp16", "fp8", "int8", "fp32")
ACTIVATION_DTYPES = ("auto", "bf16", "fp16", "fp8", "int8", "fp32")
ACTIVATION_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "fp32": 4}
# Unquantized formats: an engine keeps its lm_head (and every other linear) in these as loaded
FLOAT_FORMATS = ("bf16", "fp16", "fp32")


def _check_format(dtype: str) -> WeightFormat:
    if dtype not in FORMATS:
        raise ValueError(f"weight dtype {dtype!r} is not known; valid: {', '.join(WEIGHT_DTYPES)}")
    return FORMATS[dtype]


def weight_bytes_per_value(dtype: str, group_size: int = 32, role: str = "", layers: int = 1, row: int = 0) -> float:
    """Bytes a stored weight value takes, scales included. int4: tacit's Q4_1 in `group_size`
    groups. A GGML file type that mixes block types (q4_k_m) prices `role`'s tensors (ggml_mixes:
    attn_v, attn_output, ffn_down, output; "" = the default type) over `layers` layers. Per-channel
    formats: one float32 scale a `row` of K values (0: NOMINAL_ROW)."""
    fmt = _check_format(dtype)
    if dtype == "int4":
        if group_size not in INT4_GROUP_SIZES:
            raise ValueError(f"int4 group size {group_size!r} is not known; valid: {INT4_GROUP_SIZES}")
        return (group_size / 2 + 4) / group_size  # group 32: 20 bytes per 32 values = 0.625
    if dtype in GGML_TYPES:
        return ggml_bytes_per_value(dtype, role or "default", layers)
    if fmt.per == 0:
        return 1 + fmt.nbytes / (row or NOMINAL_ROW)
    return fmt.nbytes / fmt.per


def activation_dtype(weight: str, requested: str = "auto", fp8_units: bool = True) -> str:
    """The dtype a GEMM's activations are in: `requested`, or (auto) the format's usual one; a
    block-fp8 checkpoint on a part without fp8 units runs W8A16 (bf16 activations). 8-bit
    activations need 8-bit-or-narrower weights: no kernel multiplies bf16 weights by fp8 rows."""
    fmt = _check_format(weight)
    if requested not in ACTIVATION_DTYPES:
        raise ValueError(f"activation dtype {requested!r} is not known; valid: {', '.join(ACTIVATION_DTYPES)}")
    act = fmt.usual_activation if requested == "auto" else requested
    if act == "fp8" and not fp8_units and requested == "auto":
        return "bf16"
    if ACTIVATION_BYTES[act] == 1:
        if fmt.weight_compute in ("bf16", "fp16"):
            raise ValueError(f"activation dtype {act} needs 8-bit or narrower weights; weights {weight} are 16-bit")
        if fmt.weight_compute in ("fp8", "int8") and fmt.weight_compute != act:
            raise ValueError(
                f"activation dtype {act} with {weight} weights ({fmt.weight_compute}) is no kernel's pairing; "
                f"valid: {fmt.weight_compute}, bf16, fp16"
            )
    return act


def gemm_compute_dtype(weight: str, act: str = "auto") -> str:
    """The dtype one GEMM over `weight` multiplies in when the model's quantized linears run at
    `act` activations: the narrower of the weights' and the activations', which for the pairings
    activation_dtype allows is the activations' (8-bit weights against 16-bit rows are widened,
    W8A16; widened 4-bit weights against int8 or fp8 rows multiply in 8 bits, W4A8). A 16-bit
    tensor kept beside them (the lm_head, an excluded kv_b) multiplies its own 16-bit rows.
    HardwareSpec.peak_flops then falls back to the 16-bit unit on a part without that one."""
    fmt = _check_format(weight)
    if fmt.weight_compute in ("bf16", "fp16"):
        return act if act in ("bf16", "fp16") else fmt.usual_activation
    return activation_dtype(weight, act)


def efficiency_dtype(weight: str) -> str:
    """The fitted GEMM curve a format without its own borrows: a dequantizing or integer kernel
    (int4, mxfp4, GGML types, W8A8 int8): int8's (tacit's GGML GEMVs); the rest, and a kernel's
    name (bmm), bf16's."""
    fmt = FORMATS.get(weight)
    return "int8" if fmt is not None and fmt.weight_compute in ("16", "int8") else "bf16"


def activation_bytes(weight: str, act: str = "auto") -> float:
    """Bytes a GEMM reads per input activation value: 1 where its kernel reads activations
    stored in an 8-bit dtype (the quantize kernel's output; its bf16 input is the previous op's
    output, already counted), else the 16-bit rows (2)."""
    act = gemm_compute_dtype(weight, act)
    return ACTIVATION_BYTES[act] if _check_format(weight).stores_activations else 2


def kv_bytes_per_row(dtype: str, width: int) -> float:
    """Bytes one token's row of `width` values takes in a cache of `dtype`.
    int8 (kernels/kv_quant.py): the values plus a float32 scale per token and head row."""
    if dtype in ("bf16", "fp16"):
        return 2.0 * width
    if dtype == "fp32":
        return 4.0 * width
    if dtype == "fp8":
        return 1.0 * width
    if dtype == "int8":
        return width + 4.0
    raise ValueError(f"kv cache dtype {dtype!r} is not known; valid: {', '.join(KV_DTYPES)}")


def normalize_dtype(name: str | None, default: str = "bf16") -> str:
    """CLI spellings (auto, none, bfloat16, float16, llama.cpp's Q4_K_M) -> the short names above."""
    if name in (None, "", "auto", "none"):
        return default
    name = name.lower()
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float8": "fp8", "fp8_e4m3": "fp8"}.get(
        name, name
    )


@dataclass(frozen=True)
class TensorDtypes:
    """The stored format of each kind of weight of one model: the linear layers, the routed
    experts, the lm_head, MLA's kv_b_proj and the embedding table."""

    linear: str
    experts: str
    head: str
    kv_b: str
    embedding: str = "bf16"


def weight_dtypes_of(expert_dtype: str, weight_dtype: str) -> tuple[str, str]:
    """(the routed experts' dtype, every other quantized linear's): a checkpoint's fixed expert
    dtype (ModelShape.expert_weight_dtype) wins for the experts; an expert-only dtype leaves the
    other linears bf16."""
    experts = expert_dtype or weight_dtype
    return experts, "bf16" if weight_dtype in EXPERT_ONLY_DTYPES else weight_dtype


def resolve_weight_format(requested: str, checkpoint: str) -> str:
    """--quantization's format: "auto" is the checkpoint's own (vLLM's default: the config's
    quantization_config), bf16 for an unquantized one; "none" prices the model unquantized."""
    if requested in ("", "auto"):
        if checkpoint and checkpoint not in FORMATS:
            raise ValueError(
                f"the checkpoint's quantization {checkpoint!r} is not one tacit prices; "
                f"pass --quantization, one of: {', '.join(WEIGHT_DTYPES)}"
            )
        return checkpoint or "bf16"
    name = normalize_dtype(requested)
    if name not in FORMATS:
        raise ValueError(f"--quantization {requested!r} is not known; valid: auto, {', '.join(WEIGHT_DTYPES)}")
    return name


def tensor_dtypes(
    weight: str,
    checkpoint: str = "",
    experts: str = "",
    head: str = "",
    kv_b: str = "",
    tied: bool = False,
    hidden: int = 0,
) -> TensorDtypes:
    """`weight`: the format priced (resolve_weight_format). The checkpoint's own format
    (`checkpoint`, "" unquantized) keeps its per-tensor choices: `head` the lm_head's stored
    format ("" = bf16, how HF's and DeepSeek's fp8 checkpoints keep it), `kv_b` MLA's kv_b_proj's
    ("" = the checkpoint's format; "bf16" where its quantization_config excludes it). Any other
    format prices the checkpoint as an engine quantizing it from bf16: every linear in that format
    except the lm_head, which tacit (quantize_at_load's _KEPT) and vLLM (ParallelLMHead takes no
    quant method) keep bf16, and, for tacit's own int8/int4, kv_b_proj (read directly:
    dense_weight_linears). A GGML file type follows llama.cpp's rules instead: the head, and a tied
    embedding, at Q6_K, or Q8_0 in a q8_0 file and where the `hidden` columns are no whole number of
    Q6_K's 256-value blocks (llama-quant.cpp's tensor_type_fallback: SmolLM2-135M's 576), an untied
    embedding in the default type; a GGUF file's own head is the type it stores."""
    _check_format(weight)
    own = bool(checkpoint) and weight == checkpoint
    expert_dt, linear = weight_dtypes_of(experts, weight)
    if weight in GGML_TYPES:
        head_dt = "q8_0" if weight == "q8_0" or hidden % 256 else "q6_k"
        head_dt = head if own and head else head_dt
        return TensorDtypes(linear, expert_dt, head_dt, linear, head_dt if tied else linear)
    if own:
        return TensorDtypes(linear, expert_dt, head or "bf16", kv_b or linear)
    # an engine running unquantized float32 (or fp16) keeps its head in that dtype too
    head_dt = weight if weight in FLOAT_FORMATS else "bf16"
    return TensorDtypes(linear, expert_dt, head_dt, "bf16" if weight in TACIT_LOAD_FORMATS else linear, head_dt)
