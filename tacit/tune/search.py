"""The two stages of `tacit tune`.

1. model_search: Optuna's TPE over the serve simulator (ModelStage.predict, ~0.1 s a point),
   a few hundred points in well under a minute; its best distinct points are the measured stage's
   first candidates.
2. measured_search: an Optuna study stored in SQLite (resumable: the same --out continues it),
   each trial one replay of the scenario on the real engine (measure.measure). The default
   configuration and the model's picks are enqueued first, then TPE proposes. A configuration that
   fails (does not build, runs out of memory, loses a request) is recorded as a FAIL trial with its
   error: infeasible, never a winner.
3. confirm: noise must not pick the winner. On 2 shared cores the same configuration's goodput
   moves by tens of percent between runs, and a single lucky run tops a single-run search. The
   best few trials are re-measured in rounds alternating with the default configuration (default,
   candidate, candidate, default, ...: drift hits both alike), and the winner is the candidate
   whose objective over the default's has the best mean, with a bootstrap 95% interval. Unless
   that interval lies above 1, the default stays: the search then says, with that interval, that
   it did not beat the defaults.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from tacit.config.engine_args import EngineArgs
from tacit.tune.measure import measure
from tacit.tune.model_stage import ModelStage, Prediction
from tacit.tune.objective import bootstrap_ratio, objective_value
from tacit.tune.scenario import Scenario
from tacit.tune.space import Dimension, suggest, validate_point

# Share of the budget the search may spend before confirmation takes over (the rest alternates
# the best candidates with the default: a ratio needs at least two rounds of each).
SEARCH_SHARE = 0.5
CONFIRM_CANDIDATES = 2


def _key(point: dict[str, Any]) -> str:
    return json.dumps(point, sort_keys=True)


def model_search(
    stage: ModelStage, space: list[Dimension], base: EngineArgs, n_trials: int, seed: int = 0
) -> list[Prediction]:
    """Every point the model priced, best first (the default configuration among them)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    priced: dict[str, Prediction] = {"{}": stage.predict({})}
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))

    def objective(trial: optuna.Trial) -> float:
        point = suggest(space, trial, base)
        p = stage.predict(point)
        priced.setdefault(_key(point), p)
        if not math.isfinite(p.value):
            raise optuna.TrialPruned(p.error or "nothing completed")
        return p.value

    study.optimize(objective, n_trials=n_trials)
    # Within 1% of the default is a tie (the simulator's own resolution): the default ranks first
    default = priced["{}"].value
    tie = 0.01 * abs(default) if math.isfinite(default) else 0.0
    return sorted(priced.values(), key=lambda p: -(default + tie if not p.point else p.value))


@dataclass
class Trial:
    number: int
    point: dict[str, Any]
    value: float | None  # None: infeasible
    scores: dict[str, float] | None
    error: str
    predicted: float | None
    seconds: float


@dataclass
class Confirmation:
    """A candidate's and the default's objective values (objective_value: larger is better; a
    minimized objective is stored negated), one of each per round."""

    point: dict[str, Any]
    values: list[float] = field(default_factory=list)
    defaults: list[float] = field(default_factory=list)

    def ratio(self) -> tuple[float, float, float] | None:
        """(median, low, high) of how many times better the candidate is than the default
        (goodput: mean(candidate) / mean(default); a minimized one, p99 TTFT: default over
        candidate), a bootstrap 95% interval; None before two rounds or where it is undefined."""
        if len(self.values) < 2 or len(self.defaults) < 2:
            return None
        if all(v >= 0 for v in self.values + self.defaults):
            return None if max(self.defaults) <= 0 else bootstrap_ratio(self.values, self.defaults)
        if all(v < 0 for v in self.values + self.defaults):
            return bootstrap_ratio([-v for v in self.defaults], [-v for v in self.values])
        return None


Measure = Callable[[dict[str, Any]], tuple[float | None, dict | None, str]]


def real_measure(base: EngineArgs, scenario: Scenario, objective: str, seed: int = 0) -> Measure:
    """One replay of the scenario on the real engine with point's configuration."""

    def run(point: dict[str, Any]) -> tuple[float | None, dict | None, str]:
        try:
            args = validate_point(point, base)
        except ValueError as e:
            return None, None, str(e)
        result = measure(args, scenario.workload, seed=seed)
        if not result.ok:
            return None, None, result.error
        scores = result.score(scenario.slo)
        return objective_value(scores, objective), scores, ""

    return run


