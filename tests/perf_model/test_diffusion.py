"""tacit predict on text-to-image models: per-block counts against hand formulas and against a
real run, the priced image monotonic in size and steps, the CLI's per-block JSON."""

from __future__ import annotations

import json

import pytest
import torch

from tacit.cli import main
from tacit.perf_model.diffusion_configs import NAMED, DiffusionConfigs
from tacit.perf_model.diffusion_count import count_blocks
from tacit.perf_model.diffusion_models import count_request, unet_inputs
from tacit.perf_model.diffusion_predict import predict_image
from tacit.perf_model.efficiency import load_profile
from tacit.platforms.hardware_table import get_hardware_spec

# An SDXL-architecture UNet (text_time conditioning, linear projections, 2 transformer layers in
# the second block) small enough to run on real tensors in a test.
TINY_UNET = {
    "sample_size": 8,
    "in_channels": 4,
    "out_channels": 4,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D"],
    "up_block_types": ["CrossAttnUpBlock2D", "UpBlock2D"],
    "block_out_channels": [32, 64],
    "layers_per_block": 1,
    "transformer_layers_per_block": [1, 2],
    "attention_head_dim": [2, 4],
    "cross_attention_dim": 32,
    "norm_num_groups": 16,
    "use_linear_projection": True,
    "addition_embed_type": "text_time",
    "addition_time_embed_dim": 8,
    "projection_class_embeddings_input_dim": 80,
}


def _flops(rows: list) -> float:
    return sum(r.flops for r in rows)


def test_resnet_block_flops_match_the_hand_formula() -> None:
    from diffusers.models.resnet import ResnetBlock2D

    b, c, h, w, temb = 2, 64, 16, 16, 128
    with torch.device("meta"):
        block = ResnetBlock2D(in_channels=c, out_channels=c, temb_channels=temb, groups=16)
        x, t = torch.randn(b, c, h, w), torch.randn(b, temb)
    rows = count_blocks(block, lambda: block(x, t), "unet", is_block=lambda n: False)
    # two 3x3 convs C -> C at every position, and the time embedding's C-wide projection
    assert _flops(rows) == 2 * (2 * b * h * w * c * c * 9) + 2 * b * temb * c
    assert rows[0].attention_flops == 0


