"""How much of the int8 KV cache's KLD in a bf16 model is the quantization, and how much is the
bf16 model reacting to any change of its keys and values at all.

    python scripts/kv_noise_floor.py [--model M] [--levels 127,2047,32767]

The model (bf16, bf16 KV cache) runs with every key and value row rounded to a symmetric grid of
L levels a side (scale max|row| / L, as kv_quant.quantize_rows does for L = 127) and stored back
in bf16; the reference is the same model with its cache in float32, which holds the same bf16
values unchanged (`--kv-cache-dtype float32`, KLD 0 against bf16 without the rounding). L = 127
is the int8 cache's rounding; L = 32767 moves a value by at most 1/65534 of its row's largest,
below bf16's own step for all but the row's smallest values, so its KLD is the floor any change
of K and V meets in this model. Scored as `tacit eval kld` scores (its default text and chunks),
on the torch attention backend's write path.
"""

from __future__ import annotations

import argparse

import torch

from tacit.config.engine_args import EngineArgs
from tacit.eval.kld import default_text, run_kld
from tacit.kernels import torch_attention


def round_rows(x: torch.Tensor, levels: int) -> torch.Tensor:
    xf = x.float()
    step = xf.abs().amax(dim=-1, keepdim=True) / levels
    step = torch.where(step == 0, torch.ones_like(step), step)
    return (torch.round(xf / step) * step).to(x.dtype)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    ap.add_argument("--levels", default="127,2047,32767")
    args = ap.parse_args()
    backend = torch_attention.TorchAttentionBackend
    plain_write = backend.write_kv
    levels = 0

    def rounded_write(self, kv_cache, key, value, meta):
        if kv_cache.dtype == torch.bfloat16:  # the model; the reference's cache is float32
            key, value = round_rows(key, levels), round_rows(value, levels)
        return plain_write(self, kv_cache, key, value, meta)

    backend.write_kv = rounded_write
    common = {"dtype": "bfloat16", **({"model": args.model} if args.model else {})}
    text = default_text()
    print("levels  KLD mean  delta PPL  top-1")
    for levels in (int(v) for v in args.levels.split(",")):
        r = run_kld(
            EngineArgs(**common, kv_cache_dtype="bfloat16"), EngineArgs(**common, kv_cache_dtype="float32"), text
        )
        print(f"{levels:6d}  {r.kld_mean:8.6f}  {r.delta_ppl:+9.4f}  {100 * r.top1_agreement:5.2f}%", flush=True)


if __name__ == "__main__":
    main()
