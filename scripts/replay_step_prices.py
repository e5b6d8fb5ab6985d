"""Each step of a tune scenario's measured replay against the step model's price for that step.

`tacit tune --rank-check` compares whole replays; this says which steps the model misprices. It
replays the scenario once through tune.measure (the engine as `tacit serve` runs it, default
configuration), recording every step's chunks (each request's new tokens and cached context, as
the scheduler handed them out) and its wall time from schedule() to the end of its update, then
prices each recorded step with step_model.mixed_step_seconds under the rank check's own Pricing
(and, beside it, with decode attention at the step's mean context, unpadded, and with each
prefill chunk's attention on its own instead of torch_paged's one group), and sums measured
and priced seconds by kind (decode-only or mixed) and rows. The recording wraps
Scheduler.schedule and LLMEngine._update for this process only; a cut-in step (a prefill run
inside another step's pause) is counted in the step it paused and reported.

Run: python scripts/replay_step_prices.py [--scenario bursty-priority] [--json steps.json]
     python scripts/replay_step_prices.py --steps steps.json  (a recorded replay, priced again)
"""

import argparse
import collections
import json
import time
from dataclasses import replace

from tacit.config.engine_args import EngineArgs
from tacit.engine.llm_engine import LLMEngine
from tacit.loader.default_model import resolve_default_model
from tacit.perf_model.step_model import Chunk, MixedStep, mixed_step_seconds
from tacit.scheduling.scheduler import Scheduler
from tacit.tune.measure import measure
from tacit.tune.model_stage import ModelStage
from tacit.tune.scenario import load_scenario
from tacit.tune.space import validate_point


def record_steps(args: EngineArgs, workload) -> tuple[list[tuple[float, list[Chunk]]], int, float]:
    """(each step's (seconds, chunks), cut-in steps, the replay's duration)."""
    steps: list[tuple[float, list[Chunk]]] = []
    pending: list[tuple[float, list[Chunk]]] = []
    cut_ins = 0
    schedule, schedule_cut_in, update = Scheduler.schedule, Scheduler.schedule_cut_in, LLMEngine._update

    def recording_schedule(self):
        before = {rid: (r.num_computed_tokens, r.num_tokens) for rid, r in self.requests.items()}
        start = time.perf_counter()
        out = schedule(self)
        chunks = [Chunk(n, before[r][0], before[r][0] + n >= before[r][1]) for r, n in out.num_scheduled_tokens.items()]
        pending.append((start, chunks))
        return out

    def counting_cut_in(self):
        nonlocal cut_ins
        out = schedule_cut_in(self)
        cut_ins += bool(out.num_scheduled_tokens)
        return out

    def recording_update(self, scheduler_output, runner_output):
        out = update(self, scheduler_output, runner_output)
        if pending and len(pending[-1][1]) == len(scheduler_output.num_scheduled_tokens) > 0:
            start, chunks = pending.pop()
            steps.append((time.perf_counter() - start, chunks))
        return out

    Scheduler.schedule, Scheduler.schedule_cut_in, LLMEngine._update = (
        recording_schedule,
        counting_cut_in,
        recording_update,
    )
    try:
        result = measure(args, workload)
    finally:
        Scheduler.schedule, Scheduler.schedule_cut_in, LLMEngine._update = schedule, schedule_cut_in, update
    return steps, cut_ins, result.duration_s


def _kind(chunks: list[Chunk]) -> str:
    rows = len(chunks)
    band = "1-4" if rows <= 4 else "5-16" if rows <= 16 else "17+"
    return f"{'mixed' if any(c.new_tokens > 1 for c in chunks) else 'decode'} {band} rows"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default="bursty-priority")
    ap.add_argument("--json", help="write each step's (seconds, chunks) here")
    ap.add_argument("--steps", help="price the steps a --json run recorded instead of replaying")
    a = ap.parse_args()
    scenario = load_scenario(a.scenario)
    model = str(resolve_default_model())
    base = EngineArgs(model=model)
    stage = ModelStage(base, model, scenario, "goodput")
    args = validate_point({}, base)
    pricing = stage._pricing(args)
    if a.steps:  # a recorded replay, priced under this process's fit
        with open(a.steps) as f:
            steps = [(s, [Chunk(*c) for c in ch]) for s, ch in json.load(f)]
        print(f"{a.steps}: {len(steps)} steps")
    else:
        steps, cut_ins, duration = record_steps(args, scenario.workload)
        print(f"{a.scenario}: replay {duration:.1f} s, {len(steps)} steps recorded, {cut_ins} cut-in steps")
    # as the rank check prices them; with the prefill chunks' attention each on its own; and
    # with neither torch_paged term (decode attention at each step's mean context, chunks each)
    pricings = {
        "priced": pricing,
        "prefill chunks each": replace(pricing, prefill_one_group=False),
        "neither": replace(pricing, padded_decode_block=None),
    }
    sums = collections.defaultdict(lambda: [0, 0.0] + [0.0] * len(pricings))
    for seconds, chunks in steps:
        s = sums[_kind(chunks)]
        s[0] += 1
        s[1] += seconds
        for i, p in enumerate(pricings.values()):
            s[2 + i] += mixed_step_seconds(p, MixedStep(chunks))
    sums["all"] = [sum(col) for col in zip(*sums.values())]
    for kind, (n, measured, *priced) in sorted(sums.items(), key=lambda kv: (kv[0] == "all", kv[0])):
        errs = ", ".join(f"{name} {100 * (t / measured - 1):+.0f}%" for name, t in zip(pricings, priced))
        print(f"{kind:>18}: {n:4d} steps, measured {measured:7.2f} s; {errs}")
    if a.json:
        rows = [(s, [(c.new_tokens, c.context, c.samples) for c in ch]) for s, ch in steps]
        with open(a.json, "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
