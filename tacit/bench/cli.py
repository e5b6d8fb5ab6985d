"""`tacit bench hw | latency | attention | comm | throughput | serve`: print a table, optionally write JSON.
`tacit bench` alone runs `tacit bench latency` on the default model."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from tacit.bench.peers.process_peer import DEFAULT_TIMEOUT_S, ProcessPeer
from tacit.bench.scenario import SCENARIOS
from tacit.bench.workloads import DISTRIBUTIONS
from tacit.engine.arg_utils import EngineArgs

PEERS = ["transformers", "llama.cpp"]
# Further peers by name -> 'module:Class' built with (model path, dtype); tests stand one in here.
PEER_FACTORIES: dict[str, str] = {}


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bench", help="measure this machine and tacit (see docs/benchmarks.md)")
    bsub = b.add_subparsers(dest="bench")
    hw = bsub.add_parser("hw", help="memory bandwidth and matmul FLOP/s of this machine")
    hw.add_argument("--json", default=None)
    hw.set_defaults(func=cmd_hw)
    lat = bsub.add_parser("latency", help="TTFT and decode tok/s per batch size")
    EngineArgs.add_cli_args(lat)
    lat.add_argument("--batch-sizes", default="1,4,16")
    lat.add_argument("--input-len", type=int, default=128)
    lat.add_argument("--output-len", type=int, default=64)
    lat.add_argument("--peer", action="append", default=[], help=f"measure a peer in the same run: {', '.join(PEERS)}")
    lat.add_argument("--repeats", type=int, default=2)
    lat.add_argument(
        "--peer-timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds a peer may take per measurement"
    )
    lat.add_argument("--json", default=None)
    lat.add_argument("--plot", default=None, help="PNG: decode tok/s against batch size")
    lat.set_defaults(func=cmd_latency)
    # `tacit bench` alone: the latency table on the default model, with latency's own defaults.
    b.set_defaults(func=lambda args: cmd_latency(lat.parse_args([])))
    at = bsub.add_parser("attention", help="decode attention alone, per KV cache dtype (C++ kernels)")
    at.add_argument("--model", default=None, help="whose attention shape (default: the embedded model)")
    at.add_argument("--context", type=int, default=4096, help="tokens of context per row")
    at.add_argument("--batch-sizes", default="1,8")
    at.add_argument("--kv-cache-dtypes", default="bfloat16,int8", help="compared in turn; speedup is against the first")
    at.add_argument("--repeats", type=int, default=5)
    at.add_argument("--json", default=None)
    at.set_defaults(func=cmd_attention)
    cm = bsub.add_parser("comm", help="the shared-memory communicator against gloo on local ranks")
    cm.add_argument("--world-size", type=int, default=2)
    cm.add_argument("--sizes", default="4KB,16KB,64KB,256KB,1MB,4MB,16MB,32MB", help="bytes per rank's tensor")
    cm.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    cm.add_argument(
        "--collectives", default="all_reduce", help="comma list of all_reduce, all_gather, all_to_all, reduce_scatter"
    )
    cm.add_argument("--repeats", type=int, default=5, help="timed repeats per cell (the median is reported)")
    cm.add_argument("--json", default=None)
    cm.set_defaults(func=cmd_comm)
    tp = bsub.add_parser("throughput", help="offline throughput over N requests")
    EngineArgs.add_cli_args(tp)
    tp.add_argument("--num-prompts", type=int, default=256)
    tp.add_argument("--dist", default="longtail", choices=DISTRIBUTIONS)
    tp.add_argument("--input-len", type=int, default=128, help="median (longtail) or mean input length")
    tp.add_argument("--output-len", type=int, default=64)
    tp.add_argument("--peer", action="append", default=[], help=f"{', '.join(PEERS)} or transformers-cb")
    tp.add_argument("--static-batch", type=int, default=16, help="transformers generate() batch size")
    tp.add_argument(
        "--peer-timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds a peer may take per measurement"
    )
    tp.add_argument("--repeats", type=int, default=1)
    tp.add_argument("--json", default=None)
    tp.add_argument("--plot", default=None, help="PNG: output tok/s per engine")
    tp.set_defaults(func=cmd_throughput)
    sv = bsub.add_parser("serve", help="load an OpenAI-compatible server (tacit's or any other)")
    sv.add_argument("--url", default="http://127.0.0.1:8000")
    sv.add_argument("--model", default=None, help="model name to send (default: the server's first /v1/models)")
    sv.add_argument("--api-key", default=None)
    sv.add_argument("--num-prompts", type=int, default=None, help="default 64 (--scenario: 120)")
    sv.add_argument("--dist", default="longtail", choices=DISTRIBUTIONS)
    sv.add_argument("--input-len", type=int, default=128)
    sv.add_argument("--output-len", type=int, default=64)
    sv.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (inf: all at once)")
    sv.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of arrivals; 1 = Poisson")
    sv.add_argument("--max-concurrency", type=int, default=None)
    sv.add_argument("--slo", default=None, help="goodput bounds, e.g. ttft:500,tpot:50 (ms)")
    sv.add_argument("--seed", type=int, default=0)
    sv.add_argument(
        "--structured-fraction",
        default="0",
        help="fraction of requests with a json_schema response_format; a list (0,0.5) runs each in turn "
        "on the same prompts and prints output tok/s relative to the first",
    )
    sv.add_argument("--json", default=None)
    sv.add_argument("--plot", default=None, help="PNG: end-to-end latency CDF")
    sv.add_argument(
        "--scenario",
        default=None,
        choices=SCENARIOS,
        help="start a tacit server per --policies and run this workload against each (no --url)",
    )
    sv.add_argument("--policies", default="fcfs,priority,sjf,sla", help="scheduling policies the scenario compares")
    sv.add_argument("--server-args", default="", help="extra `tacit serve` flags for the scenario's servers")
    sv.add_argument("--idle-requests", type=int, default=10, help="interactive requests timed on an idle server")
    sv.set_defaults(func=cmd_serve)
    wl = bsub.add_parser("workload", help="write a JSONL workload file (tacit bench serve's draw) for predict --serve")
    wl.add_argument("--out", required=True)
    wl.add_argument("--num-prompts", type=int, default=64)
    wl.add_argument("--dist", default="longtail", choices=DISTRIBUTIONS)
    wl.add_argument("--input-len", type=int, default=128)
    wl.add_argument("--output-len", type=int, default=64)
    wl.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (inf: all at once)")
    wl.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of arrivals; 1 = Poisson")
    wl.add_argument("--seed", type=int, default=0)
    wl.set_defaults(func=cmd_workload)


def _table(rows: list[dict]) -> str:
    """Rows as aligned columns: every key any row has, "-" where a row lacks it (a peer has no
    comm_share: a llama.cpp row beside tacit's once ended the run in a KeyError)."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    cells = [[fmt(r[k]) if k in r else "-" for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    lines = ["  ".join(k.rjust(w) for k, w in zip(keys, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def cmd_hw(args: argparse.Namespace) -> int:
    from tacit.platforms.hw_probe import measure

    result = measure()
    print(_table([result]))
    if args.json:
        json.dump(result, open(args.json, "w"), indent=2)
    return 0


def cmd_attention(args: argparse.Namespace) -> int:
    from tacit.bench.attention import measure_attention
    from tacit.loader import open_model

    hf = open_model(args.model).hf_config
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    rows = measure_attention(hf, args.context, batch_sizes, args.kv_cache_dtypes.split(","), args.repeats)
    print(_table(rows))
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=2)
    return 0


