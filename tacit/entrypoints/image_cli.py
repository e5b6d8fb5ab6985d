"""`tacit image --model DIR --prompt ... --out a.png`: text to image on this machine, a progress
bar per denoising step; and the image flags of `tacit serve` (--image-model ...).

The model is a diffusers directory (model_index.json) or an SD/SDXL single-file .safetensors.
n images are written as a.png, a-1.png, a-2.png ...; the seed used is printed (image i was drawn
from seed + i), so any image can be made again with --seed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tacit.engine.image_engine import DEFAULT_MAX_IMAGE_BATCH, DEFAULT_MAX_IMAGE_WAITING, native_size

# The key prefix of an original (SGM/LDM) Stable Diffusion single-file checkpoint's UNet, SD 1.x,
# 2.x and SDXL alike; no language model checkpoint has it.
_SINGLE_FILE_UNET_PREFIX = "model.diffusion_model."

IMAGE_DTYPES = ("float32", "bfloat16")
# A single-file checkpoint carries no tokenizer; a diffusers directory of the same family has both.
# docs/recipes-image-notes.md: 1.5-1.75x a UNet step on this CPU, minutes of compiling first.
_COMPILE_HELP = (
    "torch.compile the UNet (inductor with frozen weights): faster steps after minutes of compiling "
    "on the first image of each size"
)
_TOKENIZER_HELP = "for a single-file .safetensors: a directory holding tokenizer/ (and tokenizer_2/ for SDXL)"


def is_diffusion_checkpoint(path: str | None) -> bool:
    """A diffusers directory (model_index.json) or an SD/SDXL single-file .safetensors."""
    if not path:
        return False
    p = Path(path)
    if p.is_dir():
        return (p / "model_index.json").is_file()
    if p.is_file() and p.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(p), framework="pt") as f:  # reads the header only
            return any(k.startswith(_SINGLE_FILE_UNET_PREFIX) for k in f.keys())
    return False


def check_diffusion_checkpoint(path: str, flag: str) -> None:
    if not Path(path).exists():
        raise FileNotFoundError(f"{flag} {path}: no such file or directory")
    if not is_diffusion_checkpoint(path):
        raise ValueError(
            f"{flag} {path}: not a diffusion checkpoint; give a diffusers directory (with model_index.json) or an "
            "SD/SDXL single-file .safetensors"
        )


def output_paths(out: str, n: int) -> list[Path]:
    """a.png -> [a.png, a-1.png, ...]: the first image keeps the name asked for."""
    p = Path(out)
    return [p] + [p.with_name(f"{p.stem}-{i}{p.suffix}") for i in range(1, n)]


def _check_out(out: str) -> None:
    """Refuse an --out PIL cannot write before minutes of denoising, not after."""
    from PIL import Image

    Image.init()
    suffix = Path(out).suffix.lower()
    if suffix not in Image.registered_extensions():
        raise ValueError(
            f"--out {out}: {suffix or 'no extension'} is not an image format; end it in .png, .jpg or .webp"
        )
    if not Path(out).resolve().parent.is_dir():
        raise FileNotFoundError(f"--out {out}: the directory {Path(out).resolve().parent} does not exist")


def cmd_image(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from tacit.diffusion.optimize import serving_options
    from tacit.diffusion.pipeline import ImagePipeline
    from tacit.diffusion.request import ImageRequest

    check_diffusion_checkpoint(args.model, "--model")
    _check_out(args.out)
    t0 = time.perf_counter()
    print(f"tacit: loading {args.model} ...", file=sys.stderr, flush=True)
    options = serving_options(args.dtype, args.compile)
    pipeline = ImagePipeline.from_pretrained(
        args.model, dtype=options.dtype, options=options, tokenizer_dir=args.tokenizer
    )
    print(f"tacit: loaded {args.model} in {time.perf_counter() - t0:.1f}s ({args.dtype})", file=sys.stderr, flush=True)
    native_w, native_h = native_size(pipeline)
    given = {
        "n": args.n,
        "steps": args.steps,
        "guidance_scale": args.guidance_scale,
        "seed": args.seed,
        "scheduler": args.scheduler,
    }
    request = ImageRequest(
        prompt=args.prompt,
        negative_prompt=args.negative_prompt,
        width=args.width or native_w,
        height=args.height or native_h,
        **{k: v for k, v in given.items() if v is not None},  # unset: ImageRequest's defaults
    )
    pipeline.limits.validate(request)  # ValueError naming the flag's field and its valid range
    with tqdm(desc="denoising", unit="step", file=sys.stderr, disable=args.no_progress) as bar:

        def on_step(step: int, total: int) -> None:
            bar.total = total
            bar.update(1)

        (result,) = pipeline.generate([request], on_step=on_step)
    for path, image in zip(output_paths(args.out, len(result.images)), result.images, strict=True):
        image.save(path)
        print(path)
    timings = ", ".join(f"{k} {v:.2f}" for k, v in result.timings.items())
    print(
        f"tacit: seed {result.seed} (image i: seed + i); {request.width}x{request.height}, {request.steps} steps, "
        f"{request.scheduler}; {timings}",
        file=sys.stderr,
        flush=True,
    )
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 1")
    return value


def add_image_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("image", help="text to image with a diffusion model (SDXL, SD 1.5), a progress bar per step")
    p.add_argument(
        "--model", required=True, help="diffusers directory (model_index.json) or SD/SDXL single-file .safetensors"
    )
    p.add_argument("--prompt", required=True)
    p.add_argument("--out", required=True, help="image file to write; n > 1 adds -1, -2 ... before the extension")
    p.add_argument("--negative-prompt", default="", help="what the image should not show (classifier-free guidance)")
    p.add_argument("--n", type=_positive, default=None, help="images of this prompt (default 1)")
    p.add_argument("--width", type=_positive, default=None, help="pixels (default: the model's native size)")
    p.add_argument("--height", type=_positive, default=None, help="pixels (default: the model's native size)")
    p.add_argument("--steps", type=_positive, default=None, help="denoising steps (default 30)")
    p.add_argument("--guidance-scale", type=float, default=None, help="<= 1 turns guidance off (default 5.0)")
    p.add_argument("--seed", type=int, default=None, help="seed of the first image's noise (default: random, printed)")
    p.add_argument(
        "--scheduler", default=None, help="euler | euler_a | dpmpp_2m | dpmpp_2m_karras | ... (default euler)"
    )
    p.add_argument("--dtype", choices=IMAGE_DTYPES, default="float32")
    p.add_argument("--tokenizer", default=None, metavar="DIR", help=_TOKENIZER_HELP)
    p.add_argument("--compile", action="store_true", help=_COMPILE_HELP)
    p.add_argument("--no-progress", action="store_true", help="no progress bar (for logs)")
    p.set_defaults(func=cmd_image)


def add_image_serve_args(parser: argparse.ArgumentParser) -> None:
    """`tacit serve`'s image flags, one argument group (`tacit serve --help=image`)."""
    g = parser.add_argument_group("image", "POST /v1/images/generations: the image model tacit serve serves")
    g.add_argument(
        "--image-model",
        default=None,
        metavar="PATH",
        help="also serve this diffusion checkpoint (diffusers directory or SD/SDXL .safetensors) beside --model; "
        "a --model that is itself one serves images only",
    )
    g.add_argument(
        "--image-dtype",
        choices=IMAGE_DTYPES,
        default=None,
        help="the image model's dtype (default float32; with no language model, --dtype if set)",
    )
    g.add_argument("--image-compile", action="store_true", help=_COMPILE_HELP)
    g.add_argument(
        "--image-tokenizer",
        default=None,
        metavar="DIR",
        help=_TOKENIZER_HELP + " (with no language model, --tokenizer if set)",
    )
    g.add_argument(
        "--max-image-batch",
        type=_positive,
        default=DEFAULT_MAX_IMAGE_BATCH,
        help=f"images denoised together in one UNet batch, from compatible requests (default {DEFAULT_MAX_IMAGE_BATCH})",
    )
    g.add_argument(
        "--max-image-waiting",
        type=_positive,
        default=DEFAULT_MAX_IMAGE_WAITING,
        help=f"image requests queued before more get 503 (default {DEFAULT_MAX_IMAGE_WAITING})",
    )
