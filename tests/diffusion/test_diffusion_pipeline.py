"""tacit's ImagePipeline against diffusers' StableDiffusionXLPipeline / StableDiffusionPipeline on tiny random
models (float32): same weights, seed, scheduler and steps -> the same images within TOL.

TOL: tacit runs the same float32 operations in the same order as diffusers except two that
reorder summations: the VAE decodes one image at a time (diffusers decodes the batch; a conv's
blocking depends on the batch) and the guidance scale multiplies as a per-row tensor. Each
reordering moves a value by a few ulps (float32 eps 1.2e-7 at 1.0); through 3 steps and the
decoder that grows to the ~1e-6 observed. 1e-5 (~80 ulps of an output in [0, 1]) leaves 10x
margin, while any real divergence (a wrong time id, pooled embedding or guidance formula) moves
pixels by >= 1e-3: test_conditioning_reaches_the_image checks that scale on these tiny models.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_diffusion import write_diffusers_dir

from tacit.diffusion.pipeline import ImagePipeline
from tacit.diffusion.request import ImageRequest
from tacit.diffusion.schedulers import make_scheduler

TOL = 1e-5
SIZE = 32  # tiny VAE factor 2 -> 16x16 latents


@pytest.fixture(scope="module")
def sdxl(tmp_path_factory):
    path = tmp_path_factory.mktemp("sdxl") / "model"
    ref = write_diffusers_dir(path, "tiny_sdxl")
    return ref, ImagePipeline.from_pretrained(path)


@pytest.fixture(scope="module")
def sd15(tmp_path_factory):
    path = tmp_path_factory.mktemp("sd15") / "model"
    ref = write_diffusers_dir(path, "tiny_sd15")
    return ref, ImagePipeline.from_pretrained(path)


def _ours(pipe, **kw) -> np.ndarray:
    (images,), _, _ = pipe.generate_tensors([ImageRequest(**{"width": SIZE, "height": SIZE, **kw})])
    return images.permute(0, 2, 3, 1).numpy()


def _theirs(ref, pipe, req_kw: dict, **diffusers_kw) -> np.ndarray:
    ref.scheduler = make_scheduler(req_kw.get("scheduler", "euler"), pipe.components.scheduler_config)
    n, seed = req_kw.get("n", 1), req_kw["seed"]
    return ref(
        req_kw["prompt"],
        width=SIZE,
        height=SIZE,
        num_inference_steps=req_kw["steps"],
        guidance_scale=req_kw.get("guidance_scale", 5.0),
        num_images_per_prompt=n,
        generator=[torch.Generator().manual_seed(seed + i) for i in range(n)],
        output_type="np",
        **diffusers_kw,
    ).images


@pytest.mark.parametrize("scheduler", ["euler", "euler_a", "dpmpp_2m_karras"])
def test_sdxl_matches_diffusers(sdxl, scheduler):
    ref, pipe = sdxl
    kw = dict(prompt="the cat", n=2, steps=3, guidance_scale=5.0, seed=11, scheduler=scheduler)
    # tacit's negative_prompt "" is diffusers' None: SDXL zeroes the unconditional embeddings.
    np.testing.assert_allclose(_ours(pipe, **kw), _theirs(ref, pipe, kw, negative_prompt=None), atol=TOL, rtol=0)


def test_sdxl_negative_prompt_and_no_guidance_match_diffusers(sdxl):
    ref, pipe = sdxl
    kw = dict(prompt="a cat", negative_prompt="the", steps=2, guidance_scale=7.5, seed=3, scheduler="ddim")
    np.testing.assert_allclose(_ours(pipe, **kw), _theirs(ref, pipe, kw, negative_prompt="the"), atol=TOL, rtol=0)
    kw = dict(prompt="a cat", steps=2, guidance_scale=1.0, seed=3, scheduler="euler")  # one UNet pass a step
    np.testing.assert_allclose(_ours(pipe, **kw), _theirs(ref, pipe, kw), atol=TOL, rtol=0)


@pytest.mark.parametrize("scheduler", ["euler", "dpmpp_2m"])
def test_sd15_matches_diffusers(sd15, scheduler):
    ref, pipe = sd15
    kw = dict(prompt="the cat", negative_prompt="", n=2, steps=3, guidance_scale=6.0, seed=5, scheduler=scheduler)
    # SD 1.5 encodes "" for the unconditional branch, as diffusers does with negative_prompt "".
    np.testing.assert_allclose(_ours(pipe, **kw), _theirs(ref, pipe, kw, negative_prompt=""), atol=TOL, rtol=0)


def test_conditioning_reaches_the_image(sdxl):
    """The tolerance means something only if prompt, guidance and size conditioning move the pixels."""
    _, pipe = sdxl
    base = dict(prompt="the cat", steps=2, seed=1)
    image = _ours(pipe, **base)
    assert np.abs(image - _ours(pipe, **{**base, "prompt": "xyz"})).max() > 1e3 * TOL
    assert np.abs(image - _ours(pipe, **{**base, "guidance_scale": 2.0})).max() > 1e3 * TOL
    assert np.abs(image - _ours(pipe, **{**base, "seed": 2})).max() > 1e3 * TOL


def test_seeds_reproducible_and_reported(sdxl):
    _, pipe = sdxl
    req = ImageRequest("the cat", width=SIZE, height=SIZE, steps=2, seed=None, scheduler="euler_a", n=2)
    (first,), (seed,), _ = pipe.generate_tensors([req])
    assert 0 <= seed
    (again,), _, _ = pipe.generate_tensors([ImageRequest(**{**req.__dict__, "seed": seed})])
    assert torch.equal(first, again)
    # image i of a request is seeded seed + i: image 1 of seed s is image 0 of seed s + 1
    (shifted,), _, _ = pipe.generate_tensors([ImageRequest(**{**req.__dict__, "seed": seed + 1, "n": 1})])
    torch.testing.assert_close(shifted[0], first[1], atol=TOL, rtol=0)


def test_batched_requests_equal_each_alone(sdxl):
    """Different prompts, seeds, guidance scales and n in one UNet batch: each as if run alone."""
    _, pipe = sdxl
    common = dict(width=SIZE, height=SIZE, steps=3, scheduler="euler_a")
    reqs = [
        ImageRequest("the cat", seed=21, guidance_scale=5.0, n=2, request_id="a", **common),
        ImageRequest("xyz", negative_prompt="the", seed=4, guidance_scale=8.0, request_id="b", **common),
    ]
    assert pipe.batch_key(reqs[0]) == pipe.batch_key(reqs[1])
    batched, seeds, _ = pipe.generate_tensors(reqs)
    assert seeds == [21, 4]
    for req, together in zip(reqs, batched):
        (alone,), _, _ = pipe.generate_tensors([req])
        assert together.shape == (req.n, 3, SIZE, SIZE)
        torch.testing.assert_close(together, alone, atol=TOL, rtol=0)


def test_generate_returns_pil_and_reports_steps(sdxl):
    _, pipe = sdxl
    steps = []
    req = ImageRequest("the cat", width=SIZE, height=2 * SIZE, steps=3, seed=9, n=2, request_id="r1")
    (result,) = pipe.generate([req], on_step=lambda done, total: steps.append((done, total)))
    assert steps == [(1, 3), (2, 3), (3, 3)]
    assert result.request_id == "r1" and result.seed == 9 and len(result.images) == 2
    assert result.images[0].size == (SIZE, 2 * SIZE) and result.images[0].mode == "RGB"
    assert set(result.timings) == {"text_encode_s", "denoise_s", "vae_decode_s"}
    (tensors,), _, _ = pipe.generate_tensors([req])
    pixels = np.asarray(result.images[1], dtype=np.float32) / 255
    assert np.abs(pixels - tensors[1].permute(1, 2, 0).numpy()).max() <= 0.5 / 255 + 1e-6  # rounded, not truncated


def test_incompatible_batch_and_empty_batch_rejected(sdxl):
    _, pipe = sdxl
    a = ImageRequest("x", width=SIZE, height=SIZE, steps=2)
    with pytest.raises(ValueError, match="batch_key"):
        pipe.generate([a, ImageRequest("x", width=SIZE, height=SIZE, steps=3)])
    with pytest.raises(ValueError, match="batch_key"):
        pipe.generate([a, ImageRequest("x", width=SIZE, height=SIZE, steps=2, guidance_scale=1.0)])
    with pytest.raises(ValueError, match="at least one"):
        pipe.generate([])


def test_bad_request_fails_before_any_model_work(sdxl, monkeypatch):
    _, pipe = sdxl

    def boom(*a, **k):
        raise AssertionError("the text encoders ran for an invalid request")

    monkeypatch.setattr(pipe, "_encode", boom)
    ok = ImageRequest("x", width=SIZE, height=SIZE, steps=2)
    for field, value, message in [
        ("width", SIZE + 2, "width=34: must be a multiple of 4 between 4 and 128"),
        ("height", 256, "height=256: must be a multiple of 4 between 4 and 128"),
        ("steps", 0, "steps=0: must be an integer between 1 and 1000"),
        ("guidance_scale", float("nan"), "guidance_scale=nan: must be a finite number"),
        ("scheduler", "plms", "scheduler='plms': must be one of euler, euler_a"),
        ("n", 9, "n=9: must be an integer between 1 and 8"),
    ]:
        with pytest.raises(ValueError, match=message.replace("(", r"\(")):
            pipe.generate([ok, ImageRequest(**{**ok.__dict__, field: value})])