def cmd_comm(args: argparse.Namespace) -> int:
    from tacit.bench import comm

    collectives = [c.strip() for c in args.collectives.split(",") if c.strip()]
    bad = [c for c in collectives if c not in comm.COLLECTIVES]
    if bad or not collectives:
        raise ValueError(f"--collectives {args.collectives!r}: valid: {', '.join(comm.COLLECTIVES)}")
    sizes = [comm.parse_size(s) for s in args.sizes.split(",") if s.strip()]
    _log(f"{args.world_size} ranks, {args.dtype}, {len(sizes)} sizes, {args.repeats} repeats ...")
    rows = comm.run(args.world_size, sizes, args.dtype, collectives, args.repeats)
    print(f"{args.world_size} ranks, {args.dtype}; time per call (slowest rank, median of {args.repeats})")
    print(_table([{k: v for k, v in r.items() if k != "bytes"} for r in rows]))
    lines = comm.verdicts(rows)
    for line in lines:
        print(line)
    _write(
        args,
        {"world_size": args.world_size, "dtype": args.dtype, "repeats": args.repeats, "rows": rows, "verdicts": lines},
    )
    return 0


def resident_bytes() -> int:
    """This process's resident set (Linux /proc; 0 elsewhere)."""
    import os

    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _check_peers(peers: list[str]) -> None:
    """Refuse an unknown --peer before anything is measured or loaded."""
    known = PEERS + ["transformers-cb"] + list(PEER_FACTORIES)
    unknown = [p for p in peers if p not in known]
    if unknown:
        raise ValueError(f"--peer {unknown[0]!r} is not a peer tacit knows; one of: {', '.join(known)}")


