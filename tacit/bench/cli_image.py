"""`tacit bench image`: the parser and the printed report (the measurement is tacit/bench/image.py)."""

from __future__ import annotations

import argparse

from tacit.bench.cli_output import table, write_json


def add_image_parser(bsub: argparse._SubParsersAction) -> None:
    im = bsub.add_parser(
        "image",
        help="SDXL UNet step and VAE decode: tacit vs diffusers vs OpenVINO, each in its own process",
    )
    im.add_argument("--model", default="sdxl", choices=["sdxl", "sd15", "tiny"],
                    help="random weights of this architecture (sd15: SD 1.5, whose float32 weights fit 3 engines in 24 GiB; tiny: a smoke test in seconds)")  # fmt: skip
    im.add_argument("--size", type=int, default=1024,
                    help="image height = width in pixels; 512 where 1024 does not fit in memory or for a faster run")  # fmt: skip
    im.add_argument("--steps", type=int, default=3, help="timed denoising steps per round (after 1 warm-up step)")
    im.add_argument("--rounds", type=int, default=2, help="rounds; the engines alternate within each")
    im.add_argument("--engines", default="diffusers,openvino,tacit", help="comma list of diffusers, openvino, tacit")
    im.add_argument("--variants", default="",
                    help="tacit variants reported on their own with PSNR: comma list of int8, deepcache")  # fmt: skip
    im.add_argument("--tacit-options", default="",
                    help="OptimizeOptions fields over the defaults for the tacit engine, e.g. compile=true,vae_tile_latent=0")  # fmt: skip
    im.add_argument("--guidance-scale", type=float, default=5.0, help="> 1: classifier-free guidance (UNet batch 2)")
    im.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                    help="what every engine computes in; auto: bf16 where the CPU has a oneDNN bf16 matmul, else float32")  # fmt: skip
    im.add_argument("--seed", type=int, default=0)
    im.add_argument("--peak-tflops", type=float, default=None,
                    help="the matmul peak in --dtype to print beside the ratios (default: measured as `tacit bench hw` does)")  # fmt: skip
    im.add_argument("--peer-timeout", type=float, default=3600.0,
                    help="seconds one engine call may take (building SDXL and OpenVINO's conversion included)")  # fmt: skip
    im.add_argument("--json", default=None)
    im.set_defaults(func=cmd_image)


def cmd_image(args: argparse.Namespace) -> int:
    from tacit.bench.image import run_image_bench

    for flag in ("size", "steps", "rounds"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag} {getattr(args, flag)}: must be at least 1")
    result = run_image_bench(args)
    print(
        f"{result['model']} {result['size']}x{result['size']}, UNet batch {result['cfg_batch']}, {result['dtype']}; "
        f"{result['steps']} steps x {result['rounds']} rounds (median), one VAE decode a round; "
        f"{result['flops']['unet_flops'] / 1e12:.3g} TFLOP a step, {result['flops']['vae_flops'] / 1e12:.3g} a decode"
    )
    if result["engines"]:
        print(table(result["engines"]))
    for line in result["ratios"]:
        print(line)
    if result["variants"]:
        print("variants (not tacit's number: they change the output; FLOPs counted as for the full UNet):")
        print(table(result["variants"]))
        for line in result["variant_flags"]:
            print(line)
    for name, note in result["notes"].items():
        print(f"  {name}: {note}")
    for name, why in result["skipped"].items():
        print(f"  {name}: not measured: {why}")
    write_json(args, result)
    return 0
