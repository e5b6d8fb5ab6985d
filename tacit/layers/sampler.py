"""Sampler: one batched pass from logits to tokens for every request that samples this step.

Sampling is done as argmax(probs / Exponential(1) noise), which draws exactly from `probs`
and lets each seeded request draw its noise from its own generator: a seeded request gets
the same token whatever else shares the batch. Only the noise draw loops over requests, and
only over the seeded ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from tacit.outputs import RawLogprobs
from tacit.sampling_params import SamplingParams


@dataclass
class SamplingMetadata:
    """What the sampler needs of the rows that sample, one entry per row (built by the runner
    from its own request state; the sampler never sees a scheduler's Request)."""

    params: list[SamplingParams]
    output_token_ids: list[list[int]]  # tokens generated so far (penalties count these)
    # A per-request generator makes a seeded sample independent of what else is batched.
    generators: list[torch.Generator | None]
    # Constrained decoding: int32 [len(grammar_rows), ceil(vocab / 32)] packed allowed tokens
    # (bit j of word w allows token 32 * w + j) for the rows listed in grammar_rows. None: no
    # row is constrained and the sampler does nothing extra.
    grammar_bitmask: torch.Tensor | None = None
    grammar_rows: list[int] | None = None
    # The prompt's ids, for the rows with a repetition penalty (which counts prompt and output);
    # [] for the others, and None when no row has one.
    prompt_token_ids: list[list[int]] | None = None

    def __len__(self) -> int:
        return len(self.params)


@dataclass
class SamplerOutput:
    token_ids: list[int]
    # Per row: (chosen logprob, chosen rank, [(token_id, logprob), ...] top-n), or None.
    logprobs: list[RawLogprobs | None]


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """int32 [rows, words] packed bits (on the host) -> bool [rows, vocab]; ids past 32 * words
    are disallowed. numpy's unpackbits: 0.1 ms for 32 rows of a 49k vocabulary, where shifting
    in torch took 2 ms."""
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little").view(np.bool_)
    if bits.shape[1] < vocab:
        bits = np.pad(bits, ((0, 0), (0, vocab - bits.shape[1])))
    return torch.from_numpy(bits[:, :vocab])


def apply_grammar_bitmask(
    logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor, inplace: bool = False
) -> torch.Tensor:
    """logits with the tokens each listed row's grammar forbids set to -inf (a copy unless inplace)."""
    allowed = unpack_bitmask(bitmask, logits.shape[-1]).to(logits.device, non_blocking=True)
    out = logits if inplace else logits.clone()
    if len(rows) == logits.shape[0] and rows == list(range(len(rows))):
        return out.masked_fill_(~allowed, float("-inf"))  # every row constrained: no gather
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)
    out[index] = torch.where(allowed, logits[index], float("-inf"))
    return out


