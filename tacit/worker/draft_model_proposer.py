"""Draft-model drafts, vLLM's "draft_model" method: a smaller checkpoint with the target's
tokenizer runs in the process that samples, with a KV cache of its own, and proposes its greedy
continuation of each request, k tokens a step.

The draft runs on a ModelRunner of its own (so it takes the same execution paths as any model:
its one-token rows on the fused C++ decoder where the CPU has it), fed with request states this
proposer owns: each holds the tokens whose KV the draft has computed. Before drafting, a state
is brought level with its request: the KV of tokens the target rejected is dropped by rewinding
to the longest prefix both agree on (rejected drafts are the draft's own tokens past that
prefix), then the tokens the draft has not seen (the prompt, at first; afterwards the last
accepted draft and the token the target sampled) run as one prefill row, chunked to the
target's step budget. Then k - 1 one-token steps: each draft is the argmax of the row before.

Greedy drafts are a point mass, as n-gram drafts are: the verifier accepts each with the
target's probability of it, so sampled output keeps the target's distribution (at temperature
0 every draft the target's argmax agrees with is kept).

The draft's pool holds as many tokens as the target's plus k a request: a request the draft
cannot fit evicts the states least recently drafted for (they prefill again if they return),
and one that still does not fit decodes without drafts.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import OrderedDict

import torch

from tacit.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig
from tacit.config.speculative import SpeculativeConfig
from tacit.loader import ModelSource, open_model
from tacit.models.build import build_model
from tacit.sampling_params import SamplingParams
from tacit.tokenizer import Tokenizer
from tacit.worker.drafter import DraftProposer, DraftTarget, register_draft_proposer
from tacit.worker.model_runner import ModelRunner
from tacit.worker.request_state import CachedRequestState

logger = logging.getLogger("tacit.engine")

_GREEDY = SamplingParams(temperature=0.0)


def check_same_vocabulary(draft: Tokenizer, target: Tokenizer, draft_name: str, target_name: str) -> None:
    """Refuse a draft whose token ids mean other text than the target's: its drafts would be
    other tokens, all rejected."""
    d = draft.tokenizer.get_vocab(with_added_tokens=True)
    t = target.tokenizer.get_vocab(with_added_tokens=True)
    if d == t:
        return
    by_id_d = {i: s for s, i in d.items()}
    by_id_t = {i: s for s, i in t.items()}
    differ = next((i for i in sorted(set(by_id_d) | set(by_id_t)) if by_id_d.get(i) != by_id_t.get(i)), None)
    raise ValueError(
        f"speculative_config model={draft_name!r} has another vocabulary than the target {target_name!r}: "
        f"{len(d)} tokens against {len(t)}, and id {differ} is {by_id_d.get(differ)!r} in the draft's but "
        f"{by_id_t.get(differ)!r} in the target's; a draft model must use the target's tokenizer"
    )


def draft_engine_config(
    spec: SpeculativeConfig, source: ModelSource, target: EngineConfig, num_blocks: int
) -> EngineConfig:
    """The draft runner's config: the target's dtype and kernel settings, a context no longer
    than either model's, a pool of num_blocks, no prefix cache, swap or second tier (the pool is
    this proposer's, and it holds nothing worth keeping), one process."""
    limit = int(source.hf_config.get("max_position_embeddings", 2048))
    model = ModelConfig(
        path=str(source.path),
        hf=source.hf_config,
        dtype=target.model.dtype,
        eos_token_ids=source.eos_token_ids,
        max_model_len=min(target.model.max_model_len, limit),
        quantization=spec.quantization or "auto",
        cpu_kernels=target.model.cpu_kernels,
        ggml_bf16_activations=target.model.ggml_bf16_activations,
    )
    cache = CacheConfig(
        block_size=target.cache.block_size,
        num_kv_blocks=num_blocks,
        cache_dtype=target.cache.cache_dtype,
        enable_prefix_caching=False,
        swap_space=0,
    )
    scheduler = dataclasses.replace(target.scheduler, preemption_mode="recompute")
    return EngineConfig(model, cache, scheduler, target.device, target.seed, ParallelConfig(), None)