class MeasuredSearch:
    """The measured stage and its confirmation, stored in out_dir (study.db, confirm.json)."""

    def __init__(
        self,
        out_dir: Path,
        study_name: str,
        space: list[Dimension],
        base: EngineArgs,
        run: Measure,
        predict: Callable[[dict[str, Any]], float | None],
        seed: int = 0,
        worst: float = 0.0,
    ):
        """worst: the value a failed confirmation run counts as (goodput: 0, nothing served)."""
        self.out_dir, self.space, self.base, self.run, self.predict = out_dir, space, base, run, predict
        self.worst = worst
        out_dir.mkdir(parents=True, exist_ok=True)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.study = optuna.create_study(
            study_name=study_name,
            storage=f"sqlite:///{out_dir / 'study.db'}",
            load_if_exists=True,
            direction="maximize",
        )
        # A resumed study draws on from a seed of its own, not the first run's sequence again.
        self.study.sampler = optuna.samplers.TPESampler(seed=seed + len(self.study.trials))
        self.confirm_path = out_dir / "confirm.json"

    def trials(self) -> list[Trial]:
        out = []
        for t in self.study.trials:
            if t.state not in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL):
                continue
            attrs = t.user_attrs
            out.append(
                Trial(
                    t.number,
                    attrs.get("point", {}),
                    t.value if t.state == optuna.trial.TrialState.COMPLETE else None,
                    attrs.get("scores"),
                    attrs.get("error", ""),
                    attrs.get("predicted"),
                    attrs.get("seconds", 0.0),
                )
            )
        return out

    def enqueue(self, points: list[dict[str, Any]]) -> None:
        """The default and the model's picks go first, once per study (not again on a resume)."""
        if self.study.trials:
            return
        # Completed with the base's values: an enqueued trial fixes only the parameters it names,
        # and TPE would draw the rest (an empty point would be a random one, not the default).
        held = {d.name: d.default for d in self.space if d.default is not None}
        for p in points:
            self.study.enqueue_trial({**held, **p}, skip_if_exists=True)

    def step(self) -> Trial:
        """One trial: TPE's (or an enqueued) point, measured, told to the study."""
        trial = self.study.ask()
        point = suggest(self.space, trial, self.base)
        t0 = time.perf_counter()
        value, scores, error = self.run(point)
        seconds = time.perf_counter() - t0
        trial.set_user_attr("point", point)
        trial.set_user_attr("seconds", seconds)
        trial.set_user_attr("predicted", self.predict(point))
        if scores is not None:
            trial.set_user_attr("scores", scores)
        if value is None or not math.isfinite(value):
            trial.set_user_attr("error", error or "nothing completed")
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            self.study.tell(trial, value)
        return self.trials()[-1]

    # ---- confirmation ---------------------------------------------------------------------------

    def confirmations(self) -> list[Confirmation]:
        if not self.confirm_path.exists():
            return []
        return [Confirmation(**c) for c in json.loads(self.confirm_path.read_text())]

    def _save(self, conf: list[Confirmation]) -> None:
        self.confirm_path.write_text(json.dumps([c.__dict__ for c in conf], indent=1))

    def candidates(self, limit: int = CONFIRM_CANDIDATES) -> list[Confirmation]:
        """The confirmation's candidates: kept from a previous run, else the best `limit`
        distinct feasible trials that are not the default."""
        conf = self.confirmations()
        if conf:
            return conf
        best: dict[str, Trial] = {}
        for t in sorted((t for t in self.trials() if t.value is not None), key=lambda t: -t.value):
            if _key(t.point) not in best and validate_point(t.point, self.base) != self.base:
                best[_key(t.point)] = t
        conf = [Confirmation(t.point) for t in list(best.values())[:limit]]
        self._save(conf)
        return conf

    def confirm_round(self, conf: list[Confirmation], round_index: int) -> None:
        """One round: each candidate next to a fresh run of the default, the order flipped every
        round so a drift of the machine's speed falls on both alike."""
        for c in conf:
            pair = [{}, c.point] if round_index % 2 == 0 else [c.point, {}]
            for point in pair:
                value, _, _ = self.run(point)
                v = value if value is not None and math.isfinite(value) else self.worst
                (c.defaults if not point else c.values).append(v)
            self._save(conf)
