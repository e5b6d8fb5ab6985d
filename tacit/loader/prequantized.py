"""Hugging Face checkpoints already quantized: 4 bits by GPTQ or AWQ (here), FP8 block-scaled
(loader/fp8_checkpoint.py), or gpt-oss's MXFP4 experts (loader/mxfp4_checkpoint.py). GPTQ and AWQ layers are converted at load into Q4_1 blocks, which the GGML kernels, the fused decode step and the prefill path run as they
run a GGUF's (one implementation of a quantized matmul; see kernels/weight_quant.py).

Both store, per linear layer `p`, p.qweight (int32, eight 4-bit values each), p.qzeros (int32,
eight 4-bit zero points each), p.scales (fp16 [K / g, N]) for in_features K, out_features N,
group size g; weight[n, k] = (q[k, n] - zero[k // g, n]) * scale[k // g, n].

  GPTQ: qweight [K / 8, N] packed along K: value k = 8i + j is bits 4j..4j+3 of qweight[i];
        qzeros [K / g, N / 8] packed along N the same way. AutoGPTQ's v1 format (the default
        checkpoint_format "gptq") stores zero - 1; "gptq_v2" stores the zero itself.
        desc_act (act-order) permutes K by g_idx: refused, since blocks need contiguous groups.
  AWQ (GEMM version): qweight [K, N / 8] packed along N, value n = 8c + AWQ_ORDER[i] in bits
        4i..4i+3 of column c; qzeros [K / g, N / 8] likewise; no offset.

Q4_1 holds value = d * q + m per 32-value block, so each block of a group gets d = scale and
m = -zero * scale. d is exact (the scales are fp16); m is rounded to fp16, an error of at most
2^-11 |zero * scale| <= scale / 128 per weight (zero <= 16), a 128th of the 4-bit step.

Tensors stream one at a time; a layer's three tensors are held until the last arrives, then
yielded as one GGMLTensor named `p.weight` (g_idx is dropped: without desc_act it is k // g).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open

from tacit.kernels.ggml_quant import QK, GGMLTensor
from tacit.kernels.weight_quant import Q4_1, pack_q4_1
from tacit.loader.fp8_checkpoint import check_fp8_config, fp8_converted, fp8_weight_names
from tacit.loader.mxfp4_checkpoint import mxfp4_converted, mxfp4_weight_names
from tacit.loader.safetensors_check import check_safetensors_file

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # bit slot i of a packed int32 holds column 8c + AWQ_ORDER[i]
_AWQ_UNORDER = tuple(AWQ_ORDER.index(n) for n in range(8))  # column n's bit slot: (0, 4, 1, 5, 2, 6, 3, 7)
_PARTS = ("qweight", "qzeros", "scales")
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


def quant_method(path: Path, config: dict) -> str | None:
    """ "gptq", "awq", "fp8" or "mxfp4" for a checkpoint tacit converts; None for an unquantized one; a
    ValueError naming the setting for any other quantization_config."""
    qc = config.get("quantization_config")
    if qc is None:
        return None
    where = f"{path}/config.json quantization_config"
    if not isinstance(qc, dict):
        raise ValueError(f"{where} is not an object")
    method = str(qc.get("quant_method", "")).lower()
    if method == "fp8":
        check_fp8_config(qc, where)
        return method
    if method == "mxfp4":  # nothing to choose: 32-value blocks, E8M0 scales, E2M1 values
        return method
    if method not in ("gptq", "awq"):
        raise ValueError(
            f"{where}: quant_method {method!r} is not supported; tacit loads gptq and awq (4-bit), fp8 "
            "(block-scaled e4m3) and mxfp4"
        )
    bits = qc.get("bits", qc.get("w_bit"))
    if bits != 4:
        raise ValueError(f"{where}: bits={bits!r}; tacit loads 4-bit {method} checkpoints only")
    if method == "gptq" and qc.get("desc_act"):
        raise ValueError(
            f"{where}: desc_act=true (act-order) is not supported: its groups are not contiguous "
            f"runs of in_features, which the Q4_1 blocks tacit converts to need"
        )
    if method == "awq" and str(qc.get("version", "gemm")).lower() != "gemm":
        raise ValueError(f"{where}: AWQ version {qc.get('version')!r} is not supported; tacit loads the gemm layout")
    if method == "awq" and qc.get("zero_point") is False:
        raise ValueError(f"{where}: zero_point=false (no qzeros) is not supported; tacit loads asymmetric AWQ")
    return method


def quantized_weight_names(files: list[Path], method: str) -> dict[str, int]:
    """{HF weight name: GGML type} of the layers `method` converts (headers only): Q4_1 for every
    layer whose qweight the shards hold, FP8_E4M3 for every fp8 weight with a scale, MXFP4 for
    every expert stack stored as _blocks and _scales."""
    if method == "fp8":
        return fp8_weight_names(files)
    if method == "mxfp4":
        keys = []
        for f in files:
            check_safetensors_file(f)
            with safe_open(str(f), framework="pt") as handle:
                keys.extend(handle.keys())
        return mxfp4_weight_names(keys)
    out = {}
    for f in files:
        check_safetensors_file(f)  # a lying or truncated header fails here, naming the file
        with safe_open(str(f), framework="pt") as handle:
            for key in handle.keys():
                if key.endswith(".qweight"):
                    out[key.removesuffix(".qweight") + ".weight"] = Q4_1
    return out


def _unpack(packed: torch.Tensor, dim: int) -> torch.Tensor:
    """int32 -> its eight 4-bit values (bit slot i = bits 4i..4i+3), spread along `dim` (0 or 1)."""
    packed = packed.to(torch.int32)
    if dim == 0:  # [R, C] -> [R, 8, C] -> [8R, C]
        q = (packed.unsqueeze(1) >> _SHIFTS.view(1, 8, 1)) & 0xF
        return q.reshape(-1, packed.shape[1])
    q = (packed.unsqueeze(2) >> _SHIFTS.view(1, 1, 8)) & 0xF  # [R, C, 8]
    return q.reshape(packed.shape[0], -1)


def unpack_gptq(qweight: torch.Tensor, qzeros: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [K, N], stored zeros [K / g, N]) as int32, offsets not applied."""
    return _unpack(qweight, 0), _unpack(qzeros, 1)


