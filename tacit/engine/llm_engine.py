"""LLMEngine: add requests, step, collect outputs. The step loop of the data path:

    Scheduler.schedule() -> ModelRunner.execute() -> Sampler -> update (append, stop, free)
"""

from __future__ import annotations

import itertools
import time
from dataclasses import replace
from typing import Any, Callable

import torch

from tacit.engine.arg_utils import EngineArgs
from tacit.engine.detokenizer import IncrementalDetokenizer
from tacit.engine.model_runner import ModelRunner, kv_cache_layers
from tacit.forward_context import set_layer_hook
from tacit.loader import ModelSource, open_model
from tacit.memory.kv_cache_manager import KVCacheManager
from tacit.memory.swap import KVSwapper
from tacit.models.build import build_model
from tacit.outputs import CompletionOutput, Logprob, RequestOutput
from tacit.platforms import get_platform
from tacit.sampling_params import SamplingParams
from tacit.scheduling.length_predictor import OutputLengthPredictor
from tacit.scheduling.policy import get_policy
from tacit.scheduling.request import Request
from tacit.scheduling.scheduler import Scheduler, SchedulerOutput
from tacit.tokenizer import Tokenizer


class LLMEngine:
    def __init__(self, model: str | None = None, *, engine_args: EngineArgs | None = None, **kwargs: Any) -> None:
        """model and kwargs: EngineArgs' fields (LLMEngine(path, dtype="float32", ...)); or engine_args, built."""
        if engine_args is None:
            engine_args = EngineArgs.from_kwargs(model=model, **kwargs)
        elif model is not None or kwargs:
            raise ValueError("pass LLMEngine either engine_args or keyword arguments, not both")
        self.engine_args = engine_args
        platform = get_platform(engine_args.device)
        self.platform = platform
        source: ModelSource = open_model(engine_args.model)
        self.source = source
        self.config = engine_args.create_engine_config(source, platform)
        # The names the rest of __init__ reads, from the resolved configs.
        model_cfg, seed = self.config.model, self.config.seed
        block_size, swap_space = self.config.cache.block_size, self.config.cache.swap_space
        scheduling_policy = self.config.scheduler.policy
        torch.manual_seed(seed)
        self.tokenizer: Tokenizer = source.tokenizer
        self.device = platform.device()
        self.model = build_model(model_cfg, source.weights(), self.device)
        self.runner = ModelRunner(self.config, self.model, self.device, platform.free_memory_bytes())
        self.kv = KVCacheManager(self.runner.num_blocks, block_size)
        self.scheduler = Scheduler(self.config.scheduler, self.kv, get_policy(scheduling_policy))
        if swap_space > 0:
            self.scheduler.swapper = KVSwapper(kv_cache_layers(self.model), self.runner.num_blocks, block_size,
                                               self.runner.bytes_per_block, int(swap_space * (1 << 30)))
        self.predictor = OutputLengthPredictor()
        self.max_model_len = model_cfg.max_model_len
        self.eos_token_ids = frozenset(model_cfg.eos_token_ids)
        self._children: dict[str, list[Request]] = {}
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self._ids = itertools.count()
        self.num_steps = 0
        self.stats = {"prompt_tokens": 0, "generation_tokens": 0}
        # Called between the layers of a step in flight; the online engine sets it to take new
        # requests in and run cut_in_step() (AsyncLLMEngine._between_layers). None offline.
        self.between_layers: Callable[[], None] | None = None
        self.num_cut_ins = 0
        self._cut_in_s = 0.0

    # ---- requests -------------------------------------------------------------------------

    def tokenize_prompt(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            vocab = self.config.model.hf["vocab_size"]
            bad = [t for t in prompt if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"prompt token ids {bad[:5]} are out of range; valid ids are 0..{vocab - 1}")
            return None, list(prompt)
        raise ValueError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, priority: int = 0) -> str:
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(params).__name__}")
        text, ids = self.tokenize_prompt(prompt)
        if not ids:
            raise ValueError("prompt is empty: it must hold at least one token")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt is {len(ids)} tokens, but max_model_len is {self.max_model_len}: "
                             f"it must be shorter, leaving room for at least one generated token")
        room = self.max_model_len - len(ids)
        max_tokens = min(params.max_tokens or room, room)
        need = len(ids) + max_tokens
        if need > self.kv.capacity_tokens:
            raise ValueError(f"prompt ({len(ids)} tokens) plus max_tokens ({max_tokens}) needs {need} KV slots, "
                             f"more than the whole KV pool holds ({self.kv.capacity_tokens}); "
                             f"lower max_tokens or raise num_kv_blocks / kv_cache_memory")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority={priority!r} is invalid: must be an integer (lower runs first)")
        parent = request_id if request_id is not None else f"req-{next(self._ids)}"
        if parent in self._children:
            raise ValueError(f"request_id {parent!r} is already in use")
        children = []
        ttft, tpot = self._slo_targets(params, priority)
        predicted = self.predictor.predict(len(ids), max_tokens, params.temperature, params.expected_output_tokens)
        try:
            for i in range(params.n):
                child_params = params if params.n == 1 or params.seed is None else replace(params, seed=params.seed + i)
                child_id = parent if params.n == 1 else f"{parent}#{i}"
                req = Request(child_id, ids, child_params, max_tokens, prompt=text, priority=priority,
                              parent_id=parent, index=i)
                req.ttft_slo, req.tpot_slo, req.predicted_output_tokens = ttft, tpot, predicted
                self.scheduler.add_request(req)  # the policy may refuse it (sla admission)
                self._detok[child_id] = IncrementalDetokenizer(self.tokenizer, ids, params.skip_special_tokens)
                children.append(req)
        except ValueError:
            for req in children:  # all of an n>1 request or none of it
                self.scheduler.finish(req)
                self._detok.pop(req.request_id, None)
            raise
        self._children[parent] = children
        self.stats["prompt_tokens"] += len(ids)
        return parent

    def _slo_targets(self, params: SamplingParams, priority: int) -> tuple[float | None, float | None]:
        """(TTFT, TPOT) targets in seconds: the request's own, else its priority class's."""
        cls = self.config.scheduler.slo_classes.get(priority, {})
        ttft = params.ttft_slo_ms if params.ttft_slo_ms is not None else cls.get("ttft_ms")
        tpot = params.tpot_slo_ms if params.tpot_slo_ms is not None else cls.get("tpot_ms")
        return (None if ttft is None else ttft / 1000, None if tpot is None else tpot / 1000)

    def abort_request(self, request_id: str) -> None:
        for req in self._children.pop(request_id, []):
            if not req.is_finished:
                req.finish("abort")
            self.scheduler.finish(req)
            self._detok.pop(req.request_id, None)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # ---- the step -------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        sched: SchedulerOutput = self.scheduler.schedule()
        if not sched.scheduled:
            return []
        cut_in_before = self._cut_in_s
        with set_layer_hook(self.between_layers):
            t0 = time.perf_counter()
            sampled_reqs, sampler_out = self.runner.execute(sched, self.kv)
            # Cut-ins ran inside this step's forward; the cost model learns each step on its own.
            elapsed = time.perf_counter() - t0 - (self._cut_in_s - cut_in_before)
        return self._finish_step(sched, sampled_reqs, sampler_out, elapsed)

    def cut_in_step(self) -> list[RequestOutput]:
        """Prefill the requests Scheduler.schedule_cut_in() picks, now: called between two
        layers of the step in flight (through between_layers), never on its own."""
        sched = self.scheduler.schedule_cut_in()
        if not sched.scheduled:
            return []
        t0 = time.perf_counter()
        sampled_reqs, sampler_out = self.runner.execute(sched, self.kv)
        elapsed = time.perf_counter() - t0
        self._cut_in_s += elapsed
        self.num_cut_ins += len(sched.scheduled)
        return self._finish_step(sched, sampled_reqs, sampler_out, elapsed)

    def _finish_step(self, sched: SchedulerOutput, sampled_reqs: list[Request], sampler_out,
                     elapsed: float) -> list[RequestOutput]:
        self.num_steps += 1
        prefill_tokens = decodes = 0
        for req, n in sched.scheduled:
            req.num_computed_tokens += n
            if n == 1:
                decodes += 1
            else:
                prefill_tokens += n
        self.scheduler.cost.observe(prefill_tokens, decodes, elapsed)
        now = time.monotonic()
        touched: dict[str, None] = {}
        for row, req in enumerate(sampled_reqs):
            self._append(req, sampler_out.token_ids[row], sampler_out.logprobs[row], now)
            touched[req.parent_id] = None
            if req.is_finished:
                self.scheduler.finish(req)
                self._learn_length(req)
        outputs = []
        for parent in touched:
            out = self._output(parent)
            outputs.append(out)
            if out.finished:
                for req in self._children.pop(parent):
                    self._detok.pop(req.request_id, None)
        return outputs

    def _learn_length(self, req: Request) -> None:
        p = req.params
        self.predictor.observe(req.num_prompt_tokens, req.max_tokens, p.temperature, p.expected_output_tokens,
                               req.predicted_output_tokens, len(req.output_token_ids))

    def _append(self, req: Request, token: int, logprob, now: float) -> None:
        req.append_output_token(token)
        self.stats["generation_tokens"] += 1
        if req.first_token_time is None:
            req.first_token_time = now
        req.last_token_time = now
        p = req.params
        if logprob is not None:
            chosen_lp, rank, top = logprob
            entry = {tid: Logprob(lp, r + 1, self.tokenizer.decode([tid], False)) for r, (tid, lp) in enumerate(top)}
            entry.setdefault(token, Logprob(chosen_lp, rank, self.tokenizer.decode([token], False)))
            req.logprobs.append(entry)
            req.cumulative_logprob += chosen_lp
        detok = self._detok[req.request_id]
        delta = detok.step(token)
        req.output_text += delta
        if p.stop and delta:
            longest = max(len(s) for s in p.stop)
            window_start = max(0, len(req.output_text) - len(delta) - longest + 1)
            for s in p.stop:
                at = req.output_text.find(s, window_start)
                if at != -1 and len(req.output_token_ids) >= p.min_tokens:
                    req.output_text = req.output_text[:at]
                    req.finish("stop", s)
                    return
        reason, stop_reason = self._finish_reason(req, token)
        if reason is not None:
            req.output_text += detok.flush()
            req.finish(reason, stop_reason)

    def _finish_reason(self, req: Request, token: int) -> tuple[str | None, int | None]:
        p = req.params
        n_out = len(req.output_token_ids)
        if n_out >= p.min_tokens and ((not p.ignore_eos and token in self.eos_token_ids) or token in p.stop_token_ids):
            return "stop", token
        if n_out >= req.max_tokens:
            return "length", None
        return None, None

    def _output(self, parent: str) -> RequestOutput:
        children = self._children[parent]
        first = children[0]
        completions = [CompletionOutput(index=r.index, text=visible_text(r), token_ids=list(r.output_token_ids),
                                        cumulative_logprob=r.cumulative_logprob, logprobs=r.logprobs,
                                        finish_reason=r.finish_reason, stop_reason=r.stop_reason)
                       for r in children]
        metrics = {"arrival_time": first.arrival_time}
        if first.first_token_time is not None:
            metrics["first_token_time"] = first.first_token_time
        return RequestOutput(parent, first.prompt, list(first.prompt_token_ids), completions,
                             finished=all(r.is_finished for r in children), metrics=metrics)


def visible_text(req: Request) -> str:
    """Text safe to show now: while a stop string could still be completing, hold back its prefix."""
    if req.is_finished or not req.params.stop:
        return req.output_text
    hold = max(len(s) for s in req.params.stop) - 1
    return req.output_text[:len(req.output_text) - hold] if hold else req.output_text
