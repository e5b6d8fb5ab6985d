"""Derive the CPU engines' efficiency-profile figures from the engines' own published dense-model
runs (tacit/perf_model/data/cpu_profile_sources.yaml), and check the profiles reproduce them.

`PYTHONPATH=. python scripts/cpu_profiles.py` prints, for each source:

- EPYC 9554 (Genoa), Phi-4 at four GGML types: the model's decode step with the epyc-zen4 profile
  but no per-layer cost, against the published one. The gap is nearly the same at every type
  (bytes read vary 1.7x), so it is a fixed cost a token, not bandwidth: llama.cpp's graph of ~25
  nodes a layer, each a barrier over the socket's threads. Its mean per layer is the profile's
  layer cost (epyc-zen4, and epyc-zen5 by assumption).
- Xeon 6980P, dense Qwen2.5-72B Q4_0 under ik_llama.cpp: the bandwidth fraction that prices its
  token generation (with the per-layer cost above), and the compute fraction of the part's int8
  peak that prices its 2048-token prompt (ggml runs no AMX: the fraction is of the AMX peak the
  table states). These are granite-rapids-llamacpp's gemm curve and gemm_compute.
- The same part with MRDIMM-8800, the distilled Llama-70B in Q8_0 under mainline llama.cpp (the
  LMSYS Xeon 6 post's llama.cpp columns): the same two fractions from its TPOT and TTFT,
  granite-rapids-llamacpp-mainline's; its routed experts' compute fraction is that over 1.45
  (mul_mat_id's per-row vec_dot against the tinyBLAS GEMM a dense Q8_0 prompt takes).
- ik_llama.cpp's PR 534 table (a Ryzen-7950X's pp512 per type, before and after the PR that
  repacks Q4_0, Q8_0 and seven other types for its GEMMs): each type's fraction before it, from
  granite-rapids-llamacpp's (measured with it), granite-rapids-llamacpp-norepack's entries.
- A 16-core Zen 4 (Ryzen-7950X), mainline's prompt processing of LLaMA-3.1-8B at Q4_0 and Q8_0:
  the int8 compute fraction that prices them, their mean (epyc-zen4's gemm_compute, and
  epyc-zen5's by assumption).
- The same 7950X, one mainline build's pp512 of LLaMA-3.1-8B at fourteen GGML types: each type's
  rate against Q4_0's and Q8_0's (mainline's tinyBLAS GEMM takes them, Q5_0 and IQ4_NL; the
  k-quants and the other i-quants run a per-row vec_dot) times the int8 fraction above:
  epyc-zen4's per-type gemm_compute entries (epyc-zen5 takes epyc-zen4's).
- Xeon 6980P, Llama-3.2-3B in bf16 under SGLang's CPU backend (eager): its decode step with the
  granite-rapids profile but no per-layer cost, against the published one. A 3B model's weights
  are read in ~9.5 ms of its 16.98, so the gap is the engine's host cost; a layer's share is
  granite-rapids' layer cost (sapphire-rapids' by assumption: the same engine).

Then each source row, and the MoE check no number comes from, priced with the shipped profiles,
and its error.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import yaml

from tacit.perf_model.efficiency import Curve, Profile, load_profile
from tacit.perf_model.hardware_file import resolve_hardware
from tacit.perf_model.model_shape import load_hf_config, shape_from_hf
from tacit.perf_model.predict import Workload, predict

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "tacit" / "perf_model" / "data" / "cpu_profile_sources.yaml"


# each source and the profile it is priced with
PROFILES = (
    ("genoa_phi4", "epyc-zen4"),
    ("zen4_llama8b", "epyc-zen4"),
    ("granite_rapids_qwen72b", "granite-rapids-llamacpp"),
    ("granite_rapids_llamacpp_llama70b", "granite-rapids-llamacpp-mainline"),
    ("zen4_qwen3_moe_check", "epyc-zen4"),
    ("granite_rapids_sglang_llama3b", "granite-rapids"),
)


# each source a profile's per-layer cost comes from, and that profile
LAYER_COSTS = (("genoa_phi4", "epyc-zen4"), ("granite_rapids_sglang_llama3b", "granite-rapids"))


def sources() -> dict:
    return yaml.safe_load(SOURCES.read_text())


def _spec(src: dict, profile_name: str):
    file = src.get("hardware_file")
    spec = resolve_hardware(src.get("hardware"), str(ROOT / file) if file else None)
    return replace(spec, efficiency_profile=profile_name)


def _shape(src: dict):
    model = src["model"]
    return shape_from_hf(model if isinstance(model, dict) else load_hf_config(model))


def row_seconds(src: dict, row: dict, profile: Profile) -> float:
    """The published row's time as the model prices it: a token's decode step (tg) or the
    prompt's prefill (pp)."""
    spec, shape = _spec(src, profile.name), _shape(src)
    kv = src.get("kv_cache_dtype", "bf16")
    if row["test"] == "tg":
        w = Workload(1, 0, 2, row["quantization"], kv, context=row["context"])
        return predict(shape, spec, w, profile).decode_step_s
    w = Workload(1, row["tokens"], 1, row["quantization"], kv)
    return predict(shape, spec, w, profile).prefill_step_s


