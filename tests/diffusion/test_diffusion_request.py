"""Request validation (no model needed), scheduler selection, and the published architecture configs."""

from __future__ import annotations

import pytest
import torch

from tacit.diffusion import ImageLimits, ImageRequest
from tacit.diffusion.architectures import get_arch
from tacit.diffusion.schedulers import SCHEDULER_NAMES, make_scheduler

LIMITS = ImageLimits(min_size=64, max_size=2048, size_multiple=32, max_steps=1000, max_n=8)


def test_valid_request_passes():
    LIMITS.validate(ImageRequest("a cat", width=1024, height=768, steps=30, seed=0, n=8, guidance_scale=0.0))


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("width", 1000, "width=1000: must be a multiple of 32 between 64 and 2048"),
        ("height", 32, "height=32: must be a multiple of 32 between 64 and 2048"),
        ("height", 4096, "height=4096: must be a multiple of 32"),
        ("width", 512.0, "width=512.0: must be a multiple"),
        ("steps", 0, "steps=0: must be an integer between 1 and 1000"),
        ("steps", 1001, "steps=1001: must be an integer between 1 and 1000"),
        ("steps", True, "steps=True: must be an integer"),
        ("n", 0, "n=0: must be an integer between 1 and 8"),
        ("guidance_scale", float("inf"), "guidance_scale=inf: must be a finite number >= 0"),
        ("guidance_scale", float("nan"), "guidance_scale=nan: must be a finite number >= 0"),
        ("guidance_scale", -1.0, "guidance_scale=-1.0: must be a finite number >= 0"),
        ("guidance_scale", "7", "guidance_scale='7': must be a finite number"),
        ("seed", -1, "seed=-1: must be an integer between 0 and"),
        ("seed", 2**63, "seed=9223372036854775808: must be an integer between 0 and"),
        ("scheduler", "k_lms", "scheduler='k_lms': must be one of euler, euler_a, ddim, dpmpp_2m"),
        ("prompt", None, "prompt=None: must be a string"),
        ("negative_prompt", None, "negative_prompt=None: must be a string"),
        ("priority", 1.5, "priority=1.5: must be an integer"),
    ],
)
def test_invalid_field_named_with_valid_range(field, value, message):
    req = ImageRequest("a cat", width=512, height=512, steps=20)
    setattr(req, field, value)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        LIMITS.validate(req)


def test_every_scheduler_builds_from_a_checkpoint_schedule():
    base = get_arch("sdxl")["scheduler"]
    for name in SCHEDULER_NAMES:
        scheduler = make_scheduler(name, base)
        scheduler.set_timesteps(4)
        assert len(scheduler.timesteps) == 4, name
        assert scheduler.config.beta_schedule == "scaled_linear"
    assert make_scheduler("dpmpp_2m_karras", base).config.use_karras_sigmas
    # the checkpoint's spacing survives the choice of sampler (SDXL-Lightning ships "trailing")
    assert make_scheduler("euler", {**base, "timestep_spacing": "trailing"}).config.timestep_spacing == "trailing"
    with pytest.raises(ValueError, match="scheduler='plms': must be one of euler"):
        make_scheduler("plms", base)


@pytest.mark.parametrize(
    "name, counts",
    [
        # the published parameter counts of stabilityai/stable-diffusion-xl-base-1.0 and stable-diffusion-v1-5
        (
            "sdxl",
            {"unet": 2_567_463_684, "vae": 83_653_863, "text_encoder": 123_060_480, "text_encoder_2": 694_659_840},
        ),
        ("sd15", {"unet": 859_520_964, "vae": 83_653_863, "text_encoder": 123_060_480}),
    ],
)
def test_published_configs_have_the_published_sizes(name, counts):
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    arch = get_arch(name)
    with torch.device("meta"):  # shapes only: no memory for 3.5 B parameters
        built = {
            "unet": UNet2DConditionModel.from_config(arch["unet"]),
            "vae": AutoencoderKL.from_config(arch["vae"]),
            "text_encoder": CLIPTextModel(CLIPTextConfig(**arch["text_encoder"])),
        }
        if arch["text_encoder_2"]:
            built["text_encoder_2"] = CLIPTextModelWithProjection(CLIPTextConfig(**arch["text_encoder_2"]))
    assert {k: sum(p.numel() for p in m.parameters()) for k, m in built.items()} == counts


def test_get_arch_returns_independent_copies():
    a = get_arch("tiny_sdxl")
    a["unet"]["block_out_channels"].append(1)
    assert get_arch("tiny_sdxl")["unet"]["block_out_channels"] == [32, 64]
    assert get_arch("sdxl")["vae"]["block_out_channels"] == [128, 256, 512, 512]
    with pytest.raises(ValueError, match="architecture='sd3': must be one of"):
        get_arch("sd3")
