"""The three components of a text-to-image request counted per block (diffusion_count.py): one
UNet step, one VAE decode, the text encoders, each built from its config on the meta device."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

import torch

from tacit.perf_model.diffusion_configs import DiffusionConfigs
from tacit.perf_model.diffusion_count import BlockCount, count_blocks

LATENT_FACTOR = 8  # the VAE downsamples 8x: a 1024x1024 image is a 128x128 latent
PROMPT_TOKENS = 77  # CLIP's context: every prompt is padded to it


@dataclass(frozen=True)
class DiffusionCounts:
    unet: list[BlockCount]  # one UNet call (the CFG-doubled batch when guided)
    vae: list[BlockCount]  # one decode of the request's images
    text: list[BlockCount]  # the prompts' encoders (positive and negative when guided)


def check_size(width: int, height: int) -> None:
    for name, v in (("width", width), ("height", height)):
        if v < 64 or v % 64:
            raise ValueError(f"{name}={v}: must be a multiple of 64 and at least 64 (the UNet halves the latent 3x)")


def unet_inputs(cfg: dict[str, Any], batch: int, width: int, height: int) -> dict[str, Any]:
    """The UNet's forward arguments at this size (tensors on the current default device)."""
    h, w = height // LATENT_FACTOR, width // LATENT_FACTOR
    kwargs: dict[str, Any] = {
        "sample": torch.randn(batch, cfg.get("in_channels", 4), h, w),
        "timestep": torch.full((batch,), 500),
        "encoder_hidden_states": torch.randn(batch, PROMPT_TOKENS, cfg["cross_attention_dim"]),
    }
    if cfg.get("addition_embed_type") == "text_time":  # SDXL: pooled text embeds and 6 size/crop ids
        pooled = cfg["projection_class_embeddings_input_dim"] - 6 * cfg["addition_time_embed_dim"]
        kwargs["added_cond_kwargs"] = {"text_embeds": torch.randn(batch, pooled), "time_ids": torch.randn(batch, 6)}
    return kwargs


def _key(d: dict[str, Any]) -> str:
    return json.dumps(d, sort_keys=True)


@functools.lru_cache(maxsize=16)
def _unet_counts(cfg: str, batch: int, width: int, height: int, wb: float, ab: float) -> tuple[BlockCount, ...]:
    from diffusers import UNet2DConditionModel

    c = json.loads(cfg)
    with torch.device("meta"):
        unet = UNet2DConditionModel.from_config(c)
        kwargs = unet_inputs(c, batch, width, height)
    return tuple(count_blocks(unet, lambda: unet(**kwargs), "unet", wb, ab))


@functools.lru_cache(maxsize=16)
def _vae_counts(cfg: str, batch: int, width: int, height: int, wb: float, ab: float) -> tuple[BlockCount, ...]:
    from diffusers import AutoencoderKL

    c = json.loads(cfg)
    with torch.device("meta"):
        vae = AutoencoderKL.from_config(c)
        z = torch.randn(batch, c.get("latent_channels", 4), height // LATENT_FACTOR, width // LATENT_FACTOR)
    return tuple(count_blocks(vae, lambda: vae.decode(z), "vae", wb, ab))


@functools.lru_cache(maxsize=16)
def _text_counts(cfg: str, batch: int, index: int, wb: float, ab: float) -> tuple[BlockCount, ...]:
    from transformers import CLIPTextConfig, CLIPTextModel

    c = json.loads(cfg)
    with torch.device("meta"):
        model = CLIPTextModel(CLIPTextConfig(**{k: v for k, v in c.items() if k != "architectures"}))
        ids = torch.zeros(batch, PROMPT_TOKENS, dtype=torch.long)
    rows = count_blocks(model, lambda: model(ids), "text", wb, ab, is_block=lambda n: n == "text_model")
    for r in rows:
        r.name = f"text_encoder{'_' + str(index + 1) if index else ''}"
    return tuple(rows)


def count_request(
    cfgs: DiffusionConfigs, width: int, height: int, images: int = 1, guided: bool = True, weight_bytes: float = 2.0
) -> DiffusionCounts:
    """One UNet step of `images` images (2x the batch when guided: classifier-free guidance
    runs the negative prompt beside the positive one), their VAE decode and text encoding."""
    check_size(width, height)
    if images < 1:
        raise ValueError(f"images={images}: must be >= 1")
    ab = 2.0  # activations in fp16/bf16
    batch = images * (2 if guided else 1)
    unet = _unet_counts(_key(cfgs.unet), batch, width, height, weight_bytes, ab)
    vae = _vae_counts(_key(cfgs.vae), images, width, height, weight_bytes, ab)
    prompts = 2 if guided else 1  # a request's prompts are encoded once, not per image
    text = [
        r for i, enc in enumerate(cfgs.text_encoders) for r in _text_counts(_key(enc), prompts, i, weight_bytes, ab)
    ]
    return DiffusionCounts(list(unet), list(vae), text)
