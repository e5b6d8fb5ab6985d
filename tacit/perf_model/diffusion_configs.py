"""The component configs `tacit predict` counts a diffusion model from: the published SDXL base
and SD 1.5 architectures by name, or a diffusers directory's own config files.

The dicts are the diffusers / transformers config.json fields of stabilityai/stable-diffusion-xl-base-1.0
and stable-diffusion-v1-5 (unet/, vae/, text_encoder/, text_encoder_2/); issue 39's
tacit/diffusion/architectures.py holds the same architecture for the pipeline: one copy is to
be kept when both branches are merged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SDXL_UNET: dict[str, Any] = {
    "sample_size": 128,
    "in_channels": 4,
    "out_channels": 4,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    "block_out_channels": [320, 640, 1280],
    "layers_per_block": 2,
    "transformer_layers_per_block": [1, 2, 10],
    "attention_head_dim": [5, 10, 20],  # diffusers' name for the head COUNT of SDXL (64-wide heads)
    "cross_attention_dim": 2048,
    "use_linear_projection": True,
    "addition_embed_type": "text_time",
    "addition_time_embed_dim": 256,
    "projection_class_embeddings_input_dim": 2816,  # 1280 pooled text + 6 x 256 time ids
}
SD15_UNET: dict[str, Any] = {
    "sample_size": 64,
    "in_channels": 4,
    "out_channels": 4,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
    "block_out_channels": [320, 640, 1280, 1280],
    "layers_per_block": 2,
    "attention_head_dim": 8,
    "cross_attention_dim": 768,
}
_VAE = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "block_out_channels": [128, 256, 512, 512],
    "layers_per_block": 2,
    "latent_channels": 4,
    "norm_num_groups": 32,
}
SDXL_VAE: dict[str, Any] = {**_VAE, "sample_size": 1024, "scaling_factor": 0.13025}
SD15_VAE: dict[str, Any] = {**_VAE, "sample_size": 512, "scaling_factor": 0.18215}
CLIP_L: dict[str, Any] = {  # openai/clip-vit-large-patch14's text tower (SD 1.5's and SDXL's first encoder)
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "max_position_embeddings": 77,
    "vocab_size": 49408,
    "hidden_act": "quick_gelu",
    "projection_dim": 768,
}
CLIP_BIGG: dict[str, Any] = {  # OpenCLIP ViT-bigG/14's text tower (SDXL's text_encoder_2)
    "hidden_size": 1280,
    "intermediate_size": 5120,
    "num_hidden_layers": 32,
    "num_attention_heads": 20,
    "max_position_embeddings": 77,
    "vocab_size": 49408,
    "hidden_act": "gelu",
    "projection_dim": 1280,
}


@dataclass(frozen=True)
class DiffusionConfigs:
    name: str
    unet: dict[str, Any]
    vae: dict[str, Any]
    text_encoders: tuple[dict[str, Any], ...]

    @property
    def is_sdxl(self) -> bool:
        return self.unet.get("addition_embed_type") == "text_time"


NAMED: dict[str, DiffusionConfigs] = {
    "sdxl-base": DiffusionConfigs("sdxl-base", SDXL_UNET, SDXL_VAE, (CLIP_L, CLIP_BIGG)),
    "sd15": DiffusionConfigs("sd15", SD15_UNET, SD15_VAE, (CLIP_L,)),
}
ALIASES = {"sdxl": "sdxl-base", "sd1.5": "sd15", "sd-1.5": "sd15"}


def is_diffusion_model(model: str | None) -> bool:
    """A named diffusion architecture, or a diffusers directory (its model_index.json)."""
    if model is None:
        return False
    return model in NAMED or model in ALIASES or (Path(model) / "model_index.json").is_file()


def _read(path: Path) -> dict[str, Any]:
    file = path / "config.json"
    if not file.is_file():
        raise ValueError(f"diffusion model {path.parent}: {path.name}/config.json is missing")
    return {k: v for k, v in json.loads(file.read_text()).items() if not k.startswith("_")}


def load_diffusion_configs(model: str) -> DiffusionConfigs:
    """`model`: sdxl-base | sd15 (or an alias), or a diffusers directory with unet/ and vae/
    (text_encoder/, text_encoder_2/ where the model has them)."""
    name = ALIASES.get(model, model)
    if name in NAMED:
        return NAMED[name]
    root = Path(model)
    if not (root / "model_index.json").is_file():
        valid = ", ".join([*NAMED, *ALIASES])
        raise ValueError(
            f"diffusion model {model!r}: not a name ({valid}) nor a diffusers directory (model_index.json)"
        )
    encoders = tuple(_read(root / d) for d in ("text_encoder", "text_encoder_2") if (root / d).is_dir())
    return DiffusionConfigs(root.name, _read(root / "unet"), _read(root / "vae"), encoders)
