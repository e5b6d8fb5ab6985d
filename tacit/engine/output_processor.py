"""OutputProcessor: the scheduler's per-step token news in, RequestOutputs out.

It owns everything about a request's output that the scheduler does not need: incremental
detokenization, stop strings (found in text, so only here), logprobs (sampled and prompt)
turned into Logprob entries with their decoded text, and the grouping of an n>1 request's
sequences under their parent id. A stop string ends a sequence here; the engine then tells the scheduler to free it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tacit.engine.detokenizer import IncrementalDetokenizer
from tacit.outputs import CompletionOutput, Logprob, RawLogprobs, RequestOutput
from tacit.sampling_params import SamplingParams
from tacit.scheduling.request import Request
from tacit.scheduling.scheduler_output import EngineCoreOutput
from tacit.tokenizer import Tokenizer


@dataclass
class SequenceState:
    index: int
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    embedding: list[float] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def visible_text(self) -> str:
        """Text safe to show now: while a stop string could still be completing, hold back its prefix."""
        if self.finished or not self.params.stop:
            return self.text
        hold = max(len(s) for s in self.params.stop) - 1
        return self.text[: len(self.text) - hold] if hold else self.text


@dataclass
class ParentState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    arrival_time: float
    sequences: dict[str, SequenceState]
    requests: list[Request]  # the scheduler's, read for first_scheduled_time
    first_token_time: float | None = None
    # With prompt_logprobs: an entry per prompt token scored so far (None for the first).
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    num_cached_tokens: int = 0


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._parents: dict[str, ParentState] = {}
        self._parent_of: dict[str, str] = {}  # sequence id -> parent id

    def has_request(self, request_id: str) -> bool:
        return request_id in self._parents

    def add_request(
        self, request_id: str, prompt: str | None, prompt_token_ids: list[int], children: list[Request]
    ) -> None:
        sequences = {}
        for req in children:
            p = req.params
            seq = SequenceState(
                req.index, p, IncrementalDetokenizer(self.tokenizer, prompt_token_ids, p.skip_special_tokens)
            )
            if p.logprobs is not None:
                seq.logprobs, seq.cumulative_logprob = [], 0.0
            sequences[req.request_id] = seq
            self._parent_of[req.request_id] = request_id
        self._parents[request_id] = ParentState(
            request_id,
            prompt,
            list(prompt_token_ids),
            children[0].arrival_time,
            sequences,
            list(children),
            prompt_logprobs=None if children[0].params.prompt_logprobs is None else [None],
        )

    def abort_request(self, request_id: str) -> list[str]:
        """Forget a parent request; returns its sequence ids (for the scheduler to free)."""
        parent = self._parents.pop(request_id, None)
        if parent is None:
            return []
        for seq_id in parent.sequences:
            self._parent_of.pop(seq_id, None)
        return list(parent.sequences)

    def process_outputs(self, outputs: list[EngineCoreOutput]) -> tuple[list[RequestOutput], list[tuple[str, str]]]:
        """(a RequestOutput per parent that changed, [(sequence id, stop string)] for the
        sequences a stop string ended, which the scheduler must now finish)."""
        now = time.monotonic()
        touched: dict[str, None] = {}
        stopped: list[tuple[str, str]] = []
        for out in outputs:
            parent_id = self._parent_of.get(out.req_id)
            if parent_id is None:
                continue  # aborted
            parent = self._parents[parent_id]
            if out.prompt_logprobs is not None:
                scored = out.prompt_logprobs
                parent.prompt_logprobs += map(self._logprob_entry, scored.token_ids, scored.entries)
            parent.num_cached_tokens = max(parent.num_cached_tokens, out.num_cached_tokens)
            if parent.first_token_time is None and out.new_token_ids:
                parent.first_token_time = now
            stop = self._append(parent.sequences[out.req_id], out)
            if stop is not None:
                stopped.append((out.req_id, stop))
            touched[parent_id] = None
        results = []
        for parent_id in touched:
            result = self._request_output(self._parents[parent_id])
            results.append(result)
            if result.finished:
                self.abort_request(parent_id)
        return results, stopped

    def _logprob_entry(self, token: int, raw: RawLogprobs) -> dict[int, Logprob]:
        """{token_id: Logprob} for one position: the top-n, then the token itself if not among them."""
        chosen_lp, rank, top = raw
        entry = {tid: Logprob(lp, r + 1, self.tokenizer.decode([tid], False)) for r, (tid, lp) in enumerate(top)}
        entry.setdefault(token, Logprob(chosen_lp, rank, self.tokenizer.decode([token], False)))
        return entry

    def _append(self, seq: SequenceState, out: EngineCoreOutput) -> str | None:
        """Take one step's news (its tokens, or none); returns the stop string if one ended the
        sequence. Several tokens (accepted drafts) go in one at a time, each checked as if it came
        alone, so a stop string ends the sequence at the token that completed it."""
        if not out.new_token_ids:  # a prompt chunk scored, or a prompt only scored (max_tokens=0) done
            if out.pooled is not None:
                seq.embedding = out.pooled
            if out.finish_reason is not None:
                seq.finish_reason, seq.stop_reason = out.finish_reason, out.stop_reason
            return None
        for k, token in enumerate(out.new_token_ids):
            stop = self._append_token(seq, token, None if out.logprobs is None else out.logprobs[k])
            if stop is not None:
                return stop
        if out.finish_reason is not None:
            seq.text += seq.detokenizer.flush()
            seq.finish_reason, seq.stop_reason = out.finish_reason, out.stop_reason
        return None

    def _append_token(self, seq: SequenceState, token: int, logprobs: RawLogprobs | None) -> str | None:
        seq.token_ids.append(token)
        p = seq.params
        if logprobs is not None:
            seq.logprobs.append(self._logprob_entry(token, logprobs))
            seq.cumulative_logprob += logprobs[0]
        delta = seq.detokenizer.step(token)
        seq.text += delta
        if p.stop and delta:
            longest = max(len(s) for s in p.stop)
            window_start = max(0, len(seq.text) - len(delta) - longest + 1)
            for s in p.stop:
                at = seq.text.find(s, window_start)
                if at != -1 and len(seq.token_ids) >= p.min_tokens:
                    seq.text = seq.text[:at]
                    seq.finish_reason, seq.stop_reason = "stop", s
                    return s
        return None

    @staticmethod
    def _request_output(parent: ParentState) -> RequestOutput:
        completions = [
            CompletionOutput(
                index=s.index,
                text=s.visible_text(),
                token_ids=list(s.token_ids),
                cumulative_logprob=s.cumulative_logprob,
                logprobs=s.logprobs,
                finish_reason=s.finish_reason,
                stop_reason=s.stop_reason,
            )
            for s in parent.sequences.values()
        ]
        metrics = {"arrival_time": parent.arrival_time}
        if parent.first_token_time is not None:
            metrics["first_token_time"] = parent.first_token_time
        scheduled = [r.first_scheduled_time for r in parent.requests if r.first_scheduled_time is not None]
        if scheduled:  # vLLM's name; for n > 1 the first of its sequences to run
            metrics["first_scheduled_time"] = min(scheduled)
        return RequestOutput(
            parent.request_id,
            parent.prompt,
            list(parent.prompt_token_ids),
            completions,
            finished=all(s.finished for s in parent.sequences.values()),
            metrics=metrics,
            prompt_logprobs=None if parent.prompt_logprobs is None else list(parent.prompt_logprobs),
            num_cached_tokens=parent.num_cached_tokens,
            embedding=next(iter(parent.sequences.values())).embedding,
        )
