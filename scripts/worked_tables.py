"""Tables for docs/worked-answers.md, each printed from tacit's performance model (no weights).

PYTHONPATH=. python scripts/worked_tables.py ridge   # ridge points, and which roof each op hits
PYTHONPATH=. python scripts/worked_tables.py mla     # KV bytes per token: MLA latent vs K/V
PYTHONPATH=. python scripts/worked_tables.py quant   # int8/int4 weights, int8 KV: fit and TPOT
PYTHONPATH=. python scripts/worked_tables.py mtp     # DeepSeek-V3 decode with MTP, 910C dies and H200
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

from tacit.cli import main as tacit_main
from tacit.perf_model.memory import kv_bytes_per_token
from tacit.perf_model.model_shape import ModelShape, load_hf_config, shape_from_hf
from tacit.perf_model.operators import Parallel, StepShape, step_ops
from tacit.perf_model.predict import Workload, predict
from tacit.platforms.hardware_table import get_hardware_spec, hardware_names

DEVICES = [n for n in hardware_names() if n != "this-cpu"]  # this-cpu would run a benchmark
# The roof table's columns: one part of each family people deploy on (all 20+ would not read)
ROOF_DEVICES = ["a100-80g", "h100-sxm", "h200-sxm", "b200", "mi300x", "ascend-910b", "ascend-910c-die"]
ROOF_DEVICES += ["ascend-310p", "xeon-6980p", "epyc-9654"]
# The quant table's models: the recipes' MoE and dense sizes (the small Gemma's 4 heads do not split 8 ways)
QUANT_MODELS = ["DeepSeek-V3", "Kimi-K2-Instruct", "Llama-3.1-70B", "Llama-3.1-8B", "Qwen2.5-72B"]
QUANT_MODELS += ["Qwen3-235B-A22B", "Qwen3-30B-A3B"]


def _shape(name: str) -> ModelShape:
    return shape_from_hf(load_hf_config(name))


def ridge() -> None:
    print("device               HBM TB/s  bf16 TFLOP/s  int8 TOP/s  ridge bf16  ridge int8  link GB/s")
    for name in DEVICES:
        s = get_hardware_spec(name)
        bw = s.memory_bandwidth.value
        bf, i8 = s.peak_flops("bf16"), s.peak_flops("int8")
        print(
            f"{name:<20}{bw / 1e12:>9.2f}{bf / 1e12:>14.0f}{i8 / 1e12:>12.0f}{bf / bw:>12.0f}{i8 / bw:>12.0f}"
            f"{s.link_bandwidth.value / 1e9:>11.0f}"
        )
    print("\nFLOP/byte of each bf16 operator class (TP=1) and its roof per device: C compute, M memory")
    print(f"{'model, step':<38}{'class':<12}{'FLOP/B':>8} " + "".join(f"{d:>16}" for d in ROOF_DEVICES))
    steps = [("decode b=1 ctx 4k", StepShape(1, 1, 4096)), ("decode b=64 ctx 4k", StepShape(64, 1, 4096))]
    steps += [("decode b=512 ctx 4k", StepShape(512, 1, 4096)), ("prefill 1x2048", StepShape(1, 2048, 0))]
    for model in ("Llama-3.1-70B", "Qwen3-235B-A22B", "DeepSeek-V3"):
        shape = _shape(model)
        for label, step in steps:
            ops = step_ops(shape, step, Parallel())
            for cls in ("dense_mlp", "experts", "attention"):
                group = [o for o in ops if o.op_class == cls]
                if not group:
                    continue
                ai = sum(o.flops for o in group) / sum(o.bytes for o in group)
                roofs = []
                for d in ROOF_DEVICES:
                    s = get_hardware_spec(d)
                    roofs.append("C" if ai >= s.peak_flops("bf16") / s.memory_bandwidth.value else "M")
                print(f"{model + ', ' + label:<38}{cls:<12}{ai:>8.1f} " + "".join(f"{r:>16}" for r in roofs))


def _gqa_twin(name: str, kv_heads: int, head_dim: int) -> ModelShape:
    """`name`'s config with MLA replaced by GQA: same layers, widths, heads, experts."""
    hf = dict(load_hf_config(name))
    for key in ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        hf.pop(key, None)
    return shape_from_hf({**hf, "num_key_value_heads": kv_heads, "head_dim": head_dim})


