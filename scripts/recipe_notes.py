"""Write recipes/configs/<Model>/README.md: memory per precision and predicted TTFT/TPOT per device.

Every figure in a note is the pasted output of the `tacit predict` command printed above it;
this script only chooses the settings (the smallest tensor-parallel size, at the widest weight
dtype, that fits one device's memory) and runs the commands. Rerun it after the efficiency
profiles change: `PYTHONPATH=. python scripts/recipe_notes.py`.
"""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import sys
import tempfile
from pathlib import Path

from tacit.cli import main
from tacit.perf_model.model_shape import load_hf_config, recipe_config_names, shape_from_hf

ROOT = Path(__file__).resolve().parent.parent
CONTEXT = 32768  # the memory table's context: one sequence of 32k tokens
BATCH, INPUT, OUTPUT = 16, 2048, 256  # the serving setting the TTFT/TPOT predictions use
DEVICES = {"h200-sxm": ("bf16", "fp8", "int8", "int4"), "ascend-910b": ("bf16", "int8", "int4")}
# One 8-device node first, at any dtype; 16 (two nodes, their link priced as one node's) only
# when nothing fits in one: a node's NVLink / HCCS is what deployments of these models use.
TP_GROUPS = ((1, 2, 4, 8), (16,))


def run(argv: list[str]) -> tuple[str, str]:
    """The command line as a user types it, and what it printed."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(argv)
    if rc:
        raise RuntimeError(f"tacit {' '.join(argv)} failed with {rc}")
    return "tacit " + shlex.join(argv), buf.getvalue()


def predict_json(argv: list[str]) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        run([*argv, "--json", f.name])
        return json.loads(Path(f.name).read_text())


def recipe_args(model: str, device: str, moe: bool) -> list[str]:
    """The first (dtype, TP) in order of preference whose batch fits one device."""
    for group, dtype in ((g, d) for g in TP_GROUPS for d in DEVICES[device]):
        for tp in group:
            argv = ["predict", "--model", model, "--hardware", device, "--tensor-parallel-size", str(tp)]
            argv += ["--expert-parallel"] if moe and tp > 1 else []
            argv += ["--quantization", dtype, "--batch-size", str(BATCH)]
            argv += ["--input-len", str(INPUT), "--output-len", str(OUTPUT)]
            if predict_json(argv)["fits"]:
                return argv
    raise RuntimeError(f"{model} fits no setting on {device}")


MEM_GREP = " | grep '^  memory'"


def _memory_line(out: str) -> str:
    return "\n".join(ln for ln in out.splitlines() if ln.startswith("  memory"))


def _block(cmd: str, out: str) -> str:
    return f"```\n$ {cmd}\n{out.rstrip()}\n```\n"


def _summary(out: str) -> str:
    """The two largest operator classes of each phase, quoted from the output above."""
    lines = [ln.strip() for ln in out.splitlines() if "% of the step" in ln]
    parts = []
    for phase in ("prefill", "decode"):
        rows = [ln for ln in lines if ln.startswith(phase)]
        rows.sort(key=lambda ln: -float(ln.rsplit("% of the step", 1)[0].rsplit(" ", 1)[1]))
        parts.append(f"{phase}: " + "; ".join(f"`{r.split(' ', 1)[1]}`" for r in rows[:2]))
    return "Bottleneck per phase (the two largest classes above): " + " / ".join(parts) + ".\n"


def note(model: str) -> str:
    hf = load_hf_config(model)
    shape = shape_from_hf(hf)
    kind = "MLA + MoE" if shape.is_mla else ("MoE" if shape.is_moe else "dense GQA")
    out = [
        f"# {model}: predicted memory and latency\n",
        f"A {kind} model ({shape.num_layers} layers, hidden {shape.hidden_size}). No runnable recipe: its weights "
        "are not on this machine, so this note is the performance model's (`tacit predict`, roofline over the "
        "sourced hardware table; accelerator efficiencies are stated assumptions, not measurements). Every "
        "figure is the output of the command printed with it.\n",
    ]
    windows = sorted({w for w in shape.windows if w})
    if windows:
        out.append(
            f"Its sliding-window layers ({', '.join(map(str, windows))} tokens) keep only the blocks their window "
            "straddles: the KV terms below count them so (docs/performance/predict.md, 'Sliding windows, sparse "
            "attention and MXFP4').\n"
        )
    if shape.weight_format:
        experts = (
            f" Its routed experts stay {shape.expert_weight_dtype} whatever `--quantization` says."
            if shape.expert_weight_dtype
            else ""
        )
        out.append(
            f"The checkpoint stores its weights as {shape.weight_format}: the default (`--quantization auto`) prices "
            f"that, the first row below; the other rows price an engine quantizing it from bf16.{experts}\n"
        )
    out += [
        f"## Memory at each weight precision: weights + KV of one {CONTEXT}-token sequence (bf16 KV)\n",
        "TP=1, so the numbers are the whole model (the capacity and fit verdict are one H200's).\n",
    ]
    for dtype in ("auto",) * bool(shape.weight_format) + ("bf16", "fp8", "int8", "int4"):
        quant = [] if dtype == "auto" else ["--quantization", dtype]
        cmd, text = run(
            ["predict", "--model", model, "--hardware", "h200-sxm", *quant]
            + ["--input-len", str(CONTEXT), "--output-len", "1"]
        )
        out.append(_block(cmd + MEM_GREP, _memory_line(text)))
    cmd, text = run(
        ["predict", "--model", model, "--hardware", "h200-sxm", "--kv-cache-dtype", "int8"]
        + ["--input-len", str(CONTEXT), "--output-len", "1"]
    )
    out.append(
        "An int8 KV cache (int8 values plus a scale per row) about halves the KV term (weights as the first row):\n"
    )
    out.append(_block(cmd + MEM_GREP, _memory_line(text)))
    out.append(
        f"## Predicted TTFT / TPOT: batch {BATCH}, {INPUT}-token prompts, {OUTPUT} output tokens\n\n"
        "Setting per device: within one 8-device node, the widest weight dtype and then the smallest "
        "tensor-parallel size (1, 2, 4, 8; MoE with --expert-parallel) at which the batch fits one device's "
        "memory; 16 devices (two nodes) only when nothing fits in one.\n"
    )
    for device in DEVICES:
        argv = recipe_args(model, device, shape.is_moe)
        cmd, text = run(argv)
        out.append(f"### {device}\n")
        out.append(_block(cmd, text))
        out.append(_summary(text))
    return "\n".join(out)


if __name__ == "__main__":
    names = sys.argv[1:] or recipe_config_names()
    for name in names:
        path = ROOT / "recipes" / "configs" / name / "README.md"
        path.write_text(note(name))
        print(f"wrote {path}")
