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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tacit.diffusion import architectures
from tacit.diffusion.clip_bpe import find_open_clip_bpe, write_tokenizer_dirs
from tacit.diffusion.random_weights import build_random
from tacit.diffusion.singlefile import KeyMismatchError, build_on_meta, load_single_file, vae_dtype
from tacit.paths import cache_dir


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
    # A pipeline lists its components as name -> [library, class], [null, null] when absent.
    has = {name: bool((index.get(name) or [None])[0]) for name in ("text_encoder", "text_encoder_2")}
    if has["text_encoder_2"] and not has["text_encoder"]:
        raise ValueError(f"model={str(path)!r}: an SDXL refiner (no text_encoder/); tacit runs base models")
    family = "sdxl" if has["text_encoder_2"] else "sd15"
    unet = _diffusers_module(UNet2DConditionModel, path / "unet", dtype)
    vae = _diffusers_module(AutoencoderKL, path / "vae", dtype)
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


def _weight_files(sub: Path, library: str) -> tuple[list[Path], str | None]:
    """The component's safetensors files (one, or the shards an index lists) and their variant."""
    if not (sub / "config.json").is_file():
        raise ValueError(f"model: {str(sub / 'config.json')!r} is missing ({sub.name}/ of a diffusers checkpoint)")
    for variant in (None, "fp16"):
        single, index = (_with_variant(name, variant) for name in _WEIGHT_NAMES[library])
        if (sub / single).is_file():
            return [sub / single], variant
        if (sub / index).is_file():
            try:
                shards = sorted(set(json.loads((sub / index).read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError) as e:
                raise ValueError(f"model: {str(sub / index)!r} is not a weight index ({e})") from e
            return [sub / shard for shard in shards], variant
    plain = _WEIGHT_NAMES[library][0]
    raise ValueError(f"model: no weights in {str(sub)!r}: expected {plain} or {_with_variant(plain, 'fp16')}")


def _with_variant(name: str, variant: str | None) -> str:
    # diffusers' and transformers' naming: the variant goes before the last suffix
    # (model.fp16.safetensors, diffusion_pytorch_model.safetensors.index.fp16.json).
    if variant is None:
        return name
    stem, _, suffix = name.rpartition(".")
    return f"{stem}.{variant}.{suffix}"


def _diffusers_module(cls: Any, sub: Path, dtype: torch.dtype) -> Any:
    """A UNet or VAE built on meta and given the file's tensors: diffusers' from_pretrained would
    randomly initialise it first unless accelerate is installed (SDXL's UNet: 2.6 B values, ~20 s
    and 10 GB of fp32 on this CPU, for nothing). Falls back to from_pretrained for what it
    converts on load and we do not (legacy key names in old VAE exports)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files, variant = _weight_files(sub, "diffusers")
    try:
        state: dict[str, torch.Tensor] = {}
        for file in files:
            state.update(load_file(str(file)))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"model: cannot load {str(sub)!r}: {e}") from e
    config = dict(cls.load_config(sub))
    if cls.__name__ == "AutoencoderKL":
        dtype = vae_dtype(dtype, config)
    try:
        return build_on_meta(cls, config, state, sub, sub.name, "", dtype)
    except KeyMismatchError:
        return _from_pretrained(cls, sub, "diffusers", dtype, variant)


def _from_pretrained(cls: Any, sub: Path, library: str, dtype: torch.dtype, variant: str | None = None) -> Any:
    """One component through its own from_pretrained (offline); errors name the path."""
    if library == "transformers":
        _, variant = _weight_files(sub, library)
    try:
        model = cls.from_pretrained(sub, torch_dtype=dtype, variant=variant, local_files_only=True)
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
        # SD's and SDXL's tokenizers are CLIP's BPE, which open_clip's wheel ships: with it installed a
        # single file loads with no directory beside it, as it does in other SD front ends.
        bpe = find_open_clip_bpe()
        if bpe is None:
            raise ValueError(
                f"tokenizer: the single-file checkpoint {str(checkpoint)!r} carries no tokenizer; pass a directory "
                f"holding {wanted} (e.g. the model's diffusers directory) as the tokenizer directory (--tokenizer DIR), "
                "or install CLIP's BPE vocabulary with `pip install --no-deps open-clip-torch`"
            )
        tokenizer_dir = write_tokenizer_dirs(bpe, cache_dir() / "clip-tokenizers" / ("sdxl" if two else "sd15"), two)
    root = Path(tokenizer_dir)
    tokenizer = _tokenizer(CLIPTokenizer, root / "tokenizer")
    tokenizer_2 = _tokenizer(CLIPTokenizer, root / "tokenizer_2") if two else None
    return tokenizer, tokenizer_2


def random_components(
    arch: architectures.DiffusionArch,
    tokenizer_dir: str | Path,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    name: str = "",
) -> DiffusionComponents:
    """Random weights in an architecture's shapes (e.g. architectures.sdxl_base()): what the benchmarks
    and the profiler time, since a step's cost does not depend on the values. tokenizer_dir holds
    tokenizer/ (and tokenizer_2/), e.g. from clip_bpe.write_tokenizer_dirs."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    sdxl = arch["text_encoder_2"] is not None
    tokenizer, tokenizer_2 = _load_tokenizers(tokenizer_dir, sdxl, Path(name or arch["family"]))
    torch.manual_seed(seed)
    # Built directly in the target dtype (not fp32 then cast): SDXL's UNet in bf16 peaks at 5 GB, not 15.
    with _default_dtype(dtype):
        modules = {
            "unet": build_random(UNet2DConditionModel, arch["unet"], dtype, seed),
            "text_encoder": CLIPTextModel(CLIPTextConfig(**arch["text_encoder"])),
            "text_encoder_2": CLIPTextModelWithProjection(CLIPTextConfig(**arch["text_encoder_2"])) if sdxl else None,
        }
    modules["vae"] = build_random(AutoencoderKL, arch["vae"], vae_dtype(dtype, arch["vae"]), seed + 1)
    return DiffusionComponents(
        family=arch["family"],
        name=name or f"random-{arch['family']}",
        tokenizer=tokenizer,
        tokenizer_2=tokenizer_2,
        scheduler_config=dict(arch["scheduler"]),
        force_zeros_for_empty_prompt=bool(arch["force_zeros_for_empty_prompt"]),
        **{k: m.eval().requires_grad_(False) if m is not None else None for k, m in modules.items()},
    )


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
