"""DeepCache-style step caching (Ma et al. 2023): the UNet's deep features reused across steps.

Adjacent denoising steps change the deep, low-resolution features of the UNet little; the
shallowest down and up blocks carry the detail. Every `interval`-th UNet call runs in full and
records the output of up_blocks[-2]; the calls between run only conv_in, down_blocks[0] (without
its downsampler), up_blocks[-1] and conv_out, and replay the recorded features for everything
deeper. For SDXL at 1024x1024 the skipped blocks hold ~90% of the step's multiply-adds (the two
10-layer transformer levels), so interval N costs about (1 + 0.1 * (N - 1)) / N full steps.
This is step skipping in all but name: it changes the image (its PSNR against the uncached output
is measured in tests/diffusion/test_optimize_deepcache.py) and is an opt-in, reported on its own.

It works on diffusers' own UNet2DConditionModel.forward: skipped blocks get an instance-level
`forward` that returns the recorded output, installed for one call and removed after, so the
model definition is not copied. The skipped down blocks return the last full step's outputs only
so that forward finds the right number of residuals; those values reach no block that runs.
A new request is detected as a new prompt tensor (the same rule as the prompt K/V cache), and
then the next call runs in full.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class DeepCache:
    """Installed on a UNet2DConditionModel by `DeepCache.attach(unet, interval)`."""

    def __init__(self, unet: nn.Module, interval: int) -> None:
        if interval < 2:
            raise ValueError(f"deepcache_interval={interval}: must be >= 2 (1 would be a full step every call)")
        for name in ("down_blocks", "up_blocks", "mid_block"):
            if not hasattr(unet, name):
                raise ValueError(
                    f"DeepCache needs a UNet2DConditionModel-like model; {type(unet).__name__} has no {name}"
                )
        if len(unet.down_blocks) < 2 or len(unet.up_blocks) < 2:
            raise ValueError("DeepCache needs at least two down and two up blocks")
        self.unet = unet
        self.interval = interval
        self.calls = 0
        self.full_calls = 0
        self._prompt: torch.Tensor | None = None
        self._recorded: dict[int, Any] = {}
        first = unet.down_blocks[0]
        downsampler = first.downsamplers[0] if getattr(first, "downsamplers", None) else None
        # The modules whose work a cached call skips, in the order forward calls them.
        self._skipped: list[nn.Module] = (
            ([downsampler] if downsampler is not None else [])
            + list(unet.down_blocks[1:])
            + [unet.mid_block]
            + list(unet.up_blocks[:-1])
        )
        self._handles = [m.register_forward_hook(self._record) for m in self._skipped]
        self._handles.append(unet.register_forward_pre_hook(self._before, with_kwargs=True))
        self._handles.append(unet.register_forward_hook(self._after))

    @classmethod
    def attach(cls, unet: nn.Module, interval: int) -> DeepCache:
        return cls(unet, interval)

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._clear_replay()

    def _record(self, module: nn.Module, args: Any, output: Any) -> None:
        if "forward" not in module.__dict__:  # a full call, not a replay
            self._recorded[id(module)] = output

    @staticmethod
    def _prompt_of(args: tuple, kwargs: dict) -> torch.Tensor | None:
        if "encoder_hidden_states" in kwargs:
            return kwargs["encoder_hidden_states"]
        return args[2] if len(args) > 2 else None

    def _before(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        prompt = self._prompt_of(args, kwargs)
        if prompt is not self._prompt:
            self._prompt, self.calls = prompt, 0
        full = self.calls % self.interval == 0 or len(self._recorded) < len(self._skipped)
        if not full:
            for m in self._skipped:
                out = self._recorded[id(m)]
                m.forward = lambda *a, _out=out, **k: _out
        else:
            self.full_calls += 1
        self.calls += 1

    def _after(self, module: nn.Module, args: Any, output: Any) -> None:
        self._clear_replay()

    def _clear_replay(self) -> None:
        for m in self._skipped:
            m.__dict__.pop("forward", None)

    def reset(self) -> None:
        """Forget the recorded features (the next call runs in full)."""
        self._recorded.clear()
        self._prompt, self.calls = None, 0
