"""A tiny model written as an FP8 block-scaled checkpoint (DeepSeek-V3's format: float8_e4m3fn
weight, fp32 weight_scale_inv per [bn, bk] block), and the same model with those weights
replaced by the format's formula applied to the file's values (written here from the format's
description, independently of the loader), for the loader and TP tests."""

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tacit.loader import fp8_writer

BLOCK = (16, 32)  # small blocks so the tiny models' matrices hold several scales each


def formula(q: torch.Tensor, scale: torch.Tensor, block=BLOCK) -> torch.Tensor:
    """The format's definition: weight[n, k] = float(q[n, k]) * scale[n // bn, k // bk]."""
    bn, bk = block
    n, k = q.shape
    return q.float() * scale.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]


def write_fp8_checkpoint(src: Path, dst: Path, block=BLOCK) -> tuple[Path, Path]:
    """(the tiny model as a block-FP8 checkpoint, written by tacit's writer, the same model with
    those weights replaced by the formula's values of what the file holds, unquantized)."""
    fp8_writer.write_fp8_checkpoint(src, dst, block)
    ref = dst.with_name(dst.name + "_ref")
    shutil.copytree(src, ref)
    tensors = load_file(str(dst / "model.safetensors"))
    plain = {n: t for n, t in tensors.items() if not n.endswith(".weight_scale_inv")}
    for name, t in tensors.items():
        if t.dtype == torch.float8_e4m3fn:
            plain[name] = formula(t, tensors[name.removesuffix("weight") + "weight_scale_inv"], block)
    assert any(t.dtype == torch.float8_e4m3fn for t in tensors.values())
    save_file(plain, str(ref / "model.safetensors"))
    return dst, ref
