"""A single-file SGM/LDM checkpoint (`model.diffusion_model.*`, `first_stage_model.*`, text encoders
under `conditioner.embedders.{0,1}` for SDXL or `cond_stage_model` for SD 1.5) -> diffusers modules.

The key renaming is diffusers' (loaders.single_file_utils); what diffusers would fetch from the hub
(each component's config) comes from tacit's architectures.py instead, so this runs offline.
Loading is strict: a key the architecture lacks, or one it needs that the file lacks, is an error
naming a few of them, rather than a model that runs with random weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tacit.diffusion import architectures

# Keys that tell the families apart (the same ones diffusers' infer_diffusers_model_type uses).
_SDXL_KEY = "conditioner.embedders.1.model.positional_embedding"  # the OpenCLIP bigG encoder
_SD15_KEY = "cond_stage_model.transformer.text_model.embeddings.position_embedding.weight"
_UNET_PREFIX = "model.diffusion_model."
_OPEN_CLIP_PREFIX = "conditioner.embedders.1.model."


def detect_family(keys: set[str], path: Path) -> str:
    if _SDXL_KEY in keys:
        return "sdxl"
    if _SD15_KEY in keys:
        return "sd15"
    raise ValueError(
        f"model={str(path)!r}: not an SDXL or SD 1.5 single-file checkpoint "
        f"(neither {_SDXL_KEY!r} nor {_SD15_KEY!r} is among its {len(keys)} tensors)"
    )


def load_single_file(
    path: Path, dtype: torch.dtype, arch: architectures.DiffusionArch | None = None
) -> tuple[str, architectures.DiffusionArch, dict[str, Any]]:
    """(family, the architecture used, {"unet", "vae", "text_encoder", "text_encoder_2"}) from one file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        checkpoint = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"model={str(path)!r}: not a readable .safetensors file ({e})") from e
    family = detect_family(set(checkpoint), path)
    if arch is None:
        arch = architectures.get_arch("sdxl" if family == "sdxl" else "sd15")
    elif arch["family"] != family:
        raise ValueError(
            f"model={str(path)!r}: the file holds an {family} model, the architecture given is {arch['family']}"
        )
    # fp16 files are the norm; cast once here so every module is built in the requested dtype.
    checkpoint = {k: v.to(dtype) if v.is_floating_point() else v for k, v in checkpoint.items()}
    modules = {
        "unet": _unet(checkpoint, arch["unet"], path),
        "vae": _vae(checkpoint, arch["vae"], path),
        "text_encoder": _clip(checkpoint, arch["text_encoder"], path, dtype),
        "text_encoder_2": _open_clip(checkpoint, arch["text_encoder_2"], path, dtype) if family == "sdxl" else None,
    }
    return family, arch, modules


def _unet(checkpoint: dict[str, torch.Tensor], config: dict[str, Any], path: Path) -> Any:
    from diffusers import UNet2DConditionModel
    from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint

    # The converter reads layers_per_block, class_embed_type and addition_embed_type from the config.
    state = convert_ldm_unet_checkpoint(checkpoint, config)
    return _build_on_meta(UNet2DConditionModel, config, state, path, "unet", _UNET_PREFIX)


def _vae(checkpoint: dict[str, torch.Tensor], config: dict[str, Any], path: Path) -> Any:
    from diffusers import AutoencoderKL
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    # The converter reads down_block_types/up_block_types (how many encoder/decoder levels).
    state = convert_ldm_vae_checkpoint(checkpoint, config)
    return _build_on_meta(AutoencoderKL, config, state, path, "vae", "first_stage_model.")


def _build_on_meta(
    cls: Any, config: dict[str, Any], state: dict[str, torch.Tensor], path: Path, what: str, prefix: str
) -> Any:
    """Build the module without initialising it (SDXL's UNet: 2.6 B random values, ~1 min of CPU
    for nothing) and take the checkpoint's tensors as its parameters."""
    with torch.device("meta"):
        model = cls.from_config(config)
    _check_keys(model, state, path, what, prefix)
    model.load_state_dict(state, strict=True, assign=True)
    left = [name for name, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:  # a buffer not in the state dict (none in diffusers' UNet/VAE today) would stay unallocated
        raise ValueError(f"model={str(path)!r}: {what} tensors not in the checkpoint: {left[:5]}")
    return model.eval().requires_grad_(False)


def _clip(checkpoint: dict[str, torch.Tensor], config: dict[str, Any], path: Path, dtype: torch.dtype) -> Any:
    from diffusers.loaders.single_file_utils import convert_ldm_clip_checkpoint
    from transformers import CLIPTextConfig, CLIPTextModel

    # Strips cond_stage_model.transformer. (SD 1.5) or conditioner.embedders.0.transformer. (SDXL).
    state = convert_ldm_clip_checkpoint(checkpoint)
    model = _new_clip(CLIPTextModel, CLIPTextConfig(**config), dtype)
    if not hasattr(model, "text_model"):  # transformers >= 5.6 flattened CLIPTextModel
        state = {k.removeprefix("text_model."): v for k, v in state.items()}
    return _load_clip(model, state, path, "text_encoder", "conditioner.embedders.0 / cond_stage_model")


def _open_clip(checkpoint: dict[str, torch.Tensor], config: dict[str, Any], path: Path, dtype: torch.dtype) -> Any:
    from diffusers.loaders.single_file_utils import convert_open_clip_checkpoint
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    model = _new_clip(CLIPTextModelWithProjection, CLIPTextConfig(**config), dtype)
    # Splits OpenCLIP's fused in_proj into q/k/v at text_projection's first dimension (the width).
    state = convert_open_clip_checkpoint(model, checkpoint, prefix=_OPEN_CLIP_PREFIX)
    return _load_clip(model, state, path, "text_encoder_2", _OPEN_CLIP_PREFIX)


def _new_clip(cls: Any, config: Any, dtype: torch.dtype) -> Any:
    # Built for real (not on meta): CLIP keeps position_ids as a non-persistent buffer that no
    # checkpoint carries; the two encoders are 0.8 B parameters, seconds to initialise.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return cls(config)
    finally:
        torch.set_default_dtype(previous)


def _load_clip(model: Any, state: dict[str, torch.Tensor], path: Path, what: str, prefix: str) -> Any:
    state = {k: v for k, v in state.items() if not k.endswith("position_ids")}  # older exports save it
    _check_keys(model, state, path, what, prefix)
    model.load_state_dict(state, strict=True)
    return model.eval().requires_grad_(False)


def _check_keys(model: Any, state: dict[str, torch.Tensor], path: Path, what: str, prefix: str) -> None:
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = sorted(k for k in set(expected) & set(state) if tuple(expected[k].shape) != tuple(state[k].shape))
    if missing or unexpected or wrong:
        details = []
        if missing:
            details.append(f"{len(missing)} missing (e.g. {missing[:3]})")
        if unexpected:
            details.append(f"{len(unexpected)} unexpected (e.g. {unexpected[:3]})")
        if wrong:
            k = wrong[0]
            details.append(
                f"{len(wrong)} of another shape (e.g. {k}: {tuple(state[k].shape)} in the file, "
                f"{tuple(expected[k].shape)} in the architecture)"
            )
        raise ValueError(
            f"model={str(path)!r}: its {what} ({prefix}*) does not fit the architecture: " + "; ".join(details)
        )
