"""Published component configs of the diffusion models tacit runs, as plain dicts.

Why our own copies: a single-file checkpoint (civitai, the SDXL base `.safetensors`) carries weights
only, and diffusers would fetch the configs from the hub at load time. These are the configs of
stabilityai/stable-diffusion-xl-base-1.0 and stable-diffusion-v1-5 (unet/, vae/, text_encoder*/,
scheduler/ config.json), so a checkpoint loads offline and the SDXL-shaped benchmarks use the
published shapes. `tiny_sdxl()` / `tiny_sd15()` keep each architecture's structure (block types,
two text encoders, text_time conditioning) at sizes a test runs in a second.

A `DiffusionArch` is {"family", "unet", "vae", "text_encoder", "text_encoder_2" (None for SD 1.5),
"scheduler", "tokenizer_max_length", "force_zeros_for_empty_prompt"}.
"""

from __future__ import annotations

import copy
from typing import Any

DiffusionArch = dict[str, Any]

# The noise schedule both families were trained with (scheduler/scheduler_config.json).
_TRAIN_SCHEDULE = {
    "num_train_timesteps": 1000,
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "prediction_type": "epsilon",
    "steps_offset": 1,
    "timestep_spacing": "leading",
    "clip_sample": False,
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
    "interpolation_type": "linear",
    "use_karras_sigmas": False,
    "sample_max_value": 1.0,
}

_VAE = {
    "act_fn": "silu",
    "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 4,
    "layers_per_block": 2,
    "norm_num_groups": 32,
}

# CLIP ViT-L/14: SD 1.5's only text encoder and SDXL's first. eos_token_id=2 is what the published
# configs say: transformers then pools at argmax(input_ids), the <|endoftext|> id 49407 (the largest).
_CLIP_L = {
    "vocab_size": 49408,
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "max_position_embeddings": 77,
    "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5,
    "projection_dim": 768,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "pad_token_id": 1,
}


def sdxl_base() -> DiffusionArch:
    """stabilityai/stable-diffusion-xl-base-1.0 (2.6 B UNet parameters)."""
    unet = {
        "in_channels": 4,
        "out_channels": 4,
        "sample_size": 128,
        "block_out_channels": [320, 640, 1280],
        "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
        "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
        "mid_block_type": "UNetMidBlock2DCrossAttn",
        "layers_per_block": 2,
        "transformer_layers_per_block": [1, 2, 10],
        "attention_head_dim": [5, 10, 20],
        "cross_attention_dim": 2048,  # 768 (CLIP-L) + 1280 (OpenCLIP bigG) hidden states, concatenated
        "use_linear_projection": True,
        "addition_embed_type": "text_time",
        "addition_time_embed_dim": 256,
        # 1280 (pooled bigG embedding) + 6 time ids x 256
        "projection_class_embeddings_input_dim": 2816,
        "class_embed_type": None,
        "norm_num_groups": 32,
        "norm_eps": 1e-5,
        "flip_sin_to_cos": True,
        "freq_shift": 0,
        "act_fn": "silu",
        "upcast_attention": False,
    }
    text_encoder_2 = dict(
        _CLIP_L,
        hidden_size=1280,
        intermediate_size=5120,
        num_hidden_layers=32,
        num_attention_heads=20,
        hidden_act="gelu",
        projection_dim=1280,
    )
    return copy.deepcopy(
        {  # deep: callers edit the nested dicts and lists (tiny_sdxl does)
            "family": "sdxl",
            "unet": unet,
            "vae": dict(_VAE, sample_size=1024, scaling_factor=0.13025, force_upcast=True),
            "text_encoder": dict(_CLIP_L),
            "text_encoder_2": text_encoder_2,
            "scheduler": dict(_TRAIN_SCHEDULE, _class_name="EulerDiscreteScheduler"),
            "tokenizer_max_length": 77,
            "force_zeros_for_empty_prompt": True,
        }
    )


