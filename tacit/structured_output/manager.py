"""StructuredOutputManager: one llguidance matcher per constrained request, owned by the Scheduler
(as vLLM v1's is), and the step's packed token bitmask for the constrained rows that sample.

The bitmask is int32 [rows, ceil(vocab / 32)], bit j of word w allowing token 32 * w + j
(llguidance's layout); the sampler unpacks it. The vocabulary here is the logits' width, which
may exceed the tokenizer's (padding rows): llguidance never allows ids it has no token for.

Preemption needs no rollback: tacit keeps a preempted request's generated tokens (recompute
replays prompt + output, swap restores the KV), so a matcher has always consumed exactly
req.output_token_ids, and resumes where it was.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import llguidance
import numpy as np
from llguidance.numpy import fill_next_token_bitmask, fill_next_token_bitmask_par

from tacit.sampling_params import StructuredOutputsParams
from tacit.structured_output.grammar import GrammarCompiler
from tacit.tokenizer import Tokenizer


class StructuredOutputManager:
    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: Sequence[int] = ()) -> None:
        """vocab_size: the logits' width. eos_token_ids: what the grammar lets end the output
        once it is complete (the model's EOS ids; the tokenizer's if the model names none)."""
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        eos = list(eos_token_ids) or ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])
        self.eos_token_ids = eos
        self._compiler: GrammarCompiler | None = None
        self._executor: llguidance.LLExecutor | None = None
        self.matchers: dict[str, llguidance.LLMatcher] = {}
        self._words = (vocab_size + 31) // 32

    @property
    def compiler(self) -> GrammarCompiler:
        # Built on the first constrained request: wrapping a 49k-token vocabulary takes ~0.5 s,
        # which an engine that never sees a grammar should not pay at start-up.
        if self._compiler is None:
            ll_tok = llguidance.LLTokenizer(
                self.tokenizer.tokenizer.to_str(), n_vocab=self.vocab_size, eos_token=self.eos_token_ids or None
            )
            self._compiler = GrammarCompiler(ll_tok)
        return self._compiler

    def validate(self, spec: StructuredOutputsParams) -> None:
        """Compile spec (cached); raises StructuredOutputError (a ValueError) if it is invalid."""
        self.compiler.compile(spec)

    def add_request(self, req_id: str, spec: StructuredOutputsParams) -> None:
        self.matchers[req_id] = self.compiler.matcher(spec)

    def remove_request(self, req_id: str) -> None:
        self.matchers.pop(req_id, None)

    def __contains__(self, req_id: str) -> bool:
        return req_id in self.matchers

    def __bool__(self) -> bool:
        return bool(self.matchers)

    def valid_draft_prefix(self, req_id: str, drafts: list[int]) -> int:
        """How many of drafts, in order, req_id's grammar accepts from where it is (its matcher
        unchanged): the drafts past them would be refused by the mask, so none is verified."""
        m = self.matchers.get(req_id)
        return len(drafts) if m is None else m.validate_tokens(drafts)

    def grammar_bitmask(self, req_ids: list[str], drafts: Mapping[str, list[int]] | None = None) -> np.ndarray:
        """The allowed-token bitmask of each request in req_ids (all constrained), in order: one
        row for a request, or 1 + m rows for one verifying m drafts (row j: the mask after
        drafts[:j], the matcher advanced over them and rolled back after, so a verify row is
        masked as that position would be one token a step). int32 [rows, ceil(vocab_size / 32)]."""
        drafts = drafts or {}
        if any(drafts.get(r) for r in req_ids):
            bitmask = np.empty((sum(1 + len(drafts.get(r, ())) for r in req_ids), self._words), dtype=np.int32)
            row = 0
            for r in req_ids:
                m, ds = self.matchers[r], drafts.get(r, [])
                for j in range(len(ds) + 1):
                    fill_next_token_bitmask(m, bitmask, row)
                    row += 1
                    if j < len(ds) and not m.consume_token(ds[j]):
                        raise RuntimeError(f"request {r}: draft {j} was verified but its grammar refuses it")
                if ds:
                    m.rollback(len(ds))
            return bitmask
        bitmask = np.empty((len(req_ids), self._words), dtype=np.int32)
        if len(req_ids) == 1:
            fill_next_token_bitmask(self.matchers[req_ids[0]], bitmask, 0)
        else:
            # Several masks at once on llguidance's own threads, outside the GIL.
            if self._executor is None:
                self._executor = llguidance.LLExecutor()
            fill_next_token_bitmask_par(self._executor, [(self.matchers[r], i) for i, r in enumerate(req_ids)], bitmask)
        return bitmask

    def accept_token(self, req_id: str, token_id: int) -> bool:
        """Advance req_id's matcher by its sampled token; True when its grammar has ended (it
        accepts no further token but EOS) or the token was refused, so the request must stop."""
        m = self.matchers.get(req_id)
        if m is None:
            return False
        ok = m.consume_token(token_id)
        return not ok or m.is_stopped()