def _setup(args: argparse.Namespace, peers: list[str]) -> tuple[Any, list[Any], dict[str, float]]:
    """tacit's engine plus the peers, all on the same weights and dtype. A GGUF that tacit keeps
    in its GGML blocks (--quantization) goes to llama.cpp as it is, so both read the quantized
    bytes; transformers still gets it dequantized (it would dequantize inside every matmul)."""
    from dataclasses import replace

    import torch

    from tacit.bench.peers.tacit_engine import TacitBench
    from tacit.bench.random_model import resolve_bench_model
    from tacit.engine.llm_engine import LLMEngine

    engine_args = EngineArgs.from_cli_args(args)
    engine_args = replace(
        engine_args,
        model=resolve_bench_model(engine_args.model),
        # bf16 is this CPU's fast path
        dtype="bfloat16" if engine_args.dtype == "auto" else engine_args.dtype,
    )
    t0 = time.perf_counter()
    engine = LLMEngine(engine_args=engine_args)
    # Before any peer loads: tacit's own load time and the memory it holds.
    load = {"load_s": time.perf_counter() - t0, "rss_after_load_mb": resident_bytes() / 1e6}
    path, dtype = engine.source.path, engine.config.model.dtype
    engines = [TacitBench(engine)]
    for peer in peers:
        _log(f"loading peer {peer} ...")
        if peer in ("transformers", "transformers-cb"):
            cls = "TransformersBench" if peer == "transformers" else "TransformersContinuousBench"
            factory, peer_args = (
                f"tacit.bench.peers.transformers_peer:{cls}",
                (path, dtype, getattr(args, "static_batch", 16)),
            )
        elif peer == "llama.cpp":
            from tacit.layers.ggml_linear_method import GGMLLinearMethod
            from tacit.layers.moe import FusedMoE

            # GGML blocks in a linear layer or an expert stack: llama.cpp reads the GGUF as it is.
            native = any(
                isinstance(getattr(m, "linear_method", None), GGMLLinearMethod)
                or (isinstance(m, FusedMoE) and m.w13_type is not None)
                for m in engine.model.modules()
            )
            if native and not path.is_file():
                raise ValueError(
                    f"--peer llama.cpp: {path} is a quantized Hugging Face checkpoint (FP8 / GPTQ / AWQ), which "
                    "llama.cpp cannot read and tacit does not export; compare with --peer llama.cpp on a GGUF of "
                    "the same model (e.g. Q8_0), or drop the peer"
                )
            gguf = path if native else _gguf_for_llamacpp(path, dtype)
            factory, peer_args = "tacit.bench.peers.llamacpp_peer:LlamaCppBench", (gguf, engine.max_model_len)
        else:
            factory, peer_args = PEER_FACTORIES[peer], (path, dtype)
        # Each peer in its own process: one that crashes or hangs loses only its own rows.
        engines.append(ProcessPeer(peer, factory, peer_args, args.peer_timeout))
    torch.manual_seed(0)
    return engine, engines, load


def _gguf_for_llamacpp(path: Path, dtype) -> Path:
    """The weights tacit runs, as a GGUF in tacit's dtype (a Q4_1 source would read 4x fewer bytes)."""
    import torch

    from tacit.loader.gguf_writer import export_hf_to_gguf, reencode_gguf
    from tacit.paths import cache_dir

    bf16 = dtype == torch.bfloat16
    out = cache_dir() / f"{path.stem if path.is_file() else path.name}.{'bf16' if bf16 else 'f32'}.gguf"
    if not out.exists():
        _log(f"writing {out} for llama.cpp ...")
        tmp = out.with_suffix(".partial")
        (reencode_gguf(path, tmp, bf16) if path.is_file() else export_hf_to_gguf(path, tmp, bf16)).rename(out)
    return out


def _write(args, payload: dict) -> None:
    if args.json:
        Path(args.json).write_text(json.dumps(payload, indent=2))
        _log(f"wrote {args.json}")


