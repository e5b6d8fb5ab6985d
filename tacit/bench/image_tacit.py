"""The tacit engine of `tacit bench image`: tacit.diffusion.optimize.apply_optimizations on the same
bf16 UNet and VAE the other engines get. Variants (int8 linears, DeepCache-style step caching) are
OptimizeOptions fields switched on over the defaults; they are reported on their own, never as
tacit's number (they change the output: their PSNR is printed beside them)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

# --variants name -> the OptimizeOptions fields it sets over the defaults. DeepCache every 3rd call
# full: the interval diffusers' DeepCache helper defaults to.
VARIANTS: dict[str, dict[str, Any]] = {
    "int8": {"int8_linears": True},
    "deepcache": {"deepcache_interval": 3},
}


def check_variants(names: list[str]) -> None:
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise ValueError(f"--variants {unknown[0]!r}: one of {', '.join(VARIANTS)}")


def parse_tacit_options(text: str) -> dict[str, Any]:
    """--tacit-options 'compile=true,vae_tile_latent=0' -> {'compile': True, 'vae_tile_latent': 0}
    (true/false, none, ints and floats; anything else stays a string)."""
    out: dict[str, Any] = {}
    for item in (s.strip() for s in text.split(",") if s.strip()):
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--tacit-options {item!r}: expected field=value, e.g. compile=true")
        low = raw.strip().lower()
        value: Any = {"true": True, "false": False, "none": None}.get(low, raw.strip())
        if isinstance(value, str):
            for cast in (int, float):
                try:
                    value = cast(low)
                    break
                except ValueError:
                    pass
        out[key.strip()] = value
    return out


def _components(unet: torch.nn.Module, vae: torch.nn.Module) -> Any:
    """A DiffusionComponents holding only the UNet and VAE (no text encoder runs in the benchmark)."""
    from tacit.diffusion.loader import DiffusionComponents

    fields = {f.name: None for f in dataclasses.fields(DiffusionComponents)}
    return DiffusionComponents(**{**fields, "unet": unet, "vae": vae})


def tacit_modules(unet: torch.nn.Module, vae: torch.nn.Module, variant: str = "",
                  overrides: dict[str, Any] | None = None) -> tuple[Any, Any, str, Callable[[], None]]:  # fmt: skip
    """(unet callable, vae, note, reset) after apply_optimizations (in place) with the default
    options, `overrides` and `variant`'s fields; reset() drops per-request state (the prompt's
    K/V, DeepCache's features) and runs before each round, as at the end of a request."""
    from tacit.diffusion.optimize import OptimizeOptions, apply_optimizations

    fields = dict(overrides or {})
    if variant:
        check_variants([variant])
        fields.update(VARIANTS[variant])
    names = {f.name for f in dataclasses.fields(OptimizeOptions)}
    unknown = [k for k in fields if k not in names]
    if unknown:
        raise ValueError(f"OptimizeOptions has no field {unknown[0]!r}; its fields: {', '.join(sorted(names))}")
    options = dataclasses.replace(OptimizeOptions(), **fields)
    components = _components(unet, vae)
    state = apply_optimizations(components, options)
    unet_call, reset = state.unet_call, state.end_request
    changed = ", ".join(f"{k}={v}" for k, v in fields.items()) or "defaults"
    return unet_call, components.vae, f"apply_optimizations(OptimizeOptions({changed}))", reset
