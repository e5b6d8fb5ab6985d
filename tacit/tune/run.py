"""`tacit tune`'s run: the model stage, the measured stage within the budget, the confirmation,
and the recipe written from them (search.py says why each stage is there)."""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from tacit.config.engine_args import EngineArgs
from tacit.tune.accuracy import AccuracyGate
from tacit.tune.model_stage import ModelStage
from tacit.tune.objective import OBJECTIVES
from tacit.tune.recipe_out import point_words, write_readme, write_recipe
from tacit.tune.scenario import Scenario
from tacit.tune.search import CONFIRM_CANDIDATES, SEARCH_SHARE, Measure, MeasuredSearch, model_search, real_measure
from tacit.tune.space import Dimension, sample, search_space, validate_point

# Candidates from the model stage measured first (with the default): its best distinct points.
MODEL_PICKS = 3
# A trial or round is started only if the mean so far, with this margin, still fits the budget.
MARGIN = 1.2


@dataclass
class TuneRequest:
    base: EngineArgs
    model: str  # the model path the performance model reads
    scenario: Scenario
    objective: str = "goodput"
    budget_s: float = 30 * 60
    hardware: str = "this-cpu"
    out_dir: Path = Path("tune-out")
    seed: int = 0
    model_trials: int = 200
    command: str = ""
    # --accuracy-budget: the mean KL divergence (nats per token) a configuration that changes
    # outputs may reach (accuracy.py); None leaves those knobs out of the search
    accuracy_budget: float | None = None


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rho (average ranks for ties); None under three pairs or a constant side."""
    if len(a) < 3:
        return None

    def ranks(x: list[float]) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        order = np.argsort(x, kind="mergesort")
        r = np.empty(len(x))
        r[order] = np.arange(len(x))
        for v in np.unique(x):  # ties share their mean rank
            r[x == v] = r[x == v].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def _spaces(req: TuneRequest) -> tuple[list[Dimension], list[Dimension]]:
    """(the model stage's space, the measured stage's). On this machine the model stage leaves out
    the layouts the one-process measured stage cannot run, so both search the same knobs."""
    outputs = req.accuracy_budget is not None
    model_space = search_space(outputs, base=req.base, stage="model")
    if req.hardware != "this-cpu":
        return model_space, []
    measured = search_space(outputs, base=req.base, stage="measured")
    names = {d.name for d in measured}
    return [d for d in model_space if d.name in names], measured


def _restrict(point: dict[str, Any], space: list[Dimension]) -> dict[str, Any]:
    names = {d.name for d in space}
    return {k: v for k, v in point.items() if k in names}


def tune(req: TuneRequest) -> dict:
    """Run the stages; write recipe.yaml, README.md and report.json into req.out_dir; return the report."""
    if req.objective not in OBJECTIVES:
        raise ValueError(f"--objective {req.objective!r} is not known; valid: {', '.join(OBJECTIVES)}")
    t0 = time.monotonic()
    req.out_dir.mkdir(parents=True, exist_ok=True)
    model_space, measured_space = _spaces(req)
    stage = ModelStage(req.base, req.model, req.scenario, req.objective, req.hardware)
    priced = model_search(stage, model_space, req.base, req.model_trials, req.seed)
    defaults = {d.name: d.default for d in model_space + measured_space}
    default_pred = next(p for p in priced if not p.point)
    print(
        f"model stage: {len(priced)} configurations priced in {time.monotonic() - t0:.0f} s; "
        f"default {default_pred.value:.3g}, best {priced[0].value:.3g} ({point_words(priced[0].point, defaults)})",
        file=sys.stderr,
    )
    report: dict[str, Any] = {
        "name": f"{req.scenario.name}-{req.objective}",
        "scenario": req.scenario.name,
        "scenario_description": req.scenario.description,
        "objective": req.objective,
        "slo": _slo_words(req.scenario),
        "hardware": req.hardware,
        "command": req.command,
        "defaults": defaults,
        "model_default": default_pred.value,
        "model_top": [{"point": p.point, "value": p.value} for p in priced[:5]],
    }
    if not measured_space:  # --hardware NAME: the model's answer is the whole answer
        best = priced[0]
        args = validate_point(best.point, req.base)
        ratio = best.value / default_pred.value if default_pred.value > 0 else math.nan
        report["verdict"] = (
            f"Predicted only (no measurement on {req.hardware}): {point_words(best.point, defaults)} at "
            f"{best.value:.3g} against the default's {default_pred.value:.3g} ({ratio:.2f}x)."
        )
        return _finish(req, report, args)
    return _measured(req, stage, model_space, measured_space, priced, report, t0)


def _slo_words(s: Scenario) -> str:
    def ms(b: dict[str, float]) -> str:
        return ",".join(f"{k}={1000 * v:g}ms" for k, v in b.items())

    parts = [f"priority {p}: {ms(b)}" for p, b in sorted(s.slo.classes.items())]
    return "; ".join(parts + ([f"others: {ms(s.slo.default)}"] if s.slo.default else []))


def _measured(req, stage, model_space, measured_space, priced, report, t0) -> dict:
    def predict(point: dict[str, Any]) -> float | None:
        v = stage.predict(_restrict(point, model_space)).value
        return v if math.isfinite(v) else None

    _, direction = OBJECTIVES[req.objective]
    measure = real_measure(req.base, req.scenario, req.objective, req.seed)
    gate = None
    if req.accuracy_budget is not None:
        gate = AccuracyGate(req.base, req.accuracy_budget, req.out_dir / "accuracy.json")
        measure = gate(measure)
    search = MeasuredSearch(
        req.out_dir,
        report["name"],
        measured_space,
        req.base,
        measure,
        predict,
        req.seed,
        worst=0.0 if direction == "maximize" else -1e6,
    )
    picks, seen = [{}], {"{}"}
    for p in priced:
        key = json.dumps(_restrict(p.point, measured_space), sort_keys=True)
        if math.isfinite(p.value) and key not in seen and len(picks) <= MODEL_PICKS:
            seen.add(key)
            picks.append(_restrict(p.point, measured_space))
    search.enqueue(picks)
    bar = tqdm(total=round(req.budget_s), unit="s", desc=f"tune {req.scenario.name}", file=sys.stderr)

    def elapsed() -> float:
        return time.monotonic() - t0

    def tick(what: str) -> None:
        bar.n = min(round(elapsed()), bar.total)
        bar.set_postfix_str(what)
        bar.refresh()

    durations: list[float] = []
    while True:
        est = MARGIN * (sum(durations) / len(durations)) if durations else 0.0
        if durations and elapsed() + est > SEARCH_SHARE * req.budget_s:
            break
        t = search.step()
        durations.append(t.seconds)
        tick(f"trial {t.number}: {'infeasible' if t.value is None else f'{t.value:.3g}'}")
        if elapsed() >= SEARCH_SHARE * req.budget_s:
            break
    trial_s = sum(durations) / len(durations)
    # As many candidates (up to CONFIRM_CANDIDATES) as leave room for two rounds: one ratio with
    # an interval beats two without
    room = (req.budget_s - elapsed()) / (MARGIN * 2 * 2 * trial_s)
    conf = search.candidates(max(1, min(CONFIRM_CANDIDATES, int(room))))
    rounds = len(conf[0].values) if conf else 0
    while conf and elapsed() + MARGIN * 2 * len(conf) * trial_s <= req.budget_s:
        search.confirm_round(conf, rounds)
        rounds += 1
        tick(f"confirmation round {rounds}")
    bar.close()
    if gate is not None:
        report["accuracy_budget"], report["accuracy"] = req.accuracy_budget, gate.report()
    return _conclude(req, search, conf, report, elapsed())


def _conclude(req, search, conf, report, seconds) -> dict:
    trials = search.trials()
    feasible = [t for t in trials if t.value is not None and t.predicted is not None]
    report["trials"] = [asdict(t) for t in trials]
    report["spearman"] = spearman([t.predicted for t in feasible], [t.value for t in feasible])
    report["importance"] = _importance(search)
    report["confirmation"] = [{**asdict(c), "ratio": c.ratio()} for c in conf]
    report["seconds"] = seconds
    ranked = sorted((c for c in conf if c.ratio() is not None), key=lambda c: -c.ratio()[0])
    if ranked and ranked[0].ratio()[1] > 1.0:
        best = ranked[0]
        r = best.ratio()
        args = validate_point(best.point, req.base)
        report["verdict"] = (
            f"{point_words(best.point, report['defaults'])}: {r[0]:.2f}x the default's {req.objective} "
            f"(95% interval {r[1]:.2f}-{r[2]:.2f}) over {len(best.values)} alternated rounds."
        )
    else:
        args = req.base
        why = (
            f"the best candidate's ratio {ranked[0].ratio()[0]:.2f}x has a 95% interval from "
            f"{ranked[0].ratio()[1]:.2f} to {ranked[0].ratio()[2]:.2f}"
            if ranked
            else "no candidate completed two alternated rounds within the budget"
        )
        report["verdict"] = f"The defaults stay: no configuration beat them with confidence ({why})."
    return _finish(req, report, args)


def _importance(search: MeasuredSearch) -> dict[str, float] | None:
    import optuna

    done = [t for t in search.study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if len(done) < 4:
        return None
    try:
        return optuna.importance.get_param_importances(search.study)
    except (RuntimeError, ValueError):  # e.g. every completed trial drew the same values
        return None


def _finish(req: TuneRequest, report: dict, args: EngineArgs) -> dict:
    why = f"Written by tacit tune: {report['verdict']}\nWhy, with the measurements: README.md in this folder."
    hardware = req.hardware
    if hardware == "this-cpu":  # a recipe read elsewhere should say which machine measured it
        from tacit.perf_model.calibration import cpu_name
        from tacit.platforms.hardware_table import get_hardware_spec

        hardware = f"{cpu_name()} ({get_hardware_spec('this-cpu').description}), measured"
    write_recipe(req.out_dir, report["name"], report["scenario_description"], hardware, args, why)
    write_readme(req.out_dir, report)
    (req.out_dir / "report.json").write_text(json.dumps(report, indent=1, default=str))
    print(report["verdict"], file=sys.stderr)
    return report


def measure_rounds(points: list[dict[str, Any]], run: Measure, rounds: int, progress: tqdm | None = None) -> list[list]:
    """Each point measured once a round, `rounds` rounds: (value, error) per round and point.
    The order reverses every other round (A B C, C B A, ...) so a machine that drifts through
    the run weighs on every point alike: one replay a configuration on the AVX2 EPYC ranked the
    same 12 configurations with a rho of 0.72 between two runs."""
    out: list[list] = [[None] * len(points) for _ in range(rounds)]
    for r in range(rounds):
        order = range(len(points)) if r % 2 == 0 else reversed(range(len(points)))
        for i in order:
            value, _, error = run(points[i])
            out[r][i] = (value, error)
            if progress is not None:
                progress.update(1)
    return out


def rank_summary(predicted: list[float], measured: list[list]) -> dict:
    """Spearman's rho of the predictions against the mean measurement over the rounds, over the
    points every round measured; against each round alone; and the rounds against each other
    (the mean over pairs): the repeatability that bounds what any prediction can reach."""
    ok = [
        i for i, pred in enumerate(predicted) if math.isfinite(pred) and all(rnd[i][0] is not None for rnd in measured)
    ]
    per_round = [[rnd[i][0] for i in ok] for rnd in measured]
    mean = [float(np.mean(col)) for col in zip(*per_round)] if ok else []
    pred = [predicted[i] for i in ok]
    pairs = [spearman(a, b) for j, a in enumerate(per_round) for b in per_round[j + 1 :]]
    pairs = [r for r in pairs if r is not None]
    return {
        "configurations": len(ok),
        "spearman": spearman(pred, mean),
        "spearman_each_round": [spearman(pred, m) for m in per_round],
        "repeatability": float(np.mean(pairs)) if pairs else None,
        "mean_measured": dict(zip(ok, mean)),
    }


def rank_check(req: TuneRequest, n: int, rounds: int = 1) -> dict:
    """n configurations drawn at random (seeded; not the model's picks; the first the default),
    each predicted, and measured once a round (measure_rounds): Spearman's rho between the two
    rankings (rank_summary)."""
    model_space, measured_space = _spaces(req)
    stage = ModelStage(req.base, req.model, req.scenario, req.objective, req.hardware)
    rng = np.random.default_rng(req.seed)
    points = [_restrict(sample(measured_space, rng, req.base), model_space) if i else {} for i in range(n)]
    preds = [stage.predict(point) for point in points]
    run = real_measure(req.base, req.scenario, req.objective, req.seed)
    with tqdm(total=n * rounds, desc="rank check", file=sys.stderr) as bar:
        measured = measure_rounds(points, run, rounds, bar)
    summary = rank_summary([p.value for p in preds], measured)
    mean = summary.pop("mean_measured")
    rows = [
        {
            "point": point,
            "predicted": pred.value,
            "measured": mean.get(i),
            "measured_each_round": [rnd[i][0] for rnd in measured],
            "error": next((rnd[i][1] for rnd in measured if rnd[i][1]), "") or pred.error,
        }
        for i, (point, pred) in enumerate(zip(points, preds))
    ]
    out = {"rows": rows, "rounds": rounds, **summary}
    req.out_dir.mkdir(parents=True, exist_ok=True)
    (req.out_dir / "rank_check.json").write_text(json.dumps(out, indent=1, default=str))
    return out
