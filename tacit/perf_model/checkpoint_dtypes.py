"""Which weight format a Hugging Face checkpoint stores, read from its config.json's
quantization_config, and which tensors it leaves out: the lm_head's and MLA's kv_b_proj's dtype
follow the checkpoint (DeepSeek-V3's fp8 config excludes neither module, so kv_b_proj is stored
fp8; gpt-oss's MXFP4 config lists lm_head in modules_to_not_convert)."""

from __future__ import annotations

import re
from fnmatch import fnmatchcase


def _matches(name: str, patterns: list[str]) -> bool:
    """A module name against an exclusion list: compressed-tensors' "re:<regex>" entries, glob
    patterns (gpt-oss's "model.layers.*.self_attn" covers the modules under it) and plain names,
    which HF's quantizers match as substrings ("lm_head", "kv_b_proj")."""
    for p in patterns:
        if p.startswith("re:"):
            if re.match(p[3:], name):
                return True
        elif fnmatchcase(name, p) or fnmatchcase(name, p + ".*") or ("*" not in p and p in name):
            return True
    return False


def _compressed_tensors_format(quant: dict) -> str:
    """compressed-tensors' config_groups: the scheme of the group its Linear layers take."""
    groups = list((quant.get("config_groups") or {}).values())
    if not groups:
        return "compressed-tensors (no config_groups)"
    weights, acts = groups[0].get("weights") or {}, groups[0].get("input_activations")
    bits, kind, strategy = weights.get("num_bits"), weights.get("type"), weights.get("strategy")
    if bits == 8 and kind == "float":
        return "fp8" if strategy == "block" else "w8a8_fp8"
    if bits == 8 and kind == "int" and acts:
        return "w8a8_int8"
    if bits == 4 and kind == "int" and not acts:
        # symmetric: an fp16 scale a group (W4A16); with a zero point it stores what AWQ does
        return "w4a16" if weights.get("symmetric", True) else "awq"
    return f"compressed-tensors ({bits}-bit {kind}, {strategy})"


# llama.h's enum llama_ftype (a GGUF's general.file_type) and ggml.h's enum ggml_type (each
# tensor's), for the types dtypes.py prices; "" = unquantized (priced bf16)
LLAMA_FTYPES = {
    0: "",
    1: "",
    32: "",
    2: "q4_0",
    3: "q4_1",
    7: "q8_0",
    8: "q5_0",
    9: "q5_1",
    10: "q2_k",
    12: "q3_k_m",
    15: "q4_k_m",
    17: "q5_k_m",
    18: "q6_k",
    30: "iq4_xs",
    38: "q8_0",  # MXFP4_MOE: the experts MXFP4, every other tensor Q8_0 (llama-quant.cpp)
}
GGML_TYPE_NAMES = {
    0: "",
    1: "",
    30: "",
    2: "q4_0",
    3: "q4_1",
    6: "q5_0",
    7: "q5_1",
    8: "q8_0",
    10: "q2_k",
    11: "q3_k",
    12: "q4_k",
    13: "q5_k",
    14: "q6_k",
    23: "iq4_xs",
    39: "mxfp4",
}


def gguf_quantization(fields: dict, tensor_types: dict[str, int]) -> dict:
    """A GGUF file's types as a quantization_config checkpoint_dtypes reads: its general.file_type
    (absent in tacit's own gpt-oss files: unquantized but for MXFP4 experts), whether its experts
    are MXFP4, and the type its head is stored in (output.weight, else the tied token_embd)."""
    ftype = fields.get("general.file_type")
    fmt = "" if ftype is None else LLAMA_FTYPES.get(int(ftype), f"gguf file type {int(ftype)}")
    head = tensor_types.get("output.weight", tensor_types.get("token_embd.weight"))
    return {
        "quant_method": "gguf",
        "weights": fmt,
        "experts": "mxfp4" if 39 in tensor_types.values() else "",
        "head": GGML_TYPE_NAMES.get(head, "") if head is not None else "",
    }


def checkpoint_dtypes(quant: dict, layers: int) -> tuple[str, str, str, str]:
    """(the weights' format, the routed experts' where the checkpoint fixes them, the lm_head's,
    kv_b_proj's) of a quantization_config; "" where the tensor is stored as the rest of an
    unquantized model (bf16) or, for kv_b, in the format. A method tacit does not price comes back
    by name: --quantization auto then asks for one."""
    method = str(quant.get("quant_method") or "")
    if not method:
        return "", "", "", ""
    excluded = [
        *(quant.get("modules_to_not_convert") or []),
        *(quant.get("ignored_layers") or []),
        *(quant.get("ignore") or []),
    ]
    if method == "gguf":  # gguf_quantization's
        return quant["weights"], quant["experts"], quant["head"], ""
    if method == "fp8":  # HF's FineGrainedFP8 / DeepSeek's: block scales, else per-channel
        fmt = "fp8" if quant.get("weight_block_size") else "w8a8_fp8"
    elif method == "compressed-tensors":
        fmt = _compressed_tensors_format(quant)
    elif method in ("gptq", "awq") and int(quant.get("bits") or quant.get("w_bit") or 4) == 4:
        fmt = method
    elif method == "mxfp4":
        fmt = "mxfp4"
    else:
        fmt = method
    # The head: stored quantized only where the checkpoint says so. HF's fp8 and MXFP4 quantizers
    # keep the output embedding (get_keys_to_not_convert) as vLLM's fp8 does; GPTQ's "lm_head":
    # true quantizes it; compressed-tensors quantizes every Linear its ignore list leaves.
    if method == "compressed-tensors":
        head = "" if _matches("lm_head", excluded) else fmt
    elif method == "gptq":
        head = fmt if quant.get("lm_head") else ""
    else:
        head = ""
    kv_b_names = [f"model.layers.{i}.self_attn.kv_b_proj" for i in range(max(layers, 1))]
    kv_b = "bf16" if all(_matches(n, excluded) for n in kv_b_names) else ""
    return fmt, "mxfp4" if fmt == "mxfp4" else "", head, kv_b