def mla(context: int = 32768, tp: int = 8) -> None:
    ds = _shape("DeepSeek-V3")
    full = ds.num_layers * ds.num_heads * (ds.qk_nope_head_dim + ds.qk_rope_head_dim + ds.v_head_dim) * 2
    rows = [
        ("DeepSeek-V3 MLA latent (cached)", ds, None),
        ("DeepSeek-V3 K/V up-projected", None, full),
        ("DeepSeek-V3 as GQA-8 x 128", _gqa_twin("DeepSeek-V3", 8, 128), None),
        ("Qwen3-235B-A22B (GQA-4 x 128)", _shape("Qwen3-235B-A22B"), None),
        ("Llama-3.1-70B (GQA-8 x 128)", _shape("Llama-3.1-70B"), None),
    ]
    print(f"bf16 KV, {context} tokens of context, TP={tp} (per device: MLA's latent whole on each rank)")
    print(f"{'cache':<34}{'B/token':>10}{'GB/seq':>9}{f'B/token/dev TP{tp}':>19}{'GB/seq/dev':>12}")
    for label, shape, total in rows:
        one = total if shape is None else kv_bytes_per_token(shape, Parallel(), "bf16")
        dev = total / tp if shape is None else kv_bytes_per_token(shape, Parallel(tp), "bf16")
        print(f"{label:<34}{one:>10.0f}{one * context / 1e9:>9.2f}{dev:>19.0f}{dev * context / 1e9:>12.2f}")
    print(f"\ndecode attention per step at batch 16, context {context}, h200-sxm, TP={tp} EP (bf16):")
    for label, shape in (("DeepSeek-V3 (MLA, absorbed)", ds), ("DeepSeek-V3 as GQA-8", rows[2][1])):
        p = predict(shape, get_hardware_spec("h200-sxm"), Workload(16, context, 2, parallel=Parallel(tp, True)))
        att = [t for t in p.decode_ops if t.op.op_class == "attention"]
        ms = sum(t.seconds for t in att) * 1e3
        mb = sum(t.op.bytes for t in att) / 1e6
        print(f"  {label:<30} attention {ms:7.2f} ms ({mb:8.0f} MB read), TPOT {p.tpot_s * 1e3:7.2f} ms")


def quant(batch: int = 16, input_len: int = 8192, output_len: int = 512) -> None:
    print(f"batch {batch}, input {input_len}, output {output_len}; TP=8 (MoE: EP); per device GB and TPOT ms")
    print(f"{'model':<18}{'weights':<8}{'KV':<6}" + "".join(f"{d:>34}" for d in ("h200-sxm", "ascend-910b")))
    print(f"{'':<32}" + "   weights     KV  total fits  TPOT" * 2)
    for model in QUANT_MODELS:
        shape = _shape(model)
        for wdt in ("bf16", "int8", "int4"):
            for kvdt in ("bf16", "int8"):
                cells = []
                for dev in ("h200-sxm", "ascend-910b"):
                    w = Workload(batch, input_len, output_len, wdt, kvdt, parallel=Parallel(8, shape.is_moe))
                    p = predict(shape, get_hardware_spec(dev), w)
                    m = p.memory
                    cells.append(
                        f"{m.weights / 1e9:>10.1f}{m.kv_cache / 1e9:>7.1f}{m.total / 1e9:>7.1f}"
                        f"{'  yes' if p.fits else '   NO'}{p.tpot_s * 1e3:>6.1f}"
                    )
                print(f"{model:<18}{wdt:<8}{kvdt:<6}" + "".join(cells))


