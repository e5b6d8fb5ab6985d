"""Load a diffusion checkpoint as users have it: a diffusers directory, or one single-file `.safetensors`.

1. A diffusers directory (model_index.json, unet/, vae/, text_encoder/, tokenizer/, scheduler/, and
   text_encoder_2/ + tokenizer_2/ for SDXL), weights as *.safetensors or their fp16 variants
   (*.fp16.safetensors, what `variant="fp16"` downloads leave). Each component loads through its
   own from_pretrained with local_files_only: nothing is fetched.
2. A single file in the original SGM/LDM key layout (SDXL base, civitai fine-tunes): the family is
   read from the keys (SDXL's OpenCLIP encoder sits at `conditioner.embedders.1`), the keys are
   converted with diffusers.loaders.single_file_utils against tacit's own configs
   (architectures.py) so no hub config is needed, and loading is strict so a file of another
   architecture fails with the keys that did not fit. The file has no tokenizer: pass
   tokenizer_dir, a directory holding tokenizer/ (and tokenizer_2/ for SDXL), e.g. the model's
   diffusers directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tacit.diffusion import architectures
from tacit.diffusion.singlefile import load_single_file


@dataclass
class DiffusionComponents:
    family: str  # "sdxl" or "sd15"
    name: str  # the checkpoint's directory or file name, as the server reports it
    unet: Any  # diffusers UNet2DConditionModel
    vae: Any  # diffusers AutoencoderKL
    text_encoder: Any  # transformers CLIPTextModel
    text_encoder_2: Any | None  # transformers CLIPTextModelWithProjection (SDXL only)
    tokenizer: Any  # transformers CLIPTokenizer
    tokenizer_2: Any | None
    scheduler_config: dict[str, Any]  # the checkpoint's training schedule (see schedulers.py)
    force_zeros_for_empty_prompt: bool  # SDXL: an empty negative prompt is zero embeddings, not ""


_WEIGHT_NAMES = {
    "diffusers": ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.safetensors.index.json"),
    "transformers": ("model.safetensors", "model.safetensors.index.json"),
}


def load_components(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    tokenizer_dir: str | Path | None = None,
    arch: architectures.DiffusionArch | None = None,
) -> DiffusionComponents:
    """Load a diffusers directory or a single-file `.safetensors` checkpoint.

    tokenizer_dir: for a single file, where tokenizer/ (and tokenizer_2/) are. arch: for a single
    file, the architecture dict to build (default: SDXL base or SD 1.5, detected from the keys).
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"model={str(path)!r}: no such file or directory")
    if path.is_dir():
        if (path / "model_index.json").is_file():
            return _load_diffusers_dir(path, dtype)
        raise ValueError(
            f"model={str(path)!r}: a directory must be a diffusers checkpoint with model_index.json "
            "(unet/, vae/, text_encoder/, tokenizer/, scheduler/); for a single-file checkpoint pass the .safetensors"
        )
    if path.suffix != ".safetensors":
        raise ValueError(f"model={str(path)!r}: a single-file checkpoint must be a .safetensors file")
    family, arch, modules = load_single_file(path, dtype, arch)
    tokenizer, tokenizer_2 = _load_tokenizers(tokenizer_dir, family == "sdxl", path)
    return DiffusionComponents(
        family=family,
        name=path.stem,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer_2,
        scheduler_config=dict(arch["scheduler"]),
        force_zeros_for_empty_prompt=bool(arch["force_zeros_for_empty_prompt"]),
        **modules,
    )