@register_draft_proposer("draft_model")
class DraftModelProposer(DraftProposer):
    def __init__(self, config: SpeculativeConfig, runner: ModelRunner, budget: int) -> None:
        """runner: the draft model's, over its own pool; budget: tokens one draft forward may run."""
        self.k = config.num_speculative_tokens
        self.runner = runner
        self.block_size = runner.block_size
        self.max_model_len = runner.config.model.max_model_len
        self.vocab_size = int(runner.config.model.hf["vocab_size"])
        self.budget = budget
        self.free_blocks = list(range(runner.num_blocks - 1, -1, -1))
        self.states: OrderedDict[str, CachedRequestState] = OrderedDict()  # least recently drafted first

    @classmethod
    def create(cls, config: SpeculativeConfig, target: DraftTarget | None) -> DraftModelProposer:
        if target is None:
            raise ValueError('speculative_config method="draft_model" drafts for a target engine; none was given')
        source = open_model(config.model)
        target_config = target.runner.config
        check_same_vocabulary(source.tokenizer, target.source.tokenizer, config.model, target_config.model.path)
        scheduler = target_config.scheduler
        extra = -(-config.num_speculative_tokens // target_config.cache.block_size) + 1
        num_blocks = target.runner.num_blocks + scheduler.max_num_seqs * extra
        draft_config = draft_engine_config(config, source, target_config, num_blocks)
        platform = target.platform
        device = platform.device()
        model = build_model(
            draft_config.model, source.weights, device, platform.free_memory_bytes(), source.quantized_weights
        )
        runner = ModelRunner(draft_config, model, device, platform.free_memory_bytes())
        groups = runner.kv_cache_config.kv_cache_groups
        if len(runner.kv_cache_config.sliding_windows) > 1:  # its blocks are kept here in one table a request
            kinds = ", ".join(g.kv_cache_spec.kind for g in groups)
            raise ValueError(
                f"speculative_config model {config.model!r} has sliding-window layers ({kinds}); a draft "
                "model keeps one block table a request (full-attention or MLA layers only)"
            )
        logger.info(
            "draft model %s: %d KV blocks of %d tokens, decode steps on the %s",
            config.model,
            runner.num_blocks,
            runner.block_size,
            runner.decode_path,
        )
        return cls(config, runner, scheduler.max_num_batched_tokens)

    def propose(self, requests: list[CachedRequestState]) -> dict[str, list[int]]:
        k = self.k
        states: list[CachedRequestState] = []
        batch: set[str] = set()  # states this call drafts with: never evicted for another's room
        for r in requests:
            state = self._level_with(r, batch)
            if state is not None:
                states.append(state)
                batch.add(state.req_id)
        if not states:
            return {}
        first = self._catch_up(states)
        drafts: dict[str, list[int]] = {s.req_id: [] for s in states}
        tokens = first
        for j in range(k):
            for s, t in zip(states, tokens):
                s.token_ids.append(t)
                drafts[s.req_id].append(t)
            if j == k - 1:
                break
            rows = [(s, 1) for s in states]
            _, logits, _ = self.runner.compute_logits(rows)
            for s in states:
                s.num_computed_tokens += 1
            tokens = self._argmax(logits)
        return drafts

    def request_finished(self, state: CachedRequestState) -> None:
        own = self.states.pop(state.req_id, None)
        if own is not None:
            self.free_blocks.extend(own.block_ids[0])

    def _argmax(self, logits: torch.Tensor) -> list[int]:
        return logits[:, : self.vocab_size].argmax(dim=-1).tolist()

    def _level_with(self, r: CachedRequestState, batch: set[str]) -> CachedRequestState | None:
        """The draft's state of r, its computed KV rewound to what r still holds and blocks for
        r's tokens and k drafts; None when r cannot be drafted for (too long for the draft, a
        token the draft does not embed, or no room in its pool)."""
        tokens = r.token_ids
        need_tokens = len(tokens) + self.k - 1  # the last draft is proposed, never fed
        if need_tokens >= self.max_model_len:
            return None
        state = self.states.pop(r.req_id, None)
        if state is None:
            state = CachedRequestState(r.req_id, [], len(tokens), _GREEDY, ([],), 0)
        self.states[r.req_id] = state  # most recently drafted for
        have = state.token_ids
        same = 0
        # The last token is fed again even when the draft computed it (its own draft, which the
        # target then sampled too): the first draft is read from its row.
        limit = min(state.num_computed_tokens, len(tokens) - 1)
        while same < limit and have[same] == tokens[same]:
            same += 1
        if max(tokens[same:]) >= self.vocab_size:
            return None
        state.token_ids = list(tokens)
        state.num_computed_tokens = same
        if not self._reserve(state, -(-need_tokens // self.block_size), batch):
            self.request_finished(state)
            return None
        return state

    def _reserve(self, state: CachedRequestState, blocks: int, batch: set[str]) -> bool:
        """Grow state's blocks to `blocks`, evicting the least recently drafted-for states
        outside this call's batch."""
        short = blocks - len(state.block_ids[0])
        for req_id in list(self.states):
            if short <= len(self.free_blocks):
                break
            if req_id != state.req_id and req_id not in batch:
                self.request_finished(self.states[req_id])
        if short > len(self.free_blocks):
            return False
        for _ in range(max(short, 0)):
            state.block_ids[0].append(self.free_blocks.pop())
        return True

    def _catch_up(self, states: list[CachedRequestState]) -> list[int]:
        """Run every token of states the draft has not computed (in forwards of at most the
        step budget, a long prompt in chunks) and return each state's first draft."""
        first: dict[str, int] = {}
        todo = [(s, s.num_tokens - s.num_computed_tokens) for s in states]
        while todo:
            batch, rest, used = [], [], 0
            for s, n in todo:
                take = min(n, self.budget - used)
                if take <= 0:
                    rest.append((s, n))
                    continue
                batch.append((s, take))
                used += take
                if take < n:
                    rest.append((s, n - take))
            # A short catch-up (the last accepted draft and the token sampled after it) runs as
            # decode rows on the draft's fused decoder, marked as drafts to verify: as a 2-token
            # prefill row it took the torch path, ~15 ms against ~4 ms on the default model.
            for s, n in batch:
                if n <= self.k + 1 and s.num_computed_tokens + n == s.num_tokens:
                    s.num_draft_tokens = n - 1
            t = time.perf_counter()
            sampled, logits, _ = self.runner.compute_logits(batch)
            if any(n > self.k + 1 for _, n in batch):  # a prompt's prefill, not a step's catch-up
                self.catch_up_s += time.perf_counter() - t
            row = 0
            for i in sampled:  # each sampling row's logits: one per draft, then its last token's
                s = batch[i][0]
                row += 1 + s.num_draft_tokens
                first[s.req_id] = int(logits[row - 1, : self.vocab_size].argmax())
            for s, n in batch:
                s.num_computed_tokens += n
                s.num_draft_tokens = 0
            todo = rest
        return [first[s.req_id] for s in states]
