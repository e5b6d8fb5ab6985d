"""OpenAI's /v1/images/generations wire format, and tacit's extensions to it.

OpenAI's fields: prompt, model, n, size ("WxH"), response_format, output_format,
output_compression, quality, style, background, user. tacit keeps no files, so images come back
inline (b64_json) and response_format "url" is refused. A field whose value tacit cannot honour
is a 400 naming it, never ignored (the house rule of protocol.py): a client that asked for
quality "hd" or style "vivid" must learn it did not get it. quality "auto" and background
"auto"/"opaque" are honoured as they stand: the server picks the work per image (`steps`), and a
diffusion model's images are opaque.

tacit's extensions, as vLLM-omni's image API has them: steps (vLLM-omni's name
num_inference_steps is taken too), guidance_scale, seed, negative_prompt, scheduler, priority.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import AliasChoices, BaseModel, Field, StrictFloat, StrictInt, StrictStr, field_validator

from tacit.entrypoints.openai.protocol import OpenAIModel

_SIZE = re.compile(r"^([1-9][0-9]{0,5})x([1-9][0-9]{0,5})$")

# The formats PIL writes without a plugin, which are OpenAI's three.
OUTPUT_FORMATS = ("png", "jpeg", "webp")


class ImageGenerationRequest(OpenAIModel):
    prompt: StrictStr
    model: StrictStr | None = None
    n: StrictInt | None = None  # unset: 1
    size: StrictStr | None = None  # "WxH"; unset or "auto": the model's native size
    response_format: StrictStr | None = None  # unset: b64_json
    output_format: Literal["png", "jpeg", "webp"] | None = None  # unset: png
    output_compression: StrictInt | None = None  # jpeg/webp quality, 0..100
    quality: StrictStr | None = None
    style: StrictStr | None = None
    background: StrictStr | None = None
    # OpenAI's end-user identifier, for abuse monitoring: it changes no image; the server logs it.
    user: StrictStr | None = None
    # ---- tacit's extensions (vLLM-omni's names) ----
    steps: StrictInt | None = Field(default=None, validation_alias=AliasChoices("steps", "num_inference_steps"))
    guidance_scale: StrictFloat | None = None
    seed: StrictInt | None = None
    negative_prompt: StrictStr | None = None
    scheduler: StrictStr | None = None
    priority: StrictInt = 0  # lower runs first, as the LLM routes' priority

    @field_validator("size")
    @classmethod
    def _size(cls, v: str | None) -> str | None:
        if v is not None and v != "auto" and not _SIZE.match(v):
            raise ValueError(f"{v!r} is not a size: send WIDTHxHEIGHT in pixels, e.g. '1024x1024', or 'auto'")
        return v

    @field_validator("response_format")
    @classmethod
    def _response_format(cls, v: str | None) -> str | None:
        if v == "url":
            raise ValueError(
                "'url' is not served: tacit keeps no image files to link to; send 'b64_json' (the image inline)"
            )
        if v is not None and v != "b64_json":
            raise ValueError(f"{v!r} is not a response format; valid: 'b64_json'")
        return v

    @field_validator("output_compression")
    @classmethod
    def _compression(cls, v: int | None) -> int | None:
        if v is not None and not 0 <= v <= 100:
            raise ValueError(f"{v} is out of range: send 0..100 (jpeg/webp quality, 100 the best)")
        return v

    @field_validator("quality")
    @classmethod
    def _quality(cls, v: str | None) -> str | None:
        if v is not None and v != "auto":
            raise ValueError(
                f"{v!r} is not honoured by tacit: how much work an image gets is set by `steps` (denoising "
                "steps); send quality 'auto' or leave it out"
            )
        return v

    @field_validator("style")
    @classmethod
    def _style(cls, v: str | None) -> str | None:
        if v is not None:
            raise ValueError(
                f"{v!r} is not honoured by tacit (a DALL-E 3 prompt rewrite); describe the style in the prompt and "
                "leave style out"
            )
        return v

    @field_validator("background")
    @classmethod
    def _background(cls, v: str | None) -> str | None:
        if v not in (None, "auto", "opaque"):
            raise ValueError(f"{v!r} is not served: a diffusion model's images are opaque; send 'auto' or 'opaque'")
        return v

    def dimensions(self, native: tuple[int, int]) -> tuple[int, int]:
        """(width, height) asked for; native (the model's own size) when size is unset or auto."""
        if self.size is None or self.size == "auto":
            return native
        m = _SIZE.match(self.size)
        assert m is not None  # checked by _size
        return int(m.group(1)), int(m.group(2))

    def image_format(self) -> str:
        fmt = self.output_format or "png"
        if self.output_compression is not None and fmt == "png":
            raise ValueError("output_compression applies to jpeg and webp only; png is lossless")
        return fmt


class ImageData(BaseModel):
    b64_json: str
    # tacit's: the seed this image's noise was drawn from (the request's seed + its index), so
    # any one image can be made again alone.
    seed: int


class ImagesResponse(BaseModel):
    created: int
    data: list[ImageData]
    output_format: str
    size: str
    # tacit's: where the time went, in seconds (queue, text encode, denoise, VAE decode).
    timings: dict[str, float]
