"""`tacit bench serve | workload`: load an OpenAI-compatible server (a running one at --url,
or tacit servers started per scheduling policy for a --scenario), and write the same draw of
requests as a JSONL workload file for `tacit predict --serve`."""

from __future__ import annotations

import argparse
import sys

from tacit.bench.cli_output import log, table, write_json
from tacit.bench.prefix_scenarios import PREFIX_SCENARIOS
from tacit.bench.scenario import SCENARIOS
from tacit.bench.workloads import DISTRIBUTIONS


def add_serve_parsers(bsub: argparse._SubParsersAction) -> None:
    sv = bsub.add_parser("serve", help="load an OpenAI-compatible server (tacit's or any other)")
    sv.add_argument("--url", default="http://127.0.0.1:8000")
    sv.add_argument("--model", default=None, help="model name to send (default: the server's first /v1/models)")
    sv.add_argument("--api-key", default=None)
    sv.add_argument("--num-prompts", type=int, default=None, help="default 64 (--scenario: 120)")
    sv.add_argument("--dist", default="longtail", choices=DISTRIBUTIONS)
    sv.add_argument("--input-len", type=int, default=128)
    sv.add_argument("--output-len", type=int, default=64)
    sv.add_argument(
        "--request-rate",
        default="inf",
        help="requests/s (inf: all at once); a list (1,2,4,inf) runs each in turn on the same prompts and "
        "prints latency against rate (--plot draws it: where the knee is)",
    )
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
    sv.add_argument(
        "--plot",
        default=None,
        help="PNG: latency CDF (a rate list: latency against rate; --scenario mixed-priority: TTFT/TPOT CDFs)",
    )
    sv.add_argument(
        "--scenario",
        default=None,
        choices=SCENARIOS + PREFIX_SCENARIOS + ("restart",),
        help="start tacit servers and run this workload against each (no --url): mixed-priority one per "
        "--policies; multi-turn and shared-prefix one with the prefix cache and one without, --rounds times; "
        "restart: --groups prefixes before and after a server restart, with the disk tier and without",
    )
    sv.add_argument("--policies", default="fcfs,priority,sjf,sla", help="scheduling policies the scenario compares")
    sv.add_argument("--server-args", default="", help="extra `tacit serve` flags for the scenario's servers")
    sv.add_argument("--idle-requests", type=int, default=10, help="interactive requests timed on an idle server")
    sv.add_argument("--groups", type=int, default=8, help="multi-turn: conversations; shared-prefix: prefix groups")
    sv.add_argument("--group-size", type=int, default=6, help="multi-turn: turns each; shared-prefix: requests a group")
    sv.add_argument("--prefix-tokens", type=int, default=2000, help="the shared system prompt / prefix (tokens)")
    sv.add_argument("--suffix-tokens", type=int, default=100, help="each user message / question (words ~ tokens)")
    sv.add_argument("--rounds", type=int, default=2, help="cache-on / cache-off pairs a prefix scenario runs")
    sv.add_argument(
        "--peer",
        default=None,
        choices=("llama.cpp",),
        help="multi-turn: run the conversations against llama.cpp's server (its RAM prompt cache on) on the same "
        ".gguf too, alternating with tacit; --max-concurrency 1 unless given",
    )
    sv.add_argument(
        "--llama-cpp-python",
        default=sys.executable,
        help="--peer llama.cpp: the Python with llama-cpp-python[server] installed (default: this one)",
    )
    sv.add_argument("--tier-gib", type=float, default=2.0, help="restart: the disk tier's --kv-offloading-size")
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


