"""`tacit tune`: the best engine configuration for a workload and its SLOs (issue 38)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from tacit.config.engine_args import EngineArgs
from tacit.tune.objective import OBJECTIVES


def add_tune_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune",
        help="search engine configurations for a workload and its SLOs: the performance model ranks, "
        "measured trials decide, a recipe comes out",
    )
    EngineArgs.add_cli_args(p)  # the base configuration (and --recipe) the search starts from
    t = p.add_argument_group("tune", "tacit tune's own flags")
    what = t.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--scenario", default=None, help="a committed scenario: chat-high-rate, retrieval-long, bursty-priority"
    )
    what.add_argument(
        "--workload", default=None, metavar="FILE", help="a JSONL workload (tacit bench workload writes one)"
    )
    t.add_argument("--slo", default=None, help="with --workload: ttft=MS,tpot=MS (every request held to it)")
    t.add_argument("--objective", default="goodput", choices=list(OBJECTIVES))
    t.add_argument("--budget-minutes", type=float, default=30.0, help="wall-clock budget of the whole search")
    t.add_argument(
        "--hardware",
        default="this-cpu",
        help="this-cpu (measured) or a part from `tacit predict --list-hardware`: model-only, nothing measured",
    )
    t.add_argument("--out", required=True, help="directory: recipe.yaml, README.md, report.json, study.db (resumable)")
    t.add_argument(
        "--accuracy-budget",
        type=float,
        default=None,
        metavar="KLD",
        help="also search the knobs that change outputs (weight quantization, an int8 KV cache); a configuration "
        "that sets them is first checked with tacit eval kld against the base configuration and is infeasible "
        "when its mean KL divergence (nats per token) is over KLD",
    )
    t.add_argument("--model-trials", type=int, default=200, help="configurations the model-only stage prices")
    t.add_argument("--search-seed", type=int, default=0, help="seeds the samplers and the prompts")
    t.add_argument(
        "--rank-check",
        type=int,
        default=None,
        metavar="N",
        help="instead of tuning: measure N random configurations and report Spearman's rho between the "
        "model's ranking and the measured one",
    )
    t.add_argument(
        "--compare",
        nargs="+",
        default=None,
        metavar="CONFIG",
        help="instead of tuning: measure these in alternation (default, a recipe file or folder, adaptive:X "
        "for X under --adaptive); goodput and P99 TTFT with their spread, goodput over the first one's",
    )
    t.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="--compare's rounds (default 5), or --rank-check's: each configuration measured once a round, "
        "ranked by its mean (default 1)",
    )
    p.set_defaults(func=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    from tacit.loader.default_model import resolve_default_model
    from tacit.tune.accuracy import check_budget
    from tacit.tune.run import TuneRequest, rank_check, tune
    from tacit.tune.scenario import load_scenario, workload_scenario

    if args.budget_minutes <= 0:
        raise ValueError(f"--budget-minutes must be > 0, got {args.budget_minutes}")
    if args.model_trials < 1:
        raise ValueError(f"--model-trials must be >= 1, got {args.model_trials}")
    if check_budget(args.accuracy_budget) is not None and (
        args.hardware != "this-cpu" or args.compare is not None or args.rank_check is not None
    ):
        raise ValueError(
            "--accuracy-budget goes with a measured search (--hardware this-cpu, no --compare or --rank-check): "
            "accuracy is measured, the performance model cannot price it"
        )
    if args.slo and not args.workload:
        raise ValueError("--slo goes with --workload; a --scenario carries its own SLOs")
    scenario = load_scenario(args.scenario) if args.scenario else workload_scenario(args.workload, args.slo)
    base = EngineArgs.from_cli_args(args)
    base.check()
    model = str(resolve_default_model()) if base.model is None else base.model
    req = TuneRequest(
        base,
        model,
        scenario,
        args.objective,
        args.budget_minutes * 60,
        args.hardware,
        Path(args.out),
        args.search_seed,
        args.model_trials,
        "tacit " + " ".join(shlex.quote(a) for a in getattr(args, "argv", sys.argv[1:])),
        args.accuracy_budget,
    )
    if args.compare is not None:
        from tacit.tune.compare import compare, contender, print_summary

        repeats = 5 if args.repeats is None else args.repeats
        if repeats < 2:
            raise ValueError(f"--repeats must be >= 2 (a spread needs two runs), got {repeats}")
        contenders = [contender(c, base, scenario) for c in args.compare]
        print_summary(compare(contenders, scenario, repeats, req.out_dir, args.search_seed))
        return 0
    if args.rank_check is not None:
        if args.rank_check < 3 or args.hardware != "this-cpu":
            raise ValueError("--rank-check N needs N >= 3 and this machine (--hardware this-cpu): it measures")
        rounds = 1 if args.repeats is None else args.repeats
        if rounds < 1:
            raise ValueError(f"--repeats must be >= 1 with --rank-check, got {rounds}")
        out = rank_check(req, args.rank_check, rounds)
        print(
            f"Spearman's rho, predicted against measured (the mean of {rounds} round(s)), "
            f"{out['configurations']} of {args.rank_check} configurations: {_rho(out['spearman'])}"
            f" (rows: {req.out_dir / 'rank_check.json'})"
        )
        if rounds > 1:
            each = ", ".join(_rho(r) for r in out["spearman_each_round"])
            print(f"against each round: {each}; the rounds against each other: {_rho(out['repeatability'])}")
        return 0
    tune(req)
    print(f"recipe: {req.out_dir / 'recipe.yaml'}; serve it with: tacit serve --recipe {req.out_dir}")
    return 0


def _rho(r: float | None) -> str:
    return "n/a" if r is None else f"{r:.2f}"