def _report_failed_peers(engines: list) -> dict[str, dict[str, str]]:
    """Print each peer that crashed or hung (its rows are missing); {'failed_peers': {name: why}}."""
    failed = {e.name: e.failure for e in engines if getattr(e, "failure", None)}
    for name, why in failed.items():
        print(f"peer {name} failed: {why}; its results are missing, the others stand")
        if name == "llama.cpp" and "SIGSEGV" in why:
            print(
                "  llama-cpp-python's native build crashes on some CPUs that advertise AMX: the README's `tacit bench` section "
                "says how to rebuild it without AMX"
            )
    for e in engines:
        close = getattr(e, "close", None)
        if close is not None:
            close()
    return {"failed_peers": failed} if failed else {}


def _print_ratios(r: dict[str, float]) -> None:
    for k, v in r.items():
        print(f"  {k}: {v:.2f}x")


def cmd_latency(args: argparse.Namespace) -> int:
    from tacit.bench import latency
    from tacit.platforms.hw_probe import peak_read_bandwidth

    _check_peers(args.peer)
    _log("measuring read bandwidth ...")
    bw = peak_read_bandwidth() / 1e9
    engine, engines, load = _setup(args, args.peer)
    wbytes = latency.weight_bytes(engine.model)
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    rows = latency.run(
        engines,
        sizes,
        args.input_len,
        args.output_len,
        engine.config.model.hf["vocab_size"],
        lambda bs: latency.active_weight_bytes(engine.model, bs),
        bw,
        repeats=args.repeats,
        progress=_log,
    )
    active = latency.active_weight_bytes(engine.model, 1)
    print(
        f"model {engine.source.path.name}, {engine.config.model.dtype}, weights {wbytes / 1e6:.0f} MB"
        + (f" ({active / 1e6:.0f} MB active per token)" if active != wbytes else "")
        + f", peak read bandwidth {bw:.1f} GB/s, input {args.input_len}, output {args.output_len}"
    )
    print(f"tacit loaded in {load['load_s']:.2f} s; resident memory after load {load['rss_after_load_mb']:.0f} MB")
    print(_table(rows))
    r = latency.ratios(rows, "decode_tok_s", "batch_size")
    _print_ratios(r)
    failed = _report_failed_peers(engines)
    experts = {}
    if engine.runner.expert_cache is not None:  # --expert-cache-memory: the whole run's counters
        experts = engine.runner.expert_cache.stats.as_dict()
        print("streamed experts: " + ", ".join(f"{k.removeprefix('expert_')} {v:.3g}" for k, v in experts.items()))
    _write(args, {"read_GBps": bw, "weight_bytes": wbytes, **load, "rows": rows, "ratios": r, **experts, **failed})
    if args.plot:
        from tacit.bench.plot import plot_lines

        plot_lines(rows, "batch_size", "decode_tok_s", args.plot, "decode tok/s by batch size")
    return 0


def cmd_throughput(args: argparse.Namespace) -> int:
    from tacit.bench import throughput

    _check_peers(args.peer)
    engine, engines, _ = _setup(args, args.peer)
    rows = throughput.run(
        engines,
        args.num_prompts,
        args.dist,
        args.input_len,
        args.output_len,
        engine.config.model.hf["vocab_size"],
        engine.max_model_len,
        args.repeats,
        progress=_log,
    )
    print(f"model {engine.source.path.name}, {engine.config.model.dtype}, {args.num_prompts} requests, {args.dist}")
    print(_table(rows))
    r = {f"tacit/{row['engine']}": rows[0]["output_tok_s"] / row["output_tok_s"] for row in rows[1:]}
    _print_ratios(r)
    failed = _report_failed_peers(engines)
    _write(args, {"rows": rows, "ratios": r, **failed})
    if args.plot:
        from tacit.bench.plot import plot_bars

        plot_bars(rows, "output_tok_s", args.plot, f"output tok/s, {args.num_prompts} {args.dist} requests")
    return 0