def unpack_awq(qweight: torch.Tensor, qzeros: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [K, N], zeros [K / g, N]) as int32, columns back in order."""

    def unorder(t: torch.Tensor) -> torch.Tensor:
        rows = t.shape[0]
        return t.reshape(rows, -1, 8)[..., list(_AWQ_UNORDER)].reshape(rows, -1)

    return unorder(_unpack(qweight, 1)), unorder(_unpack(qzeros, 1))


def to_q4_1(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, name: str) -> GGMLTensor:
    """q [K, N] in 0..15, zeros and scales [K / g, N] -> Q4_1 blocks of the [N, K] weight
    (q - zero) * scale."""
    k, n = q.shape
    groups = scales.shape[0]
    if k % groups or tuple(scales.shape) != (groups, n) or tuple(zeros.shape) != (groups, n):
        raise ValueError(
            f"{name}: qweight holds [{k}, {n}], scales {tuple(scales.shape)}, qzeros {tuple(zeros.shape)}; "
            f"they disagree"
        )
    if (k // groups) % QK:
        raise ValueError(f"{name}: group size {k // groups} is not a multiple of {QK}; Q4_1 blocks need whole groups")
    s = scales.to(torch.float16)
    m = (-zeros.float() * s.float()).to(torch.float16)
    return GGMLTensor(pack_q4_1(q.T.to(torch.uint8).contiguous(), s.T.contiguous(), m.T.contiguous()), Q4_1, (n, k))


def convert(method: str, parts: dict[str, torch.Tensor], zero_offset: int, name: str) -> GGMLTensor:
    if method == "gptq":
        q, zeros = unpack_gptq(parts["qweight"], parts["qzeros"])
        zeros = zeros + zero_offset
    else:
        q, zeros = unpack_awq(parts["qweight"], parts["qzeros"])
    return to_q4_1(q, zeros, parts["scales"], name)


def converted_weights(
    tensors: Iterator[tuple[str, torch.Tensor]], method: str, config: dict
) -> Iterator[tuple[str, torch.Tensor | GGMLTensor]]:
    """The checkpoint's tensors with each layer's qweight/qzeros/scales (fp8: weight and
    weight_scale_inv) yielded as one GGMLTensor named `<layer>.weight`, as soon as its last part
    streams by."""
    qc = config["quantization_config"]
    if method == "fp8":
        yield from fp8_converted(tensors, tuple(qc["weight_block_size"]))
        return
    if method == "mxfp4":
        yield from mxfp4_converted(tensors)
        return
    # AutoGPTQ v1 stores zero - 1 (its "zero point offset"); gptq_v2 (GPTQModel) the zero itself.
    offset = 1 if method == "gptq" and str(qc.get("checkpoint_format", "gptq")).lower() != "gptq_v2" else 0
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors:
        prefix, _, part = name.rpartition(".")
        if part == "g_idx":
            continue
        if part not in _PARTS:
            yield name, tensor
            continue
        parts = pending.setdefault(prefix, {})
        parts[part] = tensor
        if len(parts) == len(_PARTS):
            del pending[prefix]
            yield f"{prefix}.weight", convert(method, parts, offset, prefix)
    if pending:
        missing = [f"{p}.{part}" for p, parts in pending.items() for part in _PARTS if part not in parts]
        raise ValueError(f"{method} checkpoint is missing {', '.join(missing[:8])}")