def cmd_serve(args: argparse.Namespace) -> int:
    import httpx

    from tacit.bench import serve
    from tacit.bench.plot import require_plotting

    if args.plot and (args.scenario in (*PREFIX_SCENARIOS, "restart") or "," in args.structured_fraction):
        raise ValueError("--plot draws one run, a --request-rate list or --scenario mixed-priority; not this one")
    require_plotting(args.plot)
    rates = parse_rates(args.request_rate)
    if args.scenario and len(rates) > 1:
        raise ValueError("--scenario runs one --request-rate; a list of rates is for a server at --url")
    args.request_rate = rates[0]
    if args.scenario in PREFIX_SCENARIOS or args.scenario == "restart":
        return cmd_prefix_scenario(args)
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
    if len(rates) > 1 and len(fractions) > 1:
        raise ValueError("--request-rate and --structured-fraction: a list for one of them at a time")
    log(
        f"{args.num_prompts} requests to {args.url} (model {model}), rate {args.request_rate}, "
        f"max concurrency {args.max_concurrency}"
    )

    def one_run(fraction: float, num_prompts: int, output_len: int, rate: float | None = None) -> dict:
        return serve.run(
            args.url,
            model,
            num_prompts,
            args.dist,
            args.input_len,
            output_len,
            args.request_rate if rate is None else rate,
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
    if len(rates) > 1:
        runs = []
        for rate in rates:
            log(f"request rate {rate}")
            runs.append(one_run(fractions[0], args.num_prompts, args.output_len, rate))
        return _latency_against_rate(args, rates, runs, model)
    res = one_run(fractions[0], args.num_prompts, args.output_len)
    e2e = res.pop("_e2e_values")
    print(
        f"completed {res['completed']}  failed {res['failed']}  duration {res['duration_s']:.1f}s  "
        f"req/s {res['request_throughput']:.2f}  output tok/s {res['output_tok_s']:.1f}"
        + (f"  goodput req/s {res['goodput_req_s']:.2f}" if res["goodput_req_s"] is not None else "")
    )
    print(table([{"metric": k.removesuffix("_ms"), **res[k]} for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")]))
    for err in res["errors"]:
        print(f"  error: {err}")
    write_json(args, res)
    if args.plot:
        from tacit.bench.plot import plot_cdf

        plot_cdf({model: [x * 1000 for x in e2e]}, "end-to-end latency (ms)", args.plot, "latency CDF")
    return 0 if res["completed"] else 1


def parse_rates(text: str) -> list[float]:
    """--request-rate: one rate or a comma list, each > 0 (inf: every request at once)."""
    try:
        rates = [float(x) for x in str(text).split(",")]
    except ValueError:
        raise ValueError(f"--request-rate {text!r} is invalid: a number of requests/s, inf, or a comma list") from None
    bad = [r for r in rates if not r > 0]
    if bad:
        raise ValueError(f"--request-rate {text!r} is invalid: every rate must be > 0 (inf: all at once)")
    return rates


def _latency_against_rate(args: argparse.Namespace, rates: list[float], runs: list[dict], model: str) -> int:
    """One row per rate: throughput and the latency percentiles; --plot draws them against rate."""
    rows = [
        {
            "request_rate": rate,
            "completed": r["completed"],
            "failed": r["failed"],
            "req_s": r["request_throughput"],
            "output_tok_s": r["output_tok_s"],
            "ttft_p50_ms": r["ttft_ms"]["p50"],
            "ttft_p99_ms": r["ttft_ms"]["p99"],
            "tpot_p50_ms": r["tpot_ms"]["p50"],
            "e2e_p50_ms": r["e2e_ms"]["p50"],
            "e2e_p99_ms": r["e2e_ms"]["p99"],
        }
        for rate, r in zip(rates, runs)
    ]
    print(table(rows))
    for r in runs:
        r.pop("_e2e_values", None)
    write_json(args, {"runs": runs, "rows": rows})
    if args.plot:
        from tacit.bench.plot import plot_lines

        # A finite x for "all at once": just past the highest finite rate, its tick labelled inf.
        top = max([r for r in rates if r != float("inf")], default=1.0) * 2
        series = [
            {"engine": f"{metric} {q}", "request_rate": min(row["request_rate"], top), "latency_ms": row[key]}
            for row in rows
            for metric, q, key in (
                ("e2e", "p50", "e2e_p50_ms"),
                ("e2e", "p99", "e2e_p99_ms"),
                ("ttft", "p99", "ttft_p99_ms"),
            )
        ]
        ticks = {min(r, top): "inf" if r == float("inf") else f"{r:g}" for r in rates}
        plot_lines(series, "request_rate", "latency_ms", args.plot, f"latency against rate, {model}", xticks=ticks)
        log(f"wrote {args.plot}")
    return 0 if all(r["completed"] for r in runs) else 1


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
    print(table(rows))
    for r in runs:
        r.pop("_e2e_values")
        for err in r["errors"]:
            print(f"  error (structured {r['structured_fraction']}): {err}")
    write_json(args, {"runs": runs})
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
        log=log,
    )
    print(
        f"scenario {args.scenario}: {args.num_prompts} requests ({scenario.INTERACTIVE_SHARE:.0%} interactive) "
        f"at {rate} req/s; idle interactive TTFT p50 {idle['idle_ttft_p50']:.1f} ms, p99 {idle['idle_ttft_p99']:.1f} ms"
    )
    print(table([{k: v for k, v in r.items() if k not in scenario.PER_REQUEST} for r in rows]))
    for line in scenario.verdicts(idle, rows):
        print(line)
    write_json(args, {"idle": idle, "rows": rows})
    if args.plot:
        scenario.plot_distributions(rows, args.plot, f"scenario {args.scenario} at {rate} req/s")
        log(f"wrote {args.plot}")
    return 0 if all(r["done"] for r in rows) else 1


def cmd_prefix_scenario(args: argparse.Namespace) -> int:
    import shlex

    from tacit.bench import prefix_scenarios

    for name in ("groups", "group_size", "prefix_tokens", "suffix_tokens", "rounds", "output_len"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)} is invalid: must be >= 1")
    if args.scenario == "restart":
        return cmd_restart_scenario(args)
    if args.peer is not None:
        return cmd_peer_multi_turn(args)
    rows = prefix_scenarios.run_prefix_scenario(
        args.scenario,
        shlex.split(args.server_args),
        args.groups,
        args.group_size,
        args.prefix_tokens,
        args.suffix_tokens,
        args.output_len,
        args.rounds,
        args.seed,
        log=log,
        max_concurrency=args.max_concurrency,
    )
    return _report(
        args,
        rows,
        prefix_scenarios.verdicts(rows),
        f"scenario {args.scenario}: {args.groups} x {args.group_size} requests, {args.prefix_tokens}-token shared "
        f"prefix, {args.suffix_tokens}-word messages, {args.output_len} tokens out",
    )


def cmd_peer_multi_turn(args: argparse.Namespace) -> int:
    import shlex

    from tacit.bench import peer_multi_turn

    if args.scenario != "multi-turn":
        raise ValueError(f"--peer {args.peer} runs with --scenario multi-turn, not {args.scenario}")
    concurrency = args.max_concurrency or 1
    rows = peer_multi_turn.run_peer_multi_turn(
        shlex.split(args.server_args),
        args.llama_cpp_python,
        args.groups,
        args.group_size,
        args.prefix_tokens,
        args.suffix_tokens,
        args.output_len,
        args.rounds,
        args.seed,
        concurrency,
        log=log,
    )
    return _report(
        args,
        rows,
        peer_multi_turn.verdicts(rows),
        f"scenario multi-turn against {args.peer}: {args.groups} x {args.group_size} turns, {concurrency} at once, "
        f"{args.prefix_tokens}-token system prompt, {args.suffix_tokens}-word messages, {args.output_len} tokens out",
    )


def cmd_restart_scenario(args: argparse.Namespace) -> int:
    import shlex

    from tacit.bench import restart_scenario

    if not args.tier_gib > 0:
        raise ValueError(f"--tier-gib {args.tier_gib} is invalid: must be > 0")
    rows = restart_scenario.run_restart_scenario(
        shlex.split(args.server_args),
        args.groups,
        args.prefix_tokens,
        args.suffix_tokens,
        args.output_len,
        args.rounds,
        args.seed,
        args.tier_gib,
        log=log,
    )
    return _report(
        args,
        rows,
        restart_scenario.verdicts(rows),
        f"scenario restart: {args.groups} prefixes of {args.prefix_tokens} tokens, a {args.suffix_tokens}-word "
        f"question each before and after a restart, {args.output_len} tokens out",
    )


def _report(args: argparse.Namespace, rows: list[dict], verdicts: list[str], header: str) -> int:
    """A scenario's header, its table, its verdict lines, and --json."""
    print(header)
    print(table(rows))
    for line in verdicts:
        print(line)
    write_json(args, {"rows": rows})
    return 0


def cmd_workload(args: argparse.Namespace) -> int:
    from tacit.bench.workload_file import make_workload, write_workload

    reqs = make_workload(
        args.num_prompts, args.request_rate, args.dist, args.input_len, args.output_len, args.burstiness, args.seed
    )
    write_workload(reqs, args.out)
    print(f"{len(reqs)} requests over {reqs[-1].arrival_s:.2f} s -> {args.out}")
    return 0