def cmd_workload(args: argparse.Namespace) -> int:
    from tacit.bench.workload_file import make_workload, write_workload

    reqs = make_workload(
        args.num_prompts, args.request_rate, args.dist, args.input_len, args.output_len, args.burstiness, args.seed
    )
    write_workload(reqs, args.out)
    print(f"{len(reqs)} requests over {reqs[-1].arrival_s:.2f} s -> {args.out}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import httpx

    from tacit.bench import serve

    if args.scenario:
        return cmd_scenario(args)
    slo = serve.parse_slo(args.slo)
    args.num_prompts = args.num_prompts or 64
    model = args.model
    if model is None:
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        try:
            model = httpx.get(f"{args.url.rstrip('/')}/v1/models", headers=headers, timeout=10).json()["data"][0]["id"]
        except Exception as e:
            raise ValueError(f"could not read {args.url}/v1/models to pick a model name ({e}); pass --model") from None
    try:
        fractions = [float(f) for f in args.structured_fraction.split(",")]
    except ValueError:
        raise ValueError(f"--structured-fraction {args.structured_fraction!r} is not a comma list of numbers") from None
    _log(
        f"{args.num_prompts} requests to {args.url} (model {model}), rate {args.request_rate}, "
        f"max concurrency {args.max_concurrency}"
    )

    def one_run(fraction: float, num_prompts: int, output_len: int) -> dict:
        return serve.run(
            args.url,
            model,
            num_prompts,
            args.dist,
            args.input_len,
            output_len,
            args.request_rate,
            args.burstiness,
            args.max_concurrency,
            slo,
            args.api_key,
            args.seed,
            fraction,
        )

    if any(fractions):
        # Warm-up outside the measurement: the server builds its grammar tokenizer (~0.5 s on a
        # 49k vocabulary) on the first constrained request, a one-off no run should be charged.
        one_run(1.0, 2, 4)
    if len(fractions) > 1:
        return _compare_structured(args, [one_run(f, args.num_prompts, args.output_len) for f in fractions])
    res = one_run(fractions[0], args.num_prompts, args.output_len)
    e2e = res.pop("_e2e_values")
    print(
        f"completed {res['completed']}  failed {res['failed']}  duration {res['duration_s']:.1f}s  "
        f"req/s {res['request_throughput']:.2f}  output tok/s {res['output_tok_s']:.1f}"
        + (f"  goodput req/s {res['goodput_req_s']:.2f}" if res["goodput_req_s"] is not None else "")
    )
    print(_table([{"metric": k.removesuffix("_ms"), **res[k]} for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")]))
    for err in res["errors"]:
        print(f"  error: {err}")
    _write(args, res)
    if args.plot:
        from tacit.bench.plot import plot_cdf

        plot_cdf({model: [x * 1000 for x in e2e]}, "end-to-end latency (ms)", args.plot, "latency CDF")
    return 0 if res["completed"] else 1


def _compare_structured(args: argparse.Namespace, runs: list[dict]) -> int:
    """One row per --structured-fraction, output tok/s relative to the first (the baseline)."""
    base = runs[0]["output_tok_s"]
    rows = [
        {
            "structured": r["structured_fraction"],
            "requests": r["completed"],
            "failed": r["failed"],
            "output_tok_s": r["output_tok_s"],
            "vs_first": r["output_tok_s"] / base if base else float("nan"),
            "tpot_p50_ms": r["tpot_ms"]["p50"],
            "ttft_p50_ms": r["ttft_ms"]["p50"],
        }
        for r in runs
    ]
    print(_table(rows))
    for r in runs:
        r.pop("_e2e_values")
        for err in r["errors"]:
            print(f"  error (structured {r['structured_fraction']}): {err}")
    _write(args, {"runs": runs})
    return 0 if all(r["completed"] for r in runs) else 1


def cmd_scenario(args: argparse.Namespace) -> int:
    import math
    import shlex

    from tacit.bench import scenario
    from tacit.scheduling.policy import POLICIES

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES]
    if bad or not policies:
        raise ValueError(
            f"--policies {args.policies!r}: {', '.join(bad) or 'none given'} not known; valid: {', '.join(POLICIES)}"
        )
    rate = args.request_rate if math.isfinite(args.request_rate) else scenario.DEFAULT_RATE
    args.num_prompts = args.num_prompts or scenario.DEFAULT_NUM_PROMPTS
    idle, rows = scenario.run_scenario(
        policies,
        shlex.split(args.server_args),
        args.num_prompts,
        args.input_len,
        args.output_len,
        rate,
        args.idle_requests,
        args.seed,
        log=_log,
    )
    print(
        f"scenario {args.scenario}: {args.num_prompts} requests ({scenario.INTERACTIVE_SHARE:.0%} interactive) "
        f"at {rate} req/s; idle interactive TTFT p50 {idle['idle_ttft_p50']:.1f} ms, p99 {idle['idle_ttft_p99']:.1f} ms"
    )
    print(_table([{k: v for k, v in r.items() if k != "hi_ttft_ms"} for r in rows]))
    for line in scenario.verdicts(idle, rows):
        print(line)
    _write(args, {"idle": idle, "rows": rows})
    return 0 if all(r["done"] for r in rows) else 1