def sd15() -> DiffusionArch:
    """stable-diffusion-v1-5 (860 M UNet parameters)."""
    unet = {
        "in_channels": 4,
        "out_channels": 4,
        "sample_size": 64,
        "block_out_channels": [320, 640, 1280, 1280],
        "down_block_types": ["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"],
        "up_block_types": ["UpBlock2D"] + ["CrossAttnUpBlock2D"] * 3,
        "mid_block_type": "UNetMidBlock2DCrossAttn",
        "layers_per_block": 2,
        "attention_head_dim": 8,
        "cross_attention_dim": 768,
        "use_linear_projection": False,
        "class_embed_type": None,
        "addition_embed_type": None,
        "norm_num_groups": 32,
        "norm_eps": 1e-5,
        "flip_sin_to_cos": True,
        "freq_shift": 0,
        "act_fn": "silu",
    }
    return copy.deepcopy(
        {
            "family": "sd15",
            "unet": unet,
            "vae": dict(_VAE, sample_size=512, scaling_factor=0.18215),
            "text_encoder": dict(_CLIP_L),
            "text_encoder_2": None,
            "scheduler": dict(_TRAIN_SCHEDULE, _class_name="PNDMScheduler"),
            "tokenizer_max_length": 77,
            "force_zeros_for_empty_prompt": False,
        }
    )


# Tiny shapes: 32/64 channels keep GroupNorm's 32 groups valid; a 16-token context and a 64-entry
# vocabulary (tests write the matching tokenizer) keep the text encoders trivial.
_TINY_CLIP = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 37,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 16,
    "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5,
    "projection_dim": 32,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "pad_token_id": 1,
}
_TINY_VAE = {
    "act_fn": "silu",
    "block_out_channels": [32, 64],
    "down_block_types": ["DownEncoderBlock2D"] * 2,
    "up_block_types": ["UpDecoderBlock2D"] * 2,
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 4,
    "layers_per_block": 1,
    "norm_num_groups": 32,
    "sample_size": 64,
}


def tiny_sdxl() -> DiffusionArch:
    """SDXL's structure (DownBlock then cross-attention blocks, text_time conditioning, two encoders)."""
    arch = sdxl_base()
    arch["unet"].update(
        sample_size=16,
        block_out_channels=[32, 64],
        down_block_types=["DownBlock2D", "CrossAttnDownBlock2D"],
        up_block_types=["CrossAttnUpBlock2D", "UpBlock2D"],
        transformer_layers_per_block=[1, 2],
        attention_head_dim=[2, 4],
        cross_attention_dim=64,  # 32 + 32
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=80,  # 32 + 6 x 8
    )
    arch["vae"] = dict(_TINY_VAE, scaling_factor=0.13025, force_upcast=True)
    arch["text_encoder"] = dict(_TINY_CLIP)
    arch["text_encoder_2"] = dict(_TINY_CLIP, hidden_act="gelu")
    arch["tokenizer_max_length"] = 16
    return arch


def tiny_sd15() -> DiffusionArch:
    """SD 1.5's structure (cross-attention down blocks first, conv proj_in, one encoder)."""
    arch = sd15()
    arch["unet"].update(
        sample_size=16,
        block_out_channels=[32, 64],
        down_block_types=["CrossAttnDownBlock2D", "DownBlock2D"],
        up_block_types=["UpBlock2D", "CrossAttnUpBlock2D"],
        attention_head_dim=4,
        cross_attention_dim=32,
    )
    arch["vae"] = dict(_TINY_VAE, scaling_factor=0.18215)
    arch["text_encoder"] = dict(_TINY_CLIP)
    arch["tokenizer_max_length"] = 16
    return arch


ARCHITECTURES = {"sdxl": sdxl_base, "sd15": sd15, "tiny_sdxl": tiny_sdxl, "tiny_sd15": tiny_sd15}


def get_arch(name: str) -> DiffusionArch:
    """A fresh (deep-copied) architecture dict by name; callers may edit it."""
    if name not in ARCHITECTURES:
        raise ValueError(f"architecture={name!r}: must be one of {sorted(ARCHITECTURES)}")
    return copy.deepcopy(ARCHITECTURES[name]())
