"""The fused ResnetBlock2D forward (residual add as conv2's oneDNN post-op, no divide by 1.0) equals diffusers'."""

from __future__ import annotations

import copy

import torch
from diffusers.models.resnet import ResnetBlock2D
from optimize_tiny import tiny_unet, tiny_vae, unet_inputs

from tacit.diffusion.fused_resnet import install_fused_resnets


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    # float32: the fused conv may add the residual inside oneDNN's accumulator instead of after the
    # rounding to float32 (a few ulps); measured bit-identical (0.0) on this CPU for both tiny models.
    # Bound 1e-5 of the output's scale, for oneDNN kernels that round differently on other CPUs.
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()


def test_fused_vae_decode_equals_diffusers_float32():
    vae = tiny_vae()
    fast = copy.deepcopy(vae)
    # every decoder and encoder ResnetBlock2D (time_embedding_norm "group", no temb) qualifies
    assert install_fused_resnets(fast) == sum(isinstance(m, ResnetBlock2D) for m in vae.modules())
    z = torch.randn(1, 4, 24, 24, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        _close(fast.decode(z).sample, vae.decode(z).sample)
        z_cl = z.to(memory_format=torch.channels_last)
        _close(fast.to(memory_format=torch.channels_last).decode(z_cl).sample, vae.decode(z).sample)


def test_fused_unet_equals_diffusers_float32():
    unet = tiny_unet()
    fast = copy.deepcopy(unet)
    eligible = install_fused_resnets(fast)
    # blocks with a resampler inside (none in this config) keep diffusers' forward; the rest take ours
    assert 0 < eligible <= sum(isinstance(m, ResnetBlock2D) for m in unet.modules())
    inputs = unet_inputs()
    with torch.inference_mode():
        _close(fast(**inputs).sample, unet(**inputs).sample)


def test_blocks_that_differ_are_left_alone():
    block = ResnetBlock2D(in_channels=16, out_channels=16, temb_channels=None, groups=8, up=True).eval()
    assert install_fused_resnets(block) == 0 and "forward" not in block.__dict__
