"""MTP drafts, vLLM's "mtp" method: DeepSeek-V3/R1's own multi-token-prediction layer
(models/deepseek_mtp.py) proposes, from the target's final hidden states, the tokens after the
one just sampled.

Its KV entries live in the target's pool, in the target's blocks, so the prefix cache, swap and
the second tier keep them with the target's (as vLLM keeps EAGLE's and MTP's): entry p pairs
the target's hidden state of position p with token p + 1 and sits at slot p, rotated for
position p (vLLM's layout; attention depends on positions only through their differences, so
this is transformers' MtpModel, which rotates it for p + 1, shifted by one). Entry p predicts
token p + 2.

After each step the runner hands over every token's final hidden states (observe); once the
step settled, the request has L tokens and its entries up to L - 2 can be computed: those not yet
are run as one row (a prompt's whole, at first), whose last entry proposes draft 1; each further
draft is one more row, the layer's own output standing in for the target's hidden state, at
slots past the request's tokens (the scheduler holds num_lookahead_tokens slots for them, and
the next step's entries overwrite them). A prefix hit gives back its last block, so the entry
before the first computed token is recomputed from a hidden state the step has.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from tacit.config import ModelConfig
from tacit.config.speculative import SpeculativeConfig
from tacit.forward_context import set_forward_context
from tacit.loader import ModelSource
from tacit.models.build import build_model
from tacit.models.deepseek_mtp import DeepseekV3MTP
from tacit.sampling_params import SamplingParams
from tacit.worker.drafter import DraftProposer, DraftTarget, register_draft_proposer
from tacit.worker.input_batch import Rows, build_inputs
from tacit.worker.request_state import CachedRequestState

_GREEDY = SamplingParams(temperature=0.0)


@dataclass
class _Entries:
    """One request's MTP entries: those below `done` are in its blocks; `hidden` holds the target's
    final hidden states of positions hidden_start on, kept until their entries are computed."""

    done: int = 0
    hidden_start: int = 0
    hidden: torch.Tensor | None = field(default=None, repr=False)

    def keep(self, start: int, block: torch.Tensor) -> None:
        """The hidden states of positions start.. from a step; a step that recomputes from
        `start` (a preemption, a rejected draft's position) replaces what followed it."""
        self.done = min(self.done, start)
        held = self.hidden
        if held is None or start < self.hidden_start or start > self.hidden_start + len(held):
            self.hidden_start, self.hidden = start, block
        else:
            self.hidden = torch.cat([held[: start - self.hidden_start], block])

    def slice(self, begin: int, end: int) -> torch.Tensor | None:
        """Hidden states of positions [begin, end), or None if not all are held."""
        held = self.hidden
        if held is None or begin < self.hidden_start or end > self.hidden_start + len(held):
            return None
        return held[begin - self.hidden_start : end - self.hidden_start]

    def advance(self, done: int) -> None:
        self.done = done
        if self.hidden is not None:
            drop = max(0, done - self.hidden_start)
            self.hidden, self.hidden_start = self.hidden[drop:], self.hidden_start + drop


def mtp_weights(source: ModelSource, cfg: ModelConfig):
    """The checkpoint's tensors of the MTP layers only (a plain safetensors checkpoint reads no
    other; a quantized one's loader yields all and the rest are dropped here)."""
    prefixes = DeepseekV3MTP.weight_prefixes(cfg)
    if "skip" in inspect.signature(source.weights).parameters:
        return lambda **kw: source.weights(skip=lambda name: not name.startswith(prefixes), **kw)
    return lambda **kw: ((n, t) for n, t in source.weights(**kw) if n.startswith(prefixes))


@register_draft_proposer("mtp")
class MTPProposer(DraftProposer):
    def __init__(self, config: SpeculativeConfig, target_model: nn.Module, mtp: DeepseekV3MTP, ctx) -> None:
        """target_model: the target (its embedding, rotary tables and head serve the MTP layer);
        ctx: the target runner's PathContext (block size, attention backend, device)."""
        self.k = config.num_speculative_tokens
        self.target = target_model
        self.layers = mtp.mtp_layers
        self.ctx = ctx
        self.entries: dict[str, _Entries] = {}

    @classmethod
    def pool_layers(
        cls, config: SpeculativeConfig, target: ModelConfig, source: ModelSource, device: torch.device, free_memory: int
    ) -> DeepseekV3MTP:
        weights = mtp_weights(source, target)
        try:
            return build_model(
                target, weights, device, free_memory, source.quantized_weights, model_class=DeepseekV3MTP
            )
        except ValueError as e:
            if "is missing" not in str(e):
                raise
            raise ValueError(
                f"speculative_config method='mtp': {target.path} says num_nextn_predict_layers="
                f"{target.hf.get('num_nextn_predict_layers')} but holds no whole MTP layer under "
                f"{DeepseekV3MTP.weight_prefixes(target)[0]} ({e})"
            ) from None

    @classmethod
    def create(cls, config: SpeculativeConfig, target: DraftTarget | None) -> MTPProposer:
        model = target.runner.model if target is not None else None
        mtp = getattr(model, "draft_layers", None)
        if not isinstance(mtp, DeepseekV3MTP):
            raise ValueError('speculative_config method="mtp" runs the MTP layers built into the target (pool_layers)')
        return cls(config, model, mtp, target.runner.paths_context)

    # -- the runner's calls --------------------------------------------------------------

    def observe(self, rows: Rows, row_hidden: torch.Tensor) -> None:
        start = 0
        for r, n in rows:
            e = self.entries.get(r.req_id)
            if e is None:
                e = self.entries[r.req_id] = _Entries(done=r.num_computed_tokens)
            e.keep(r.num_computed_tokens, row_hidden[start : start + n])
            start += n

    def propose(self, requests: list[CachedRequestState]) -> dict[str, list[int]]:
        return self._draft(requests, self.k)

    def advance(self, requests: list[CachedRequestState]) -> None:
        self._draft(requests, 0)

    def request_finished(self, state: CachedRequestState) -> None:
        self.entries.pop(state.req_id, None)

    # -- the MTP layer's forwards ---------------------------------------------------------

    def _draft(self, requests: list[CachedRequestState], k: int) -> dict[str, list[int]]:
        """Compute every entry the requests' settled tokens allow; with k > 0, chain k drafts."""
        rows, hidden, live = [], [], []
        for r in requests:
            e = self.entries.get(r.req_id)
            last = r.num_tokens - 2  # the last entry: the target's hidden state of token L - 2
            if e is None or last < e.done:
                continue
            h = e.slice(e.done, last + 1)
            if h is None:  # hidden states this proposer never saw: nothing to draft from
                continue
            # Entry p reads token p + 1: the request's tokens shifted by one, in its blocks.
            shifted = CachedRequestState(r.req_id, r.token_ids[1:], 0, _GREEDY, r.block_ids, e.done)
            rows.append((shifted, last + 1 - e.done))
            hidden.append(h)
            live.append((r, e, shifted, last))
        if not rows:
            return {}
        t = time.perf_counter()
        out, logits = self._forward(rows, torch.cat(hidden))
        if any(n > self.k + 1 for _, n in rows):  # a prompt's entries, not a step's
            self.catch_up_s += time.perf_counter() - t
        for r, e, _, last in live:
            e.advance(last + 1)
        if not k:
            return {}
        drafts = {r.req_id: [] for r, *_ in live}
        tokens = self._argmax(logits)
        for j in range(k):
            for (r, _, shifted, _), token in zip(live, tokens):
                drafts[r.req_id].append(token)
                shifted.token_ids.append(token)
            if j == k - 1:
                break
            for shifted, n in rows:
                shifted.num_computed_tokens += n
            rows = [(shifted, 1) for shifted, _ in rows]
            out, logits = self._forward(rows, out)
            tokens = self._argmax(logits)
        return drafts

    def _argmax(self, logits: torch.Tensor) -> list[int]:
        return logits.argmax(dim=-1).tolist()

    def _forward(self, rows: Rows, previous: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The MTP layer over rows (their entries' tokens and the hidden states before them):
        (each row's last output, its logits)."""
        ctx = self.ctx
        built = build_inputs(rows, ctx.block_size, ctx.attn_backend, ctx.device)
        model = self.target.model
        embeds = model.embed_tokens(built.input_ids)
        cos, sin = model.rotary.cos_sin(built.positions, embeds.dtype)
        with set_forward_context(built.meta):
            h = self.layers[0].predict(embeds, previous, model.rotary, cos, sin)
        last = h[built.sample_rows]
        return last, self.target.compute_logits(last)
