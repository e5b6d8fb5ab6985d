"""Write a Hugging Face checkpoint as an FP8 block-scaled one (the format loader/fp8_checkpoint.py
reads), for benchmarks and accuracy runs: `--model random:qwen3-100m-fp8`, or an FP8 copy of a
real bf16 model to measure with `tacit eval kld` against the original.

Quantized as DeepSeek's and transformers' block quantizers do: per [bn, bk] block (128 x 128),
scale = max|w| / 448 (e4m3's largest finite value), q = e4m3(w / scale) rounded to nearest even,
weight_scale_inv = scale. Every linear weight is converted except the ones FP8 checkpoints keep
in bf16: embeddings, lm_head, norms and the MoE router (`mlp.gate`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tacit.loader.fp8_checkpoint import SCALE_SUFFIX

E4M3_MAX = 448.0
DEFAULT_BLOCK = (128, 128)
_KEPT = ("embed_tokens.weight", "lm_head.weight", "norm.weight", "mlp.gate.weight")


def quantize_block_fp8(w: torch.Tensor, block: tuple[int, int] = DEFAULT_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float -> (float8_e4m3fn [N, K], fp32 weight_scale_inv [ceil(N / bn), ceil(K / bk)])."""
    bn, bk = block
    n, k = w.shape
    padded = torch.zeros(-(-n // bn) * bn, -(-k // bk) * bk)
    padded[:n, :k] = w.float()
    blocks = padded.reshape(padded.shape[0] // bn, bn, padded.shape[1] // bk, bk)
    # An all-zero block gets the smallest normal scale instead of 0, so q stays 0, never NaN.
    scale = (blocks.abs().amax(dim=(1, 3)) / E4M3_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    q = (blocks / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.reshape(padded.shape)[:n, :k].contiguous(), scale


def converts(name: str, tensor: torch.Tensor) -> bool:
    """Whether an FP8 checkpoint holds this tensor in FP8: a linear layer's 2-D weight."""
    return tensor.dim() == 2 and name.endswith(".weight") and not name.endswith(_KEPT)


def write_fp8_checkpoint(src: Path, dst: Path, block: tuple[int, int] = DEFAULT_BLOCK) -> Path:
    """src (a Hugging Face directory of safetensors) -> dst, its linear weights in FP8 blocks and
    config.json's quantization_config saying so; the other files copied."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    index, scales = None, {}
    for f in src.iterdir():
        if f.suffix == ".safetensors":
            tensors = {}
            for name, w in load_file(str(f)).items():
                if converts(name, w):
                    scale_name = name.removesuffix("weight") + SCALE_SUFFIX
                    tensors[name], tensors[scale_name] = quantize_block_fp8(w, block)
                    scales[scale_name] = f.name
                else:
                    tensors[name] = w
            save_file(tensors, str(dst / f.name), metadata={"format": "pt"})
        elif f.name == "model.safetensors.index.json":
            index = json.loads(f.read_text())
        elif f.is_file() and f.name != "config.json":
            shutil.copy(f, dst / f.name)
    if index is not None:
        index["weight_map"].update(scales)
        (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": list(block),
    }
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m tacit.loader.fp8_writer",
        description="Write a Hugging Face safetensors checkpoint as an FP8 block-scaled one.",
    )
    parser.add_argument("src", type=Path, help="a Hugging Face model directory")
    parser.add_argument("dst", type=Path, help="the directory to write")
    parser.add_argument("--block", type=int, nargs=2, default=list(DEFAULT_BLOCK), metavar=("ROWS", "COLS"))
    args = parser.parse_args(argv)
    if not (args.src / "config.json").is_file():
        parser.error(f"{args.src} has no config.json; pass a Hugging Face model directory")
    if args.block[1] % 32 or min(args.block) <= 0:
        parser.error(f"--block {args.block[0]} {args.block[1]}: COLS must be a positive multiple of 32")
    print(write_fp8_checkpoint(args.src, args.dst, tuple(args.block)))


if __name__ == "__main__":
    main()