# DeepSeek-V3 decode layouts as deployed: (label, devices, `tacit predict` flags, global batches)
MTP_LAYOUTS = [
    (
        "64 910C dies, DP64 attention + EP64 (DeepEP, 64 redundant experts: 5 a die), w8a8_int8",
        64,
        "--hardware ascend-910c-die --quantization w8a8_int8 --tensor-parallel-size 64 --data-parallel-attention"
        " --expert-parallel --num-redundant-experts 64 --enable-dp-lm-head",
        [64, 512, 4096, 6144],  # 1, 8, 64, 96 a die (CloudMatrix-Infer decodes 96 a die; at EP32 that needs 67.8 GB)
    ),
    (
        "16 H200, DP16 attention + EP16 (DeepEP, 32 redundant experts: 18 a GPU), fp8",
        16,
        "--hardware h200-sxm --quantization fp8 --tensor-parallel-size 16 --data-parallel-attention --expert-parallel"
        " --num-redundant-experts 32 --enable-dp-lm-head",
        [16, 128, 1024, 2048],  # 1, 8, 64, 128 a GPU
    ),
    (
        "8 H200, TP8 + EP8 (one node, low latency), fp8",
        8,
        "--hardware h200-sxm --quantization fp8 --tensor-parallel-size 8 --expert-parallel",
        [1, 8, 64, 128],  # every sequence on every GPU (attention TP)
    ),
]
MTP_CASES = [(0, 0.0), (1, 0.7), (1, 0.8), (1, 0.9), (2, 0.8), (3, 0.8)]  # (draft tokens, acceptance)


def _predict_json(flags: str) -> dict:
    """`tacit predict FLAGS --json` run in this process (its printout discarded), the JSON read back."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "p.json"
        with contextlib.redirect_stdout(io.StringIO()):
            rc = tacit_main(["predict", *flags.split(), "--json", str(out)])
        if rc:
            sys.exit(f"tacit predict {flags} failed ({rc})")
        return json.loads(out.read_text())


def mtp(context: int = 4096) -> None:
    base = f"--model DeepSeek-V3 --input-len 0 --context {context} --output-len 256"
    print(f"DeepSeek-V3 decode at context {context}; each row: tacit predict {base} LAYOUT --batch-size B")
    print("[--speculative-method mtp --speculative-tokens K --acceptance A] --json; speedup: TPOT without MTP / TPOT")
    for label, devices, layout, batches in MTP_LAYOUTS:
        print(f"\n{label}: LAYOUT = {layout}")
        print(f"{'batch':>6}{'seq/dev':>8}{'K':>3}{'A':>6}{'verify ms':>11}{'draft ms':>10}{'TPOT ms':>9}{'tok/s/dev':>11}"
              f"{'speedup':>9}{'GB/dev':>8}{'fits':>6}")
        for batch in batches:
            tpot0 = None
            for k, a in MTP_CASES:
                spec = f" --speculative-method mtp --speculative-tokens {k} --acceptance {a}" if k else ""
                d = _predict_json(f"{base} {layout} --batch-size {batch}{spec}")
                tpot = d["tpot_ms"]
                tpot0 = tpot0 or tpot
                draft_ms = d["speculative"]["draft_ms"] if k else 0.0  # the k draft forwards of a verify
                print(f"{batch:>6}{batch / devices if '--data-parallel-attention' in layout else batch:>8.0f}{k:>3}{a:>6.1f}"
                      f"{d['decode_step_ms']:>11.3f}{draft_ms:>10.3f}{tpot:>9.3f}{d['throughput_tok_s_per_device']:>11.1f}"
                      f"{tpot0 / tpot:>9.2f}{d['memory_per_device_gb']:>8.1f}{'yes' if d['fits'] else 'NO':>6}")


if __name__ == "__main__":
    tables = {"ridge": ridge, "mla": mla, "quant": quant, "mtp": mtp}
    if len(sys.argv) != 2 or sys.argv[1] not in tables:
        sys.exit(f"usage: python scripts/worked_tables.py {'|'.join(tables)}")
    tables[sys.argv[1]]()
