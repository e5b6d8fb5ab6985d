"""`tacit tune --compare A B ... --repeats N`: configurations measured in alternation on one
scenario, N rounds (A, B, ..., then the next round in reverse order, so a drift of the machine's
speed falls on all alike): each one's goodput and P99 TTFT with their spread over the rounds,
and its goodput over the first one's with a bootstrap 95% interval.

A configuration is `default` (the base), a recipe (its file or folder), or `adaptive:X` (X run
as `tacit serve --adaptive` runs it: the budget and the long-prefill cap moved from live load
within AdaptiveBounds' defaults, the TPOT target the scenario's tightest)."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm import tqdm

from tacit.config.engine_args import EngineArgs
from tacit.scheduling.adaptive import AdaptiveBounds
from tacit.tune.measure import measure
from tacit.tune.objective import bootstrap_ratio, spread
from tacit.tune.scenario import Scenario


@dataclass(frozen=True)
class Contender:
    label: str
    args: EngineArgs
    adaptive: AdaptiveBounds | None = None


def contender(spec: str, base: EngineArgs, scenario: Scenario) -> Contender:
    adaptive = spec.startswith("adaptive:")
    name = spec.removeprefix("adaptive:")
    if name == "default":
        args = base
    else:
        if not Path(name).exists():
            raise ValueError(f"--compare {spec!r}: no recipe at {name}; give default, a recipe, or adaptive:X")
        # the recipe's settings over the base's (its model, dtype and device stay the command line's)
        args = replace(base, **EngineArgs.load_recipe(name).engine_args)
    bounds = None
    if adaptive:
        tpots = [b["tpot"] for b in [scenario.slo.default, *scenario.slo.classes.values()] if "tpot" in b]
        if not tpots:
            raise ValueError(f"--compare {spec!r}: the scenario sets no TPOT bound for the controller to keep")
        bounds = AdaptiveBounds(tpot_ms=1000 * min(tpots))
    return Contender(spec, args, bounds)


def compare(contenders: list[Contender], scenario: Scenario, repeats: int, out: Path, seed: int = 0) -> dict:
    runs: dict[str, list[dict]] = {c.label: [] for c in contenders}
    order = list(contenders)
    bar = tqdm(total=repeats * len(order), desc=f"compare on {scenario.name}", file=sys.stderr)
    for r in range(repeats):
        for c in order if r % 2 == 0 else order[::-1]:
            result = measure(c.args, scenario.workload, seed=seed, adaptive=c.adaptive)
            runs[c.label].append(result.score(scenario.slo) if result.ok else {"error": result.error})
            bar.update(1)
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.json").write_text(json.dumps({"scenario": scenario.name, "runs": runs}, indent=1))
    bar.close()
    first = contenders[0].label
    summary = {}
    for c in contenders:
        ok = [s for s in runs[c.label] if "error" not in s]
        good = [s["goodput_req_s"] for s in ok]
        p99 = [s["p99_ttft_s"] for s in ok if not math.isnan(s["p99_ttft_s"])]
        base_good = [s["goodput_req_s"] for s in runs[first] if "error" not in s]
        row = {
            "runs": len(runs[c.label]),
            "failed": len(runs[c.label]) - len(ok),
            "goodput_mean": sum(good) / len(good) if good else math.nan,
            "p99_ttft_mean_s": sum(p99) / len(p99) if p99 else math.nan,
        }
        if len(p99) >= 2:
            row["p99_ttft_std_s"], row["p99_ttft_iqr_s"] = spread(p99)
        if c.label != first and len(good) >= 2 and len(base_good) >= 2 and max(base_good) > 0:
            row["goodput_ratio"] = bootstrap_ratio(good, base_good)
        summary[c.label] = row
    result = {"scenario": scenario.name, "repeats": repeats, "runs": runs, "summary": summary}
    (out / "compare.json").write_text(json.dumps(result, indent=1))
    return result


def print_summary(result: dict) -> None:
    print(f"{result['scenario']}, {result['repeats']} alternated rounds")
    print(f"  {'configuration':<40}{'goodput':>10}{'x first (95% CI)':>22}{'P99 TTFT s':>12}{'std':>8}{'IQR':>8}")
    for label, row in result["summary"].items():
        r = row.get("goodput_ratio")
        ratio = f"{r[0]:.2f} ({r[1]:.2f}-{r[2]:.2f})" if r else "-"
        std, iqr = row.get("p99_ttft_std_s", math.nan), row.get("p99_ttft_iqr_s", math.nan)
        print(
            f"  {label[:40]:<40}{row['goodput_mean']:>10.3f}{ratio:>22}{row['p99_ttft_mean_s']:>12.2f}"
            f"{std:>8.2f}{iqr:>8.2f}" + (f"  ({row['failed']} failed)" if row["failed"] else "")
        )