def published_seconds(row: dict) -> float:
    for key in ("tpot_ms", "ttft_ms"):
        if key in row:
            return row[key] / 1e3
    return (row["tokens"] if row["test"] == "pp" else 1) / row["value"]


def layer_cost(src: dict, profile: str) -> tuple[float, list[tuple[str, float, float]]]:
    """The fixed cost a layer and token that `profile` lacks for the source's tg rows: (seconds a
    layer, the mean gap over the rows; [(type, published s, priced s without the layer cost)])."""
    base = load_profile(profile)
    bare = replace(base, layer_overhead_s={k: 0.0 for k in base.layer_overhead_s})
    rows = [(r["quantization"], published_seconds(r), row_seconds(src, r, bare)) for r in src["rows"]]
    layers = _shape(src).num_layers
    return sum(p - m for _, p, m in rows) / len(rows) / layers, rows


def _solve(f, target: float, lo: float, hi: float) -> float:
    """x in [lo, hi] with f(x) = target, f decreasing in x (a larger efficiency, a shorter time)."""
    for _ in range(60):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if f(mid) > target else (lo, mid)
    return (lo * hi) ** 0.5


def granite_rapids_fractions(src: dict, profile: str = "granite-rapids-llamacpp") -> tuple[float, float]:
    """(bandwidth fraction, int8 compute fraction) that price a dense model's tg and pp rows with
    the profile's other figures (its layer cost)."""
    base = load_profile(profile)
    tg = next(r for r in src["rows"] if r["test"] == "tg")
    pp = next(r for r in src["rows"] if r["test"] == "pp")

    def streaming(bw: float) -> Profile:  # one bandwidth fraction for every GEMM, as the profiles ship
        return replace(base, gemm={"int8": Curve((1.0,), (bw,)), "bf16": Curve((1.0,), (bw,))})

    bw = _solve(lambda bw: row_seconds(src, tg, streaming(bw)), published_seconds(tg), 0.01, 1.0)
    return bw, _pricing_fraction(src, pp, streaming(bw), "int8")


# tinyBLAS's speedup over the per-row vec_dot path for Q4_0 and Q8_0 prompts when it landed in
# mainline (llama.cpp PR 6414: "in the range of 40-50%", ik_llama.cpp PR 533): the midpoint.
# mul_mat_id still runs every routed expert through vec_dot (ggml-cpu.c), so a MoE's experts
# compute at the dense fraction over this.
VEC_DOT_SLOWDOWN = 1.45


def mainline_experts_fraction(dense_int8: float) -> float:
    """Mainline llama.cpp's routed experts' int8 compute fraction from its dense one."""
    return dense_int8 / VEC_DOT_SLOWDOWN


def _pricing_fraction(src: dict, row: dict, base: Profile, key: str) -> float:
    """The compute fraction under gemm_compute[key] (base's other entries kept) that prices a
    prompt row at its published time."""

    def pp_s(c: float) -> float:
        return row_seconds(src, row, replace(base, gemm_compute={**base.gemm_compute, key: c}))

    return _solve(pp_s, published_seconds(row), 0.001, 1.0)


def zen4_compute_fraction(src: dict) -> float:
    """The int8 compute fraction that prices mainline's pp512 rows on a Zen 4 core (their mean),
    weights streaming at epyc-zen4's bandwidth fraction."""
    base = load_profile("epyc-zen4")
    fractions = [_pricing_fraction(src, row, base, "int8") for row in src["rows"]]
    return sum(fractions) / len(fractions)


