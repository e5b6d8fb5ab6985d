"""The pipeline with tacit's optimizations on (OptimizeOptions): the images of the unoptimised
pipeline, and no state carried from one request to the next (the prompt's cached K/V)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tiny_diffusion import write_diffusers_dir

from tacit.diffusion.optimize import OptimizeOptions
from tacit.diffusion.pipeline import ImagePipeline
from tacit.diffusion.request import ImageRequest

SIZE = 32
# float32 with fused QKV, channels-last and the fused resnet: the same products summed in another
# blocking order, a few ulps a layer (float32 eps 1.2e-7) -- 1e-6 observed after 3 steps and the
# decoder; 1e-4 leaves margin while a wrong K/V (another prompt's) moves pixels by > 1e-2
# (test_conditioning_reaches_the_image in test_diffusion_pipeline.py).
FP32_TOL = 1e-4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("sdxl") / "model"
    write_diffusers_dir(path, "tiny_sdxl")
    return path


def _images(pipe, prompt: str, seed: int) -> torch.Tensor:
    req = ImageRequest(prompt=prompt, width=SIZE, height=SIZE, steps=3, seed=seed)
    (images,), _, _ = pipe.generate_tensors([req])
    return images


def test_optimized_float32_pipeline_matches_plain_and_keeps_no_request_state(model_dir):
    plain = ImagePipeline.from_pretrained(model_dir)
    options = dataclasses.replace(OptimizeOptions(), dtype=torch.float32)
    fast = ImagePipeline.from_pretrained(model_dir, options=options)
    assert fast.optimization is not None and fast.optimization.prompt_kv is not None
    a, b = _images(plain, "a red cube", 1), _images(plain, "a blue sphere", 2)
    first_a = _images(fast, "a red cube", 1)
    second_b = _images(fast, "a blue sphere", 2)  # after a, whose prompt K/V was cached
    again_a = _images(fast, "a red cube", 1)
    assert (first_a - a).abs().max() < FP32_TOL
    assert (second_b - b).abs().max() < FP32_TOL
    assert torch.equal(first_a, again_a)
    assert (a - b).abs().max() > 1e-2  # the prompts do reach the image


def test_bf16_pipeline_within_psnr_of_float32(model_dir):
    plain = ImagePipeline.from_pretrained(model_dir)
    fast = ImagePipeline.from_pretrained(model_dir, options=OptimizeOptions())
    ref, out = _images(plain, "a red cube", 3), _images(fast, "a red cube", 3)
    mse = ((out.float() - ref) ** 2).mean().item()
    # bf16 keeps 8 bits of mantissa (relative 2^-9 a rounding); over 3 steps and the decoder the tiny
    # model's images stay above 30 dB (an 8-bit image's own quantisation is ~59 dB).
    assert 10 * torch.log10(torch.tensor(1.0 / max(mse, 1e-12))).item() > 30.0
