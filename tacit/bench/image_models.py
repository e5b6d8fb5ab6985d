"""The UNet and VAE `tacit bench image` times: SDXL-shaped configs, random weights made fast, the
seeded inputs every engine gets, and the two measures the engines share (FLOPs, PSNR).

The weights are random because none can be downloaded here, and a step's time does not depend on
their values. Built the ordinary way (fp32, PyTorch's default init) SDXL's 2.57B-parameter UNet
takes minutes and 10 GB; here it is built on the meta device (0.3 s), materialised in bf16
(5.1 GB) and filled from one seeded generator, so each engine's process builds the same weights
without 5 GB crossing a pipe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from tacit.diffusion.architectures import get_arch
from tacit.diffusion.random_weights import build_random

PROMPT_TOKENS = 77  # CLIP's context: SDXL's encoder_hidden_states are 77 tokens


# --model -> the pipeline's own architecture (tacit.diffusion.architectures). SD 1.5's 860M-parameter
# UNet is the one whose float32 weights fit three engines in 24 GiB (3.4 GB each; SDXL's are 10.3).
BENCH_MODELS = {"sdxl": "sdxl", "sd15": "sd15", "tiny": "tiny_sdxl"}
# SDXL's micro-conditioning inputs (added_cond_kwargs), absent from SD 1.5's UNet
ADDED_COND = ("text_embeds", "time_ids")


def model_configs(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(unet config, vae config) for --model sdxl | sd15 | tiny: the published shapes, or SDXL's tiny
    test version."""
    if name not in BENCH_MODELS:
        raise ValueError(f"--model {name!r}: one of {', '.join(BENCH_MODELS)}")
    arch = get_arch(BENCH_MODELS[name])
    return arch["unet"], arch["vae"]


def added_cond(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """The UNet's added_cond_kwargs: SDXL's pooled text and time ids; None for SD 1.5."""
    return {k: inputs[k] for k in ADDED_COND} if ADDED_COND[0] in inputs else None


class MissingEngine(ImportError):
    """An engine whose package is not installed: the bench prints this line and goes on."""


@dataclass(frozen=True)
class ImageShape:
    """What one benchmark run is: the image size and its latent, CFG batch and step count."""

    model: str
    size: int  # image height = width, pixels
    steps: int
    guidance_scale: float = 5.0
    # What every engine computes in: bf16 where oneDNN runs it; float32 on CPUs whose bf16 matmul is
    # torch's scalar fallback (an AVX2-only EPYC: 0.9 GFLOP/s bf16 against 62 float32).
    dtype: str = "bfloat16"

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype not in ("bfloat16", "float32"):
            raise ValueError(f"--dtype {self.dtype!r}: one of auto, bfloat16, float32")
        return getattr(torch, self.dtype)

    @property
    def batch(self) -> int:
        return 2 if self.guidance_scale > 1.0 else 1  # classifier-free guidance: uncond + cond in one call

    def latent_size(self, vae_config: dict[str, Any]) -> int:
        factor = 2 ** (len(vae_config["block_out_channels"]) - 1)  # SDXL's VAE: 8
        if self.size % factor:
            raise ValueError(f"--size {self.size}: must be a multiple of {factor} (the VAE's downscale)")
        return self.size // factor


def build_unet_vae(model: str, dtype: torch.dtype, seed: int, device: str = "cpu"):
    from diffusers import AutoencoderKL, UNet2DConditionModel

    unet_cfg, vae_cfg = model_configs(model)
    unet = build_random(UNet2DConditionModel, unet_cfg, dtype, seed, device)
    vae = build_random(AutoencoderKL, vae_cfg, dtype, seed + 1, device)
    return unet, vae


def unet_inputs(shape: ImageShape, unet_config: dict[str, Any], vae_config: dict[str, Any], dtype: torch.dtype,
                seed: int, device: str = "cpu") -> dict[str, torch.Tensor]:  # fmt: skip
    """The seeded prompt embeddings (random: no text encoder runs in this benchmark) and initial
    latents every engine starts from."""
    gen = torch.Generator().manual_seed(seed)
    lat = shape.latent_size(vae_config)
    ctx = unet_config["cross_attention_dim"]
    b = shape.batch
    out = {
        "latents": torch.randn(1, unet_config["in_channels"], lat, lat, generator=gen),
        "encoder_hidden_states": torch.randn(b, PROMPT_TOKENS, ctx, generator=gen),
    }
    if unet_config.get("addition_embed_type") == "text_time":
        time_dim = unet_config["addition_time_embed_dim"]
        pooled = unet_config["projection_class_embeddings_input_dim"] - 6 * time_dim
        out["text_embeds"] = torch.randn(b, pooled, generator=gen)
        # SDXL's micro-conditioning: original size, crop top-left, target size
        out["time_ids"] = torch.tensor(
            [[shape.size, shape.size, 0, 0, shape.size, shape.size]] * b, dtype=torch.float32
        )
    return {k: v.to(device=device, dtype=dtype) for k, v in out.items()}


def flops_of(fn: Callable[[], Any]) -> float:
    """FLOPs torch.utils.flop_counter counts while fn() runs (convolutions, matmuls, attention:
    2 per multiply-add; elementwise ops count 0). The one counter every engine's TFLOP/s uses."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        fn()
    return float(counter.get_total_flops())


def count_flops(shape: ImageShape, seed: int = 0) -> dict[str, float]:
    """FLOPs of one UNet call (CFG batch) and one VAE decode, and both parameter counts, on the
    meta device: no weights, no time (2 s for SDXL at 1024), one count every engine is divided by."""
    unet_cfg, vae_cfg = model_configs(shape.model)
    unet, vae = build_unet_vae(shape.model, torch.bfloat16, seed, device="meta")
    x = unet_inputs(shape, unet_cfg, vae_cfg, torch.bfloat16, seed, device="meta")
    cond = added_cond(x)
    sample, t = torch.cat([x["latents"]] * shape.batch), torch.tensor(999.0, device="meta")
    return {
        "unet_flops": flops_of(
            lambda: unet(
                sample, t, encoder_hidden_states=x["encoder_hidden_states"], added_cond_kwargs=cond, return_dict=False
            )
        ),  # fmt: skip
        "vae_flops": flops_of(lambda: vae.decode(x["latents"], return_dict=False)),
        "unet_params": float(sum(p.numel() for p in unet.parameters())),
        "vae_params": float(sum(p.numel() for p in vae.parameters())),
    }


def psnr(image: torch.Tensor, reference: torch.Tensor) -> float:
    """dB of `image` against `reference`, peak = the reference's value range (random weights do not
    keep the VAE's output in [-1, 1]); inf when equal."""
    ref = reference.float()
    mse = torch.mean((image.float() - ref) ** 2).item()
    peak = (ref.max() - ref.min()).item()
    return math.inf if mse == 0 else 10.0 * math.log10(peak**2 / mse)