def zen4_type_fractions(src: dict) -> dict[str, float]:
    """Each GGML type's int8 compute fraction on Zen 4 under mainline: the fraction that prices
    its pp512 row of the one-build type table, over the mean of the reference (tinyBLAS) types'
    in the same table, times epyc-zen4's int8 fraction (zen4_llama8b's build). The reference
    types themselves keep the int8 fraction."""
    base = load_profile("epyc-zen4")
    own = {r["quantization"]: _pricing_fraction(src, r, base, r["quantization"]) for r in src["rows"]}
    reference = sum(own[t] for t in src["reference"]) / len(src["reference"])
    int8 = base.gemm_compute["int8"]
    return {t: int8 * f / reference for t, f in own.items() if t not in src["reference"]}


def ik_norepack_fractions(src: dict, int8: float) -> dict[str, float]:
    """Each type's int8 compute fraction under ik_llama.cpp before its PR 534 (or without -rtr):
    `int8`, the fraction its repacked GEMMs reach (granite-rapids-llamacpp's, from a Q4_0 run
    with the PR), times the type's main rate over the reference type's rate with the PR."""
    reference = next(r["pr"] for r in src["rows"] if r["quantization"] == src["reference"])
    return {r["quantization"]: int8 * r["main"] / reference for r in src["rows"]}


def main() -> None:
    data = sources()
    for key, profile in LAYER_COSTS:
        src = data[key]
        per_layer, rows = layer_cost(src, profile)
        where = src.get("hardware_file") or src["hardware"]
        print(f"{src['source']['title']}: tg on {where}, {profile} without its layer cost")
        for q, pub, bare in rows:
            print(
                f"  {q:7s} published {1e3 * pub:7.2f} ms  priced {1e3 * bare:7.2f} ms  gap {1e3 * (pub - bare):5.2f} ms"
            )
        print(f"  mean gap a layer ({_shape(src).num_layers} layers): {1e3 * per_layer:.3f} ms")
    gnr = data["granite_rapids_qwen72b"]
    bw, compute = granite_rapids_fractions(gnr)
    print(f"{gnr['source']['title']}: on {gnr['hardware']}")
    print(f"  bandwidth fraction that prices tg: {bw:.3f}; int8 compute fraction that prices pp2048: {compute:.4f}")
    mainline = data["granite_rapids_llamacpp_llama70b"]
    bw, compute = granite_rapids_fractions(mainline, "granite-rapids-llamacpp-mainline")
    print(f"{mainline['source']['title']}: on {mainline['hardware']}")
    print(
        f"  bandwidth fraction that prices tg: {bw:.3f}; int8 compute fraction that prices pp1024: {compute:.4f}; "
        f"the routed experts' (/{VEC_DOT_SLOWDOWN}): {mainline_experts_fraction(compute):.4f}"
    )
    norepack = ik_norepack_fractions(
        data["ik_pr534_types"], load_profile("granite-rapids-llamacpp").gemm_compute["int8"]
    )
    print(f"{data['ik_pr534_types']['source']['title']}: granite-rapids-llamacpp-norepack")
    for t, f in norepack.items():
        print(f"  {t:8s} int8 compute fraction {f:.4f}")
    zen4 = data["zen4_llama8b"]
    print(f"{zen4['source']['title']}: on {zen4['hardware_file']}")
    print(f"  int8 compute fraction that prices pp512 (mean of Q4_0, Q8_0): {zen4_compute_fraction(zen4):.4f}")
    types = data["zen4_llama8b_types"]
    print(f"{types['source']['title']}:")
    for t, f in zen4_type_fractions(types).items():
        print(f"  {t:8s} int8 compute fraction {f:.4f}")
    print("the shipped profiles against every source row:")
    for key, profile in PROFILES:
        src = data[key]
        for r in src["rows"]:
            pub, priced = published_seconds(r), row_seconds(src, r, load_profile(profile))
            rate = (r["tokens"] if r["test"] == "pp" else 1) / pub
            print(
                f"  {profile:32s} {r['quantization']:7s} {r['test']}  published {rate:8.3f} tok/s  "
                f"priced {(pub / priced) * rate:8.3f}  error {100 * (pub / priced - 1):+5.1f}%"
            )


if __name__ == "__main__":
    main()