def test_attention_block_flops_match_the_hand_formula() -> None:
    from diffusers.models.attention import BasicTransformerBlock

    b, n, m, d, heads, ctx = 2, 64, 77, 64, 4, 48
    with torch.device("meta"):
        block = BasicTransformerBlock(d, heads, d // heads, cross_attention_dim=ctx)
        x, e = torch.randn(b, n, d), torch.randn(b, m, ctx)
    rows = count_blocks(block, lambda: block(x, encoder_hidden_states=e), "unet", is_block=lambda n: False)
    attention = 4 * b * n * n * d + 4 * b * n * m * d  # QK^T and PV: self (n x n), cross (n x m)
    projections = 4 * 2 * b * n * d * d + 2 * 2 * b * n * d * d + 2 * 2 * b * m * ctx * d  # q,k,v,o; q,o; k,v
    feed_forward = 2 * b * n * d * 8 * d + 2 * b * n * 4 * d * d  # GEGLU: D -> 2 x 4D, then 4D -> D
    assert sum(r.attention_flops for r in rows) == attention
    assert sum(r.gemm_flops for r in rows) == projections + feed_forward


def test_meta_count_equals_a_real_run() -> None:
    """The meta-device count is the count of real tensors, row by row, and its FLOPs are what
    torch's FlopCounterMode counts on a real run (SDPA on its math path, which it can count)."""
    from diffusers import UNet2DConditionModel
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    real = UNet2DConditionModel.from_config(TINY_UNET).eval()
    kwargs = unet_inputs(TINY_UNET, 2, 128, 128)
    counted = count_blocks(real, lambda: real(**kwargs), "unet")
    with torch.device("meta"):
        meta = UNet2DConditionModel.from_config(TINY_UNET)
        meta_kwargs = unet_inputs(TINY_UNET, 2, 128, 128)
    on_meta = count_blocks(meta, lambda: meta(**meta_kwargs), "unet")
    assert [(r.name, r.flops) for r in on_meta] == [(r.name, r.flops) for r in counted]
    # Bytes: the same but for the copies reshape makes of a non-contiguous tensor, which the
    # meta device's strides ask for in places where the CPU kernels' outputs are contiguous
    # (4 of the 73 ops of this model's two-layer attention block): within 10%
    for m, r in zip(on_meta, counted):
        assert m.bytes == pytest.approx(r.bytes, rel=0.1), m.name
    with FlopCounterMode(display=False) as fc, sdpa_kernel(SDPBackend.MATH), torch.no_grad():
        real(**kwargs)
    assert _flops(on_meta) == fc.get_total_flops() > 0
    names = {r.name for r in on_meta}
    assert {"down_blocks.0.resnets.0", "down_blocks.1.attentions.0", "mid_block.attentions.0", "conv_out"} <= names


def test_sdxl_unet_step_is_the_published_size() -> None:
    counts = count_request(NAMED["sdxl-base"], 1024, 1024, guided=False)
    # 2.57 B parameters in bf16, and ~6.8 TFLOP a 1024x1024 step at batch 1
    assert sum(r.weight_bytes for r in counts.unet) == pytest.approx(2 * 2.567e9, rel=0.01)
    assert _flops(counts.unet) == pytest.approx(6.76e12, rel=0.01)
    guided = count_request(NAMED["sdxl-base"], 1024, 1024, guided=True)
    assert _flops(guided.unet) == pytest.approx(2 * _flops(counts.unet), rel=1e-6)  # CFG doubles the batch


H100 = get_hardware_spec("h100-sxm")
HOPPER = load_profile(H100.efficiency_profile)


def test_prediction_grows_with_size_and_steps() -> None:
    sd15 = NAMED["sd15"]
    sizes = [predict_image(sd15, H100, s, s, 20, profile=HOPPER) for s in (256, 512, 768)]
    assert sizes[0].step_s < sizes[1].step_s < sizes[2].step_s
    assert sizes[0].vae_s < sizes[1].vae_s < sizes[2].vae_s
    steps = [predict_image(sd15, H100, 512, 512, n, profile=HOPPER).image_s for n in (1, 10, 30)]
    assert steps[0] < steps[1] < steps[2]
    assert steps[2] - steps[1] == pytest.approx(2 * (steps[1] - steps[0]) * 10 / 9)  # linear in steps


def test_two_devices_split_guidance() -> None:
    one = predict_image(NAMED["sd15"], H100, 512, 512, 20, profile=HOPPER)
    two = predict_image(NAMED["sd15"], H100, 512, 512, 20, devices=2, profile=HOPPER)
    assert 0.4 * one.step_s < two.step_s < one.step_s and two.transfer_s > 0
    with pytest.raises(ValueError, match="needs guidance"):
        predict_image(NAMED["sd15"], H100, 512, 512, 20, guided=False, devices=2, profile=HOPPER)
    with pytest.raises(ValueError, match="width=500"):
        predict_image(NAMED["sd15"], H100, 500, 512, 20, profile=HOPPER)


def test_predict_cli_json_has_the_block_rows(tmp_path, capsys) -> None:
    out = tmp_path / "p.json"
    rc = main(
        [
            "predict",
            "--model",
            "sd15",
            "--size",
            "512x512",
            "--steps",
            "4",
            "--hardware",
            "h100-sxm",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "VAE decode" in text and "decoder.up_blocks.3.resnets.0" in text
    d = json.loads(out.read_text())
    comps = {b["component"] for b in d["blocks"]}
    assert comps == {"text", "unet", "vae"}
    row = next(b for b in d["blocks"] if b["block"] == "mid_block.attentions.0")
    assert row["flops"] > 0 and row["bound"] in ("compute-bound", "memory-bound", "launch-bound")
    assert d["totals"]["image_s"] == pytest.approx(
        d["totals"]["text_encode"]["seconds"] + 4 * d["totals"]["step_s"] + d["totals"]["vae_decode"]["seconds"]
    )


def test_predict_reads_a_diffusers_directory(tmp_path) -> None:
    (tmp_path / "model_index.json").write_text("{}")
    for sub, cfg in (("unet", TINY_UNET), ("vae", NAMED["sd15"].vae)):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "config.json").write_text(json.dumps({"_class_name": "x", **cfg}))
    out = tmp_path / "p.json"
    assert (
        main(["predict", "--model", str(tmp_path), "--size", "128x128", "--hardware", "h100-sxm", "--json", str(out)])
        == 0
    )
    d = json.loads(out.read_text())
    assert d["model"] == tmp_path.name and not [b for b in d["blocks"] if b["component"] == "text"]


def test_bad_inputs_name_what_is_valid(capsys) -> None:
    assert main(["predict", "--model", "sdxl-base", "--size", "1024"]) != 0
    assert "--size '1024': expected WIDTHxHEIGHT" in capsys.readouterr().err
    assert main(["predict", "--model", "sdxl-base", "--quantization", "fp8", "--hardware", "h100-sxm"]) != 0
    assert "valid: auto, bf16, fp16, int8" in capsys.readouterr().err
    from tacit.perf_model.diffusion_configs import load_diffusion_configs

    with pytest.raises(ValueError, match="not a name"):
        load_diffusion_configs("sd3")
    assert isinstance(NAMED["sdxl-base"], DiffusionConfigs) and NAMED["sdxl-base"].is_sdxl


def test_llm_predictions_refuse_the_text_to_image_flags() -> None:
    import argparse

    from tacit.perf_model.diffusion_cli import refuse_diffusion_args

    refuse_diffusion_args(argparse.Namespace(size=None, steps=None, guidance_scale=None, devices=None))
    with pytest.raises(ValueError, match="--steps, --devices: text-to-image flags"):
        refuse_diffusion_args(argparse.Namespace(size=None, steps=4, guidance_scale=None, devices=2))
