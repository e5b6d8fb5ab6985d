"""The component configs `tacit predict` counts a diffusion model from: the published SDXL base
and SD 1.5 architectures by name, or a diffusers directory's own config files.

The named ones are the pipeline's own published configs (tacit/diffusion/architectures.py), so
the model prices exactly what the pipeline builds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tacit.diffusion.architectures import get_arch


@dataclass(frozen=True)
class DiffusionConfigs:
    name: str
    unet: dict[str, Any]
    vae: dict[str, Any]
    text_encoders: tuple[dict[str, Any], ...]

    @property
    def is_sdxl(self) -> bool:
        return self.unet.get("addition_embed_type") == "text_time"


def _named(name: str, arch: str) -> DiffusionConfigs:
    a = get_arch(arch)
    encoders = tuple(a[k] for k in ("text_encoder", "text_encoder_2") if a.get(k) is not None)
    return DiffusionConfigs(name, a["unet"], a["vae"], encoders)


NAMED: dict[str, DiffusionConfigs] = {"sdxl-base": _named("sdxl-base", "sdxl"), "sd15": _named("sd15", "sd15")}
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