def _load_diffusers_dir(path: Path, dtype: torch.dtype) -> DiffusionComponents:
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    try:
        index = json.loads((path / "model_index.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"model={str(path / 'model_index.json')!r}: not readable JSON ({e})") from e
    # A pipeline lists its components as name -> [library, class]; SDXL's text_encoder_2 is
    # [null, null] in refiner-less exports, so test the value, not the key.
    family = "sdxl" if (index.get("text_encoder_2") or [None])[0] else "sd15"
    if index.get("_class_name", "").startswith("StableDiffusionXL") and family != "sdxl":
        raise ValueError(f"model={str(path)!r}: an SDXL pipeline without text_encoder_2 (refiners are not supported)")
    unet = _from_pretrained(UNet2DConditionModel, path / "unet", "diffusers", dtype)
    vae = _from_pretrained(AutoencoderKL, path / "vae", "diffusers", dtype)
    text_encoder = _from_pretrained(CLIPTextModel, path / "text_encoder", "transformers", dtype)
    text_encoder_2 = None
    if family == "sdxl":
        text_encoder_2 = _from_pretrained(CLIPTextModelWithProjection, path / "text_encoder_2", "transformers", dtype)
    tokenizer = _tokenizer(CLIPTokenizer, path / "tokenizer")
    tokenizer_2 = _tokenizer(CLIPTokenizer, path / "tokenizer_2") if family == "sdxl" else None
    scheduler_file = path / "scheduler" / "scheduler_config.json"
    if not scheduler_file.is_file():
        raise ValueError(f"model: {str(scheduler_file)!r} is missing (the checkpoint's noise schedule)")
    return DiffusionComponents(
        family=family,
        name=path.name,
        unet=unet,
        vae=vae,
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer_2,
        scheduler_config=json.loads(scheduler_file.read_text()),
        force_zeros_for_empty_prompt=bool(index.get("force_zeros_for_empty_prompt", family == "sdxl")),
    )


def _from_pretrained(cls: Any, sub: Path, library: str, dtype: torch.dtype) -> Any:
    """One component, its weights as saved plainly or as the fp16 variant; errors name the path."""
    if not (sub / "config.json").is_file():
        raise ValueError(f"model: {str(sub / 'config.json')!r} is missing ({sub.name}/ of a diffusers checkpoint)")
    variant = None
    if not any((sub / name).is_file() for name in _WEIGHT_NAMES[library]):
        fp16 = [name.replace(".safetensors", ".fp16.safetensors") for name in _WEIGHT_NAMES[library]]
        if not any((sub / name).is_file() for name in fp16):
            raise ValueError(f"model: no weights in {str(sub)!r}: expected {_WEIGHT_NAMES[library][0]} or {fp16[0]}")
        variant = "fp16"
    kwargs: dict[str, Any] = {}
    if library == "diffusers":
        from diffusers.utils import is_accelerate_available

        # With accelerate, diffusers builds on meta and skips random init (SDXL's UNet: 2.6 B values);
        # without it, asking for that only logs a warning per component before doing the same as False.
        kwargs["low_cpu_mem_usage"] = is_accelerate_available()
    try:
        model = cls.from_pretrained(sub, torch_dtype=dtype, variant=variant, local_files_only=True, **kwargs)
    except (OSError, ValueError, RuntimeError) as e:
        # safetensors reports a truncated or corrupt file as an OSError/SafetensorError (a RuntimeError)
        raise ValueError(f"model: cannot load {str(sub)!r}: {e}") from e
    return model.eval().requires_grad_(False)


def _tokenizer(cls: Any, sub: Path) -> Any:
    if not sub.is_dir():
        raise ValueError(f"model: tokenizer directory {str(sub)!r} is missing")
    try:
        return cls.from_pretrained(sub, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"model: cannot load the tokenizer in {str(sub)!r}: {e}") from e


def _load_tokenizers(tokenizer_dir: str | Path | None, two: bool, checkpoint: Path) -> tuple[Any, Any | None]:
    from transformers import CLIPTokenizer

    wanted = "tokenizer/ and tokenizer_2/" if two else "tokenizer/"
    if tokenizer_dir is None:
        raise ValueError(
            f"tokenizer: the single-file checkpoint {str(checkpoint)!r} carries no tokenizer; pass a directory "
            f"holding {wanted} (e.g. the model's diffusers directory) as the tokenizer directory (--tokenizer DIR)"
        )
    root = Path(tokenizer_dir)
    tokenizer = _tokenizer(CLIPTokenizer, root / "tokenizer")
    tokenizer_2 = _tokenizer(CLIPTokenizer, root / "tokenizer_2") if two else None
    return tokenizer, tokenizer_2