class Sampler:
    def __call__(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        logits = logits.float()
        params = metadata.params
        if any(p.needs_penalties for p in params):
            logits = apply_penalties(logits, metadata)
        # Logprobs report the model's distribution (vLLM's default), not the grammar's: a masked
        # top-n would be -inf entries, which JSON cannot carry.
        model_logits = logits
        if metadata.grammar_bitmask is not None:
            rows = metadata.grammar_rows
            # Masked in place unless a constrained row also wants logprobs (then they need a copy).
            keep = any(params[i].logprobs is not None for i in rows)
            logits = apply_grammar_bitmask(logits, rows, metadata.grammar_bitmask, inplace=not keep)
        greedy_ids = logits.argmax(dim=-1)
        if all(p.greedy for p in params):
            tokens = greedy_ids
        else:
            tokens = self._sample(logits, metadata, greedy_ids)
        token_list = tokens.tolist()
        logprobs: list = [None] * len(params)
        want = [i for i, p in enumerate(params) if p.logprobs is not None]
        if want:
            logprobs = self._logprobs(model_logits, tokens, params, want)
        return SamplerOutput(token_list, logprobs)

    def _sample(self, logits: torch.Tensor, metadata: SamplingMetadata, greedy_ids: torch.Tensor) -> torch.Tensor:
        params = metadata.params
        vocab = logits.shape[-1]
        temp = torch.tensor([1.0 if p.greedy else p.temperature for p in params])[:, None]
        logits = logits / temp
        top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
        top_p = [p.top_p for p in params]
        if any(k < vocab for k in top_k) or any(p < 1.0 for p in top_p):
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            keep = torch.ones_like(sorted_logits, dtype=torch.bool)
            if any(k < vocab for k in top_k):
                keep &= torch.arange(vocab)[None, :] < torch.tensor(top_k)[:, None]
            if any(p < 1.0 for p in top_p):
                probs = sorted_logits.masked_fill(~keep, float("-inf")).softmax(dim=-1)
                before = probs.cumsum(dim=-1) - probs  # mass strictly above this token
                keep &= before < torch.tensor(top_p)[:, None]
            keep[:, 0] = True
            mask = torch.zeros_like(keep).scatter_(1, order, keep)
            logits = logits.masked_fill(~mask, float("-inf"))
        probs = logits.softmax(dim=-1)
        min_p = torch.tensor([p.min_p for p in params])
        if bool((min_p > 0).any()):
            threshold = probs.max(dim=-1, keepdim=True).values * min_p[:, None]
            probs = probs.masked_fill(probs < threshold, 0.0)
        noise = torch.empty_like(probs)
        generators = metadata.generators
        unseeded = [i for i, g in enumerate(generators) if g is None]
        if unseeded:
            noise[unseeded] = torch.empty(len(unseeded), vocab).exponential_()
        for i, g in enumerate(generators):
            if g is not None:
                noise[i] = torch.empty(vocab).exponential_(generator=g)
        sampled = (probs / noise).argmax(dim=-1)
        is_greedy = torch.tensor([p.greedy for p in params])
        return torch.where(is_greedy, greedy_ids, sampled)

    def _logprobs(
        self, logits: torch.Tensor, tokens: torch.Tensor, params: list[SamplingParams], rows: list[int]
    ) -> list:
        # Logprobs of the model's distribution (after penalties, before temperature/top-k/top-p),
        # as vLLM reports them by default.
        n_max = max(params[i].logprobs for i in rows)
        picked = gather_logprobs(logits[rows].log_softmax(dim=-1), tokens[rows], n_max)
        out: list = [None] * len(params)
        for j, i in enumerate(rows):
            out[i] = picked[j][0], picked[j][1], picked[j][2][: params[i].logprobs]
        return out


def apply_penalties(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    """logits with each row's repetition, presence and frequency penalties applied (vLLM's
    apply_penalties); rows whose penalties are off come back unchanged."""
    params = metadata.params
    # vLLM's order: the repetition penalty first, then the additive ones.
    rep = [p.repetition_penalty for p in params]
    if any(r != 1.0 for r in rep):
        prompts = metadata.prompt_token_ids or [[] for _ in params]
        seen = [prompt + out if r != 1.0 else [] for r, prompt, out in zip(rep, prompts, metadata.output_token_ids)]
        logits = apply_repetition_penalty(logits, seen, rep)
    if any(p.needs_additive_penalties for p in params):
        # OpenAI semantics: subtract frequency * count and presence * [count > 0] over generated tokens.
        counts = torch.zeros_like(logits)
        for row, output_ids in enumerate(metadata.output_token_ids):
            if output_ids and params[row].needs_additive_penalties:
                ids = torch.tensor(output_ids, dtype=torch.long)
                counts[row].index_add_(0, ids, torch.ones(len(ids)))
        freq = torch.tensor([p.frequency_penalty for p in params])[:, None]
        pres = torch.tensor([p.presence_penalty for p in params])[:, None]
        logits = logits - freq * counts - pres * (counts > 0).float()
    return logits


def apply_repetition_penalty(logits: torch.Tensor, token_ids: list[list[int]], penalties: list[float]) -> torch.Tensor:
    """vLLM's (and transformers') repetition penalty: each row's listed tokens' logits divided by
    its penalty where positive, multiplied where not, so a penalty > 1 never makes one more likely.
    Only the listed entries are read and written (gathered, as transformers does): 32 rows of
    2,300 tokens over a 49k vocabulary are 74k entries, not the 1.6M a full-width mask would touch.
    Divided, not multiplied by 1 / penalty, so float32 logits equal transformers' bit for bit."""
    lengths = [len(ids) for ids in token_ids]
    if not sum(lengths):
        return logits
    # Flat indices into the row-major logits; numpy reads the lists 4x faster than torch.tensor.
    flat = np.fromiter(chain.from_iterable(token_ids), dtype=np.int64, count=sum(lengths))
    flat += np.repeat(np.arange(len(token_ids), dtype=np.int64) * logits.shape[-1], lengths)
    index = torch.from_numpy(flat).to(logits.device)
    penalty = torch.from_numpy(np.repeat(np.asarray(penalties, dtype=np.float32), lengths)).to(logits)
    out = logits.contiguous().clone()
    picked = out.view(-1).take(index)
    # A token listed twice is written twice with the same value (both computed from `picked`).
    out.view(-1).index_copy_(0, index, torch.where(picked > 0, picked / penalty, picked * penalty))
    return out


def gather_logprobs(logprobs: torch.Tensor, token_ids: torch.Tensor, num_top: int) -> list[RawLogprobs]:
    """Per row of log-softmaxed logits: (token_ids[row]'s logprob, its rank (1 = the most
    likely; ties rank it first), [(token_id, logprob), ...] of the num_top most likely).
    The sampler and the prompt logprobs share it, so both rank alike."""
    chosen_lp = logprobs.gather(1, token_ids[:, None])[:, 0]
    ranks = (logprobs > chosen_lp[:, None]).sum(dim=-1) + 1
    if num_top:
        top_vals, top_ids = logprobs.topk(num_top, dim=-1)
        tops = [list(zip(i, v)) for i, v in zip(top_ids.tolist(), top_vals.tolist())]
    else:
        tops = [[] for _ in range(len(token_ids))]
    return list(zip(chosen_lp.tolist(), ranks.tolist(), tops))
