"""tacit profile on a text-to-image model: a tiny random SDXL-architecture UNet and VAE saved in
the diffusers layout, timed per block, the VAE's working sets set against the caches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tacit.cli import main
from tacit.profiler.cpu_caches import cpu_caches, level_holding
from tacit.profiler.diffusion import profile_diffusion, report_lines


def _tiny_sdxl(root: Path) -> Path:
    from diffusers import AutoencoderKL, UNet2DConditionModel

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        sample_size=8,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        block_out_channels=(32, 64),
        layers_per_block=1,
        transformer_layers_per_block=(1, 2),
        attention_head_dim=(2, 4),
        cross_attention_dim=32,
        norm_num_groups=16,
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=80,
    )
    vae = AutoencoderKL(
        block_out_channels=(16, 32),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        norm_num_groups=16,
    )
    unet.save_pretrained(root / "unet")
    vae.save_pretrained(root / "vae")
    (root / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionXLPipeline"}))
    return root


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny_sdxl(tmp_path_factory.mktemp("tiny-sdxl"))


def test_profile_returns_the_block_rows(tiny_dir: Path) -> None:
    caches = {"L1": 48 << 10, "L2": 128 << 10, "L3": 200 << 10}
    p = profile_diffusion(tiny_dir, 128, 128, steps=1, repeats=1, dtype=torch.float32, caches=caches)
    rows = {(r["component"], r["block"]): r for r in p["blocks"]}
    for key in (
        ("unet", "down_blocks.0.resnets.0"),
        ("unet", "down_blocks.1.attentions.0"),
        ("unet", "mid_block.attentions.0"),
        ("vae", "decoder.mid_block.resnets.0"),
        ("vae", "decoder.up_blocks.1.resnets.0"),
    ):
        assert rows[key]["measured_s"] > 0 and rows[key]["flops"] > 0, key
    # the decoder's last up block runs at its output's 32x32 (a 32-channel input: 32 x 32 x 32 x
    # 4 B = 128 KiB, its GroupNorm's in and out 256 KiB): past the 200 KiB "L3"; the mid block at
    # the 16x16 latent (96 KiB) fits the 128 KiB "L2"
    assert rows[("vae", "decoder.up_blocks.1.resnets.0")]["held_in"] == "DRAM"
    assert rows[("vae", "decoder.mid_block.resnets.0")]["held_in"] in ("L1", "L2")
    assert 0 < p["vae_share"] < 1 and p["vae_achieved_gb_s"] > 0
    text = "\n".join(report_lines(p, read_bandwidth=20e9))
    assert "VAE cache locality" in text and "decoder.up_blocks.1.resnets.0 DRAM" in text and "of the 20.0 GB/s" in text


def test_profile_cli_on_a_diffusers_dir(tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "prof"
    argv = ["profile", "--model", str(tiny_dir), "--size", "64x64", "--steps", "1", "--repeats", "1"]
    assert main([*argv, "--dtype", "float32", "--no-measure-hw", "--out", str(out)]) == 0
    d = json.loads((out / "profile.json").read_text())
    assert d["kind"] == "diffusion" and {r["component"] for r in d["blocks"]} == {"unet", "vae"}
    assert "VAE decode" in capsys.readouterr().out


def test_cpu_caches_read_sysfs(tmp_path: Path) -> None:
    for i, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2048K")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    caches = cpu_caches(tmp_path)
    assert caches == {"L1": 48 << 10, "L2": 2 << 20}
    assert level_holding(1 << 20, caches) == "L2" and level_holding(3 << 20, caches) == "DRAM"
    assert cpu_caches(tmp_path / "none") == {}


def test_profile_refuses_a_name_and_llm_runs_refuse_the_image_flags(capsys: pytest.CaptureFixture) -> None:
    assert main(["profile", "--model", "sdxl-base", "--no-measure-hw"]) != 0
    assert "the names sdxl-base and sd15 are for tacit predict" in capsys.readouterr().err
    assert main(["profile", "--model", "random:qwen3-100m", "--steps", "3", "--no-measure-hw"]) != 0
    assert "--steps: text-to-image flags" in capsys.readouterr().err
