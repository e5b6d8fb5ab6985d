"""`tacit bench image` on a tiny SDXL-architecture UNet and VAE: the engines end to end in their
own processes, the FLOP counter against a hand count, and a missing or crashing peer reported
while the others' rows stand."""

from __future__ import annotations

import argparse
import importlib.util
import sys

import pytest
import torch

from tacit.bench.image import check_engines, run_image_bench
from tacit.bench.image_models import ImageShape, count_flops, flops_of, psnr
from tacit.bench.image_tacit import check_variants, parse_tacit_options

HAVE_OPTIMIZE = importlib.util.find_spec("tacit.diffusion") is not None and (
    importlib.util.find_spec("tacit.diffusion.optimize") is not None
)


def bench_args(**kw) -> argparse.Namespace:
    base = dict(model="tiny", size=32, steps=1, rounds=1, engines="diffusers", variants="", guidance_scale=5.0,
                seed=0, peak_tflops=1.0, peer_timeout=600.0, tacit_options="", json=None, dtype="auto")  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


def test_conv_flops_match_a_hand_count():
    conv = torch.nn.Conv2d(4, 8, 3, padding=1, device="meta")
    x = torch.empty(1, 4, 16, 16, device="meta")
    # every output element (8 x 16 x 16) is 4 x 3 x 3 multiply-adds, 2 FLOPs each
    assert flops_of(lambda: conv(x)) == 2 * (8 * 16 * 16) * (4 * 3 * 3)


def test_sdxl_unet_flops_are_the_published_order():
    # SDXL's UNet at 1024x1024 is ~6.7 TFLOP a batch-1 call; CFG doubles it
    f = count_flops(ImageShape("sdxl", 1024, 1))
    assert 12e12 < f["unet_flops"] < 15e12
    assert 2.5e9 < f["unet_params"] < 2.6e9  # 2.567B parameters
    assert 80e6 < f["vae_params"] < 90e6


def test_sd15_unet_has_no_added_conditioning_and_its_published_size():
    # SD 1.5: 859.52M UNet parameters; ~0.8 TFLOP a batch-1 call at 512x512, CFG doubles it
    f = count_flops(ImageShape("sd15", 512, 1))
    assert 859e6 < f["unet_params"] < 860e6
    assert 1.4e12 < f["unet_flops"] < 1.8e12


def test_bad_names_are_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match="diffusers, openvino, tacit"):
        check_engines(["pytorch"])
    with pytest.raises(ValueError, match="int8, deepcache"):
        check_variants(["fp8"])
    with pytest.raises(ValueError, match="field=value"):
        parse_tacit_options("compile")
    assert parse_tacit_options("compile=true,vae_tile_latent=0,x=none") == {
        "compile": True, "vae_tile_latent": 0, "x": None}  # fmt: skip


def test_bench_dtype_is_checked():
    assert ImageShape("tiny", 32, 1, dtype="float32").torch_dtype is torch.float32
    with pytest.raises(ValueError, match="auto, bfloat16, float32"):
        _ = ImageShape("tiny", 32, 1, dtype="float16").torch_dtype


def test_psnr():
    ref = torch.linspace(-1, 1, 100)
    assert psnr(ref, ref) == float("inf")
    assert 19.9 < psnr(ref + 0.2, ref) < 20.1  # peak 2, error 0.2: 20 dB


def test_tiny_end_to_end_diffusers_and_tacit():
    from tacit.platforms.cpu import bf16_matmul_is_native

    result = run_image_bench(bench_args(engines="diffusers,tacit", steps=2))
    # auto: bf16 where oneDNN runs it, float32 where bf16 would be torch's scalar fallback
    assert result["dtype"] == ("bfloat16" if bf16_matmul_is_native() else "float32")
    rows = {r["engine"]: r for r in result["engines"]}
    d = rows["diffusers"]
    assert d["unet_step_s"] > 0 and d["vae_decode_s"] > 0
    assert d["unet_TFLOPs"] == pytest.approx(result["flops"]["unet_flops"] / d["unet_step_s"] / 1e12)
    assert d["unet_pct_peak"] == pytest.approx(100 * d["unet_TFLOPs"] / result["peak_TFLOPs"])  # --peak-tflops 1.0
    if HAVE_OPTIMIZE:
        # same weights and inputs, the same dtype: the optimized path computes the same image
        assert rows["tacit"]["psnr_vs_diffusers_db"] > 30
        assert any(line.startswith("tacit/diffusers: UNet step") for line in result["ratios"])
    else:
        assert "tacit" not in rows
        assert "tacit.diffusion.optimize" in result["skipped"]["tacit"]


@pytest.mark.parametrize(
    "body, expected",
    [
        ("raise ImportError('no openvino here (test)')", "openvino is not installed"),
        ("import os\nos._exit(3)", "exited with code 3"),
    ],
)
def test_missing_or_crashing_peer_is_reported_not_fatal(tmp_path, monkeypatch, body, expected):
    # The engine's child process is spawned with this process's sys.path, so it imports this
    # openvino: one that is not installed, or one that kills the process while loading.
    (tmp_path / "openvino").mkdir()
    (tmp_path / "openvino" / "__init__.py").write_text(body + "\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    result = run_image_bench(bench_args(engines="openvino,diffusers"))
    assert [r["engine"] for r in result["engines"]] == ["diffusers"]
    assert expected in result["skipped"]["openvino"]
