"""Tiny random SDXL-shaped UNet and VAE for the optimization tests (H3's own; H1's tiny_sdxl() is the pipeline's).

SDXL's structure at toy width: three levels (plain, cross-attention, cross-attention with two
transformer layers), text_time added conditioning, linear projections, so every code path the
optimizations touch on SDXL is exercised in under a second a call.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from diffusers import AutoencoderKL, UNet2DConditionModel

CROSS_DIM = 32
PROMPT_TOKENS = 77


def tiny_unet(seed: int = 0) -> UNet2DConditionModel:
    torch.manual_seed(seed)
    return UNet2DConditionModel(
        sample_size=16,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64, 64),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        transformer_layers_per_block=(1, 1, 2),
        attention_head_dim=(2, 4, 4),
        cross_attention_dim=CROSS_DIM,
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=6 * 8 + CROSS_DIM,
        norm_num_groups=8,
    ).eval()


def tiny_vae(seed: int = 0) -> AutoencoderKL:
    torch.manual_seed(seed)
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(16, 32),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        layers_per_block=1,
        norm_num_groups=8,
        sample_size=64,
    ).eval()


def unet_inputs(batch: int = 2, size: int = 16, dtype: torch.dtype = torch.float32, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "sample": torch.randn(batch, 4, size, size, generator=g).to(dtype),
        "timestep": torch.tensor(500.0),
        "encoder_hidden_states": torch.randn(batch, PROMPT_TOKENS, CROSS_DIM, generator=g).to(dtype),
        "added_cond_kwargs": {
            "text_embeds": torch.randn(batch, CROSS_DIM, generator=g).to(dtype),
            "time_ids": torch.tensor([[size * 8, size * 8, 0, 0, size * 8, size * 8]] * batch, dtype=dtype),
        },
    }


def components(unet: UNet2DConditionModel | None = None, vae: AutoencoderKL | None = None) -> SimpleNamespace:
    return SimpleNamespace(unet=unet if unet is not None else tiny_unet(), vae=vae if vae is not None else tiny_vae())


def psnr(x: torch.Tensor, ref: torch.Tensor) -> float:
    """PSNR in dB with the reference's peak-to-peak range as the signal (latents are not in [0, 1])."""
    x, ref = x.double(), ref.double()
    mse = (x - ref).pow(2).mean().item()
    peak = (ref.max() - ref.min()).item()
    return float("inf") if mse == 0 else 10 * torch.log10(torch.tensor(peak * peak / mse)).item()
