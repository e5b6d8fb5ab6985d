"""Run real engine steps and time each one by step kind, layer and operator class.

The torch path is timed by module hooks (timer.py); the fused C++ decode step by its own
per-layer phase timers (FusedDecoder.set_phase_timing), switched on only while profiling;
communication is the step's change in ModelRunner.communication_seconds(). Whatever the step's
wall time (around LLMEngine.step(): scheduling and output processing included) holds beyond
those is Python/host.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tacit.bench.workloads import random_prompts
from tacit.profiler.categories import HEAD, layer_of, module_category
from tacit.profiler.timer import SpanTimer
from tacit.sampling_params import SamplingParams


@dataclass(frozen=True)
class WorkloadRequest:
    input_len: int
    output_len: int
    arrival_step: int = 0  # added before this step (0: at the start); later arrivals make mixed steps


@dataclass
class StepRecord:
    kind: str  # prefill, decode or mixed
    step_s: float
    rows: list[tuple[int, int]]  # per request: (tokens computed this step, tokens computed before)
    num_samples: int
    layers: dict[str, dict[str, float]]  # layer -> category -> seconds (host: only what was measured there)
    categories: dict[str, float] = field(default_factory=dict)  # every category; host = the remainder
    cached_tokens: int = 0  # prompt tokens this step's new requests found in the prefix cache (not computed)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "step_s": self.step_s,
            "rows": [list(r) for r in self.rows],
            "num_samples": self.num_samples,
            "categories": self.categories,
            "layers": self.layers,
            "cached_tokens": self.cached_tokens,
        }


def step_kind(rows: list[tuple[int, int, bool]]) -> str:
    """rows: (new tokens, computed before, past its prompt) -> decode if every row is past its
    prompt (verify if one of them computes drafts too), prefill if none is, else mixed."""
    decodes = sum(past for _, _, past in rows)
    if decodes == len(rows):
        return "verify" if any(n > 1 for n, _, _ in rows) else "decode"
    return "prefill" if decodes == 0 else "mixed"


class _TimedFusedDecoder:
    """Stands in for the runner's fused decoder while profiling: final_norm timed as a norm; the
    layers' phases come from the C++ timers; everything else passes through."""

    def __init__(self, inner: Any, timer: SpanTimer) -> None:
        self._inner = inner
        self.num_layers = inner.num_layers
        self.final_norm = timer.wrap(inner.final_norm, "norm", HEAD)

    def embed(self, token_ids: Any) -> Any:
        return self._inner.embed(token_ids)

    def run_layers(self, *args: Any) -> None:
        self._inner.run_layers(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Profiler:
    """Installs the timers on an engine (rank 0's runner under tensor parallelism) for the
    length of a `with` block; step() runs and records one engine step."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.runner = engine.runner
        self.timer = SpanTimer()
        self._handles: list[Any] = []
        self._undo: list[Any] = []
        self._fused = self.runner.fused_decode
        self._phase_names: list[str] = []
        self._phase_before: list[float] = []
        self._last_rows: list[tuple[int, int, bool]] | None = None
        self._last_samples = 0

    def __enter__(self) -> Profiler:
        runner, timer = self.runner, self.timer
        for name, module in runner.model.named_modules():
            category = module_category(name, module)
            if category is None:
                continue
            tp = getattr(module, "tp", None)
            comm = module if hasattr(module, "comm_seconds") and tp is not None and tp.size > 1 else None
            layer = layer_of(name)
            self._handles.append(
                module.register_forward_pre_hook(lambda m, a, c=category, ly=layer, cm=comm: timer.push(c, ly, cm))
            )
            self._handles.append(module.register_forward_hook(lambda m, a, o: timer.pop()))
            kernel = getattr(module, "kernel", None)
            if category == "experts" and kernel is not None and "route" not in vars(kernel):
                # One kernel object may serve every MoE layer: wrapped once, the layer comes from
                # the enclosing FusedMoE's span.
                kernel.route = timer.wrap(kernel.route, "moe_routing")
                kernel.experts = timer.wrap(kernel.experts, "experts")
                self._undo.append(lambda k=kernel: (vars(k).pop("route"), vars(k).pop("experts")))
        sampler = runner.sampler
        runner.sampler = timer.wrap(sampler, "sampling", HEAD)
        self._undo.append(lambda: setattr(runner, "sampler", sampler))
        drafter = runner.drafter
        if drafter is not None:  # speculative decoding: the proposer's time is its own class
            drafter.propose = timer.wrap(drafter.propose, "proposer", HEAD)
            self._undo.append(lambda: vars(drafter).pop("propose"))
        real_forward = runner.forward_steps

        def forward_steps(rows: Any, pausable: bool) -> Any:
            info = [(n, r.num_computed_tokens, r.num_computed_tokens >= r.num_prompt_tokens) for r, n in rows]
            out = yield from real_forward(rows, pausable)
            self._last_rows, self._last_samples = info, len(out.samples)
            return out

        runner.forward_steps = forward_steps
        self._undo.append(lambda: vars(runner).pop("forward_steps"))
        if self._fused is not None:
            self._fused.set_phase_timing(True)
            self._phase_names = list(self._fused.phase_names)
            self._phase_before = list(self._fused.phase_seconds)
            runner.fused_decode = _TimedFusedDecoder(self._fused, timer)
            self._undo.append(self._restore_fused)
        return self

    def _restore_fused(self) -> None:
        self.runner.fused_decode = self._fused
        self._fused.set_phase_timing(False)

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        for undo in reversed(self._undo):
            undo()
        self._handles, self._undo = [], []

    def _phase_times(self) -> dict[tuple[str, str], float]:
        if self._fused is None:
            return {}
        now = list(self._fused.phase_seconds)
        k = len(self._phase_names)
        out = {}
        for i, (a, b) in enumerate(zip(now, self._phase_before)):
            if a > b:
                out[(f"layers.{i // k}", self._phase_names[i % k])] = a - b
        self._phase_before = now
        return out

    def _cached_tokens(self) -> int:
        """Prompt tokens not computed since start: the pool's hits and the second tier's."""
        stats = self.engine.get_stats()
        return stats.prefix_cache_hits + stats.external_prefix_cache_hits

    def step(self) -> StepRecord | None:
        """One LLMEngine.step(), timed; None when it ran no model step."""
        comm0 = self.runner.communication_seconds()
        hits0 = self._cached_tokens()
        self.timer.take()
        self._last_rows = None
        t0 = time.perf_counter()
        self.engine.step()
        step_s = time.perf_counter() - t0
        spans = self.timer.take()
        phases = self._phase_times()
        comm1 = self.runner.communication_seconds()
        cached = self._cached_tokens() - hits0
        if self._last_rows is None:
            return None
        layers: dict[str, dict[str, float]] = {}
        for source in (spans, phases):
            for (layer, category), s in source.items():
                layers.setdefault(layer, {}).setdefault(category, 0.0)
                layers[layer][category] += s
        for name, s in comm1.items():
            delta = s - comm0.get(name, 0.0)
            if delta > 0:
                per = layers.setdefault(layer_of(name), {})
                per["communication"] = per.get("communication", 0.0) + delta
        categories: dict[str, float] = {}
        for per in layers.values():
            for category, s in per.items():
                if category != "host":
                    categories[category] = categories.get(category, 0.0) + s
        categories["host"] = step_s - sum(categories.values())
        rows = self._last_rows
        return StepRecord(
            step_kind(rows), step_s, [(n, c) for n, c, _ in rows], self._last_samples, layers, categories, cached
        )


def run_workload(engine: Any, requests: list[WorkloadRequest], seed: int = 0) -> list[StepRecord]:
    """Add the requests (random prompt ids, greedy, no early EOS) as their arrival steps come and
    step the engine until all finish, recording every step that ran the model."""
    vocab = engine.config.model.hf["vocab_size"]
    prompts = random_prompts([r.input_len for r in requests], vocab, seed)
    pending = sorted(zip(requests, prompts), key=lambda rp: rp[0].arrival_step)
    records: list[StepRecord] = []
    step = 0
    with Profiler(engine) as prof:
        while pending or engine.has_unfinished_requests():
            while pending and pending[0][0].arrival_step <= step:
                req, prompt = pending.pop(0)
                engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=req.output_len, ignore_eos=True))
            if not engine.has_unfinished_requests():
                step = pending[0][0].arrival_step  # idle until the next arrival: no step to run
                continue
            record = prof.step()
            step += 1
            if record is not None:
                records.append(record)
    return records
