"""An image request, the limits a loaded model puts on it, and its result.

Validation runs before any tensor is allocated, so a bad request costs nothing and the error
names the field, the value and what would be valid (the server turns it into a 400).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tacit.diffusion.schedulers import SCHEDULER_NAMES

if TYPE_CHECKING:
    from PIL import Image

# torch.Generator.manual_seed takes a 64-bit value; image i of a request uses seed + i, so the seed
# stays below 2**63 - max_n to keep every per-image seed in range and distinct from its neighbours'.
MAX_SEED = 2**63 - 1


@dataclass
class ImageRequest:
    prompt: str
    negative_prompt: str = ""
    n: int = 1  # images for this prompt
    width: int = 1024
    height: int = 1024
    steps: int = 30
    guidance_scale: float = 5.0  # <= 1.0 means no classifier-free guidance (one UNet pass a step)
    seed: int | None = None  # None: drawn at random, reported back
    scheduler: str = "euler"
    priority: int = 0  # lower runs first, as tacit's LLM priority scheduling
    request_id: str = ""

    @property
    def uses_cfg(self) -> bool:
        return self.guidance_scale > 1.0


@dataclass
class ImageLimits:
    """What a loaded model takes; errors name the field and the valid range."""

    min_size: int
    max_size: int
    size_multiple: int
    max_steps: int
    max_n: int
    schedulers: tuple[str, ...] = field(default=SCHEDULER_NAMES)

    def validate(self, req: ImageRequest) -> None:
        if not isinstance(req.prompt, str):
            raise ValueError(f"prompt={req.prompt!r}: must be a string")
        if not isinstance(req.negative_prompt, str):
            raise ValueError(f"negative_prompt={req.negative_prompt!r}: must be a string ('' for none)")
        for name in ("width", "height"):
            value = getattr(req, name)
            if not _is_int(value) or value % self.size_multiple or not self.min_size <= value <= self.max_size:
                raise ValueError(
                    f"{name}={value!r}: must be a multiple of {self.size_multiple} "
                    f"between {self.min_size} and {self.max_size}"
                )
        if not _is_int(req.steps) or not 1 <= req.steps <= self.max_steps:
            raise ValueError(f"steps={req.steps!r}: must be an integer between 1 and {self.max_steps}")
        if not _is_int(req.n) or not 1 <= req.n <= self.max_n:
            raise ValueError(f"n={req.n!r}: must be an integer between 1 and {self.max_n}")
        g = req.guidance_scale
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not math.isfinite(g) or g < 0:
            raise ValueError(f"guidance_scale={g!r}: must be a finite number >= 0 (<= 1 turns guidance off)")
        if req.seed is not None and (not _is_int(req.seed) or not 0 <= req.seed <= MAX_SEED - self.max_n):
            raise ValueError(f"seed={req.seed!r}: must be an integer between 0 and {MAX_SEED - self.max_n}")
        if req.scheduler not in self.schedulers:
            raise ValueError(f"scheduler={req.scheduler!r}: must be one of {', '.join(self.schedulers)}")
        if not _is_int(req.priority):
            raise ValueError(f"priority={req.priority!r}: must be an integer (lower runs first)")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class ImageResult:
    request_id: str
    images: list[Image.Image]
    seed: int
    timings: dict[str, float]  # "text_encode_s", "denoise_s", "vae_decode_s"
