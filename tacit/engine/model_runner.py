"""ModelRunner: a SchedulerOutput in, a ModelRunnerOutput out.

It keeps its own state per request (request_state.py) from the plain data the scheduler sends,
turns the step's rows into one flat batch (input_ids, positions, slot_mapping and the
attention metadata, built once per step in numpy rather than per layer or per request in
torch), drives the model's decoder layers itself (so work can run between two of them: a
cut-in prefill), projects only the rows that sample, and calls the sampler.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np
import torch
from torch import nn

from tacit.config import EngineConfig, fit_kv_capacity
from tacit.distributed.communicator import Communicator
from tacit.engine.kv_swap_store import KVSwapStore
from tacit.engine.prompt_logprobs import prompt_tokens_to_score, score_prompt_tokens
from tacit.engine.request_state import CachedRequestState, update_request_states
from tacit.engine.two_batch_overlap import run_two_batches, split_point
from tacit.forward_context import DataParallelMetadata, set_forward_context
from tacit.kernels.kv_quant import parse_kv_cache_dtype
from tacit.layers.attention_selector import select_attention_backend
from tacit.layers.data_parallel import gather_tokens
from tacit.layers.kv_cache import KVCacheLayer
from tacit.layers.linear import (
    communication_seconds,
    hidden_communication_seconds,
    select_linear_method,
    use_communicator,
    use_linear_method,
)
from tacit.layers.moe import select_moe_kernel, use_moe_kernel
from tacit.layers.sampler import Sampler, SamplingMetadata
from tacit.models.expert_streaming import stream_experts
from tacit.outputs import ModelRunnerOutput, RawPromptLogprobs
from tacit.scheduling.scheduler_output import SchedulerOutput, samples_this_step

# A step's rows: each request's state and the tokens it computes this step, in batch order.
Rows = list[tuple[CachedRequestState, int]]
# req_id -> the prompt tokens its chunk scored this step (only requests with prompt_logprobs).
PromptScores = dict[str, RawPromptLogprobs]

_DEFAULT_KV_BUDGET = 2 << 30  # 2 GiB, capped by what the batch limits could ever use
# Below this many rows a fused decode step is short (~11 ms at 1 row, ~40 ms at 8 on the default
# model) and runs as one call; above, one call per layer (~20 us each) lets urgent work cut in.
_CUT_IN_MIN_ROWS = 8
# Mixed steps with at least this many one-token rows run them through the fused decoder (see
# ModelRunner._splits_mixed_step). Measured on SmolLM2-135M bf16, ctx ~300, torch path vs split,
# two runs each: 64 decodes + 16/64/512-token prefill 306-325/298-374/746-889 ms vs
# 243-251/213-281/571-625 ms; 1 decode + 16/64 prefill 107-116/140-141 ms vs 94-98/137-145 ms.
# No decode count lost beyond the noise (512-token prefills vary by +-150 ms run to run), so
# every mixed step splits; the attribute stays so benchmarks and tests can time the torch path.
_SPLIT_MIN_DECODES = 1


def kv_cache_layers(model: nn.Module) -> list[KVCacheLayer]:
    return [m for m in model.modules() if isinstance(m, KVCacheLayer)]


def _samples(r: CachedRequestState, n: int) -> bool:
    return samples_this_step(r.num_computed_tokens, n, r.num_tokens, r.sampling_params)


def _prompt_tokens_scored(r: CachedRequestState, n: int) -> tuple[int, int]:
    """[first, end) of the prompt tokens this step's chunk of r scores; empty unless it asked."""
    if r.sampling_params.prompt_logprobs is None:
        return 0, 0
    return prompt_tokens_to_score(r.num_computed_tokens, n, r.num_prompt_tokens, r.next_prompt_logprob)


def _fusable(r: CachedRequestState, n: int) -> bool:
    """One-token rows may run on the fused decoder, which hands back only the sampling rows'
    hidden states; a row that scores a prompt token needs its own, from the torch path."""
    first, end = _prompt_tokens_scored(r, n)
    return n == 1 and first == end


class TorchInputs(NamedTuple):
    """A torch-path forward's inputs, built from its rows (ModelRunner._build)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: Any
    samples: list[int]  # rows that sample
    sample_rows: torch.Tensor  # their last token's flat batch row
    # (row index, prompt tokens [first, end) it scores, flat batch row of the position before first)
    scored: list[tuple[int, int, int, int]]


class ModelRunner:
    def __init__(
        self,
        config: EngineConfig,
        model: nn.Module,
        device: torch.device,
        free_memory: int,
        comm: Communicator | None = None,
        agree_num_blocks: Callable[[int], int] | None = None,
    ) -> None:
        """comm: the tensor-parallel group's communicator (one rank of several); agree_num_blocks
        turns this rank's KV block count into the one every rank uses (the smallest)."""
        self.config = config
        self.model = model
        self.device = device
        self.block_size = config.cache.block_size
        self.sampler = Sampler()
        self.execute_seconds = 0.0  # execute_s summed since load (rank_stats)
        kernels = None
        if device.type == "cpu" and config.model.dtype == torch.bfloat16:
            from tacit.kernels.cpu_kernels import load_cpu_kernels

            kernels = load_cpu_kernels()
        # Chosen once for the model: how its linear layers multiply, which kernel runs its
        # experts, which backend attends.
        use_linear_method(model, select_linear_method(device.type, config.model.dtype))
        use_moe_kernel(model, select_moe_kernel(device.type, config.model.dtype))
        self.comm = comm
        if comm is not None:
            use_communicator(model, comm)
        # Torch-path steps of 2+ requests run as two overlapping micro-batches (tensor parallel).
        self.two_batch_overlap = config.parallel.two_batch_overlap and comm is not None
        # Data-parallel attention: this rank runs only the rows of the requests placed on it.
        self.data_parallel = config.parallel.data_parallel_attention and comm is not None
        # MoE experts read from the checkpoint through a cache, when they do not all fit.
        self.expert_cache = None
        if config.model.expert_cache_memory is not None:
            self.expert_cache = stream_experts(
                model,
                Path(config.model.path),
                config.model.expert_cache_memory,
                config.scheduler.max_num_batched_tokens,
                config.model.dtype,
            )
        self.attn_backend = select_attention_backend(device.type, config.model.dtype, config.model)
        layers = kv_cache_layers(model)
        for m in layers:
            m.set_attention_backend(self.attn_backend)
        dtype = self.kv_cache_dtype = parse_kv_cache_dtype(config.cache.cache_dtype, config.model.dtype)
        self.bytes_per_block = self.block_size * sum(m.kv_numel_per_token(dtype) for m in layers) * dtype.itemsize
        # This rank's KV blocks in host memory while their request is swapped out (every rank
        # holds its own shard; the scheduler's SwapOps say what to copy).
        self.swap_store = KVSwapStore(layers) if config.cache.swap_space > 0 else None
        self.num_blocks = self._num_blocks(free_memory)
        if agree_num_blocks is not None:
            # Every rank's scheduler-side block ids index its own pool: all pools are one size.
            self.num_blocks = agree_num_blocks(self.num_blocks)
        self.config = config = fit_kv_capacity(config, self.num_blocks * self.block_size)
        for m in layers:
            m.allocate_kv_cache(self.num_blocks, self.block_size, dtype, device)
        # Decode-only steps run as one C++ call when the model and CPU allow it.
        self.fused_decode = None
        build_fused_decoder = getattr(model, "build_fused_decoder", None)
        if kernels is not None and build_fused_decoder is not None:
            # Its rope tables cover every position a sequence can reach: no more than the pool
            # holds, even when an explicit max_model_len is longer.
            positions = min(config.model.max_model_len, self.num_blocks * self.block_size)
            self.fused_decode = build_fused_decoder(kernels, self.block_size, positions)
        self.split_min_decodes = _SPLIT_MIN_DECODES
        self.requests: dict[str, CachedRequestState] = {}
        # Set by LLMEngine.score_full_logprobs for the length of one call: (req_id, first prompt
        # token, [rows, vocab] float32 log-softmax) for every slice a prompt_logprobs request scores.
        self.full_prompt_logprobs: Callable[[str, int, torch.Tensor], None] | None = None

    def _num_blocks(self, free_memory: int) -> int:
        cache = self.config.cache
        fits = free_memory // self.bytes_per_block
        if cache.num_kv_blocks is not None:
            if cache.num_kv_blocks > fits:  # refused here, not by the allocator's out-of-memory error
                raise ValueError(
                    f"num_kv_blocks={cache.num_kv_blocks} needs {cache.num_kv_blocks * self.bytes_per_block} bytes of "
                    f"KV cache ({self.bytes_per_block} a block); {free_memory} bytes are free, room for at most {fits}"
                )
            return cache.num_kv_blocks
        if cache.kv_cache_memory is not None and cache.kv_cache_memory > free_memory:
            raise ValueError(f"kv_cache_memory={cache.kv_cache_memory} bytes is more than the {free_memory} bytes free")
        budget = cache.kv_cache_memory or min(_DEFAULT_KV_BUDGET, free_memory // 2)
        num = budget // self.bytes_per_block
        # No point holding more than max_num_seqs full-length sequences.
        most = -(-self.config.model.max_model_len // self.block_size) * self.config.scheduler.max_num_seqs
        num = min(num, most)
        if num < 1:
            raise ValueError(f"kv_cache_memory={budget} bytes is below one KV block ({self.bytes_per_block} bytes)")
        return int(num)

    def _block_tables(self, rows: Rows, seq_lens: np.ndarray) -> np.ndarray:
        max_blocks = -(-int(seq_lens.max()) // self.block_size)
        tables = np.zeros((len(rows), max_blocks), dtype=np.int64)
        for i, (r, _) in enumerate(rows):
            t = r.block_ids
            tables[i, : len(t)] = t[:max_blocks]
        return tables

    def _build(self, rows: Rows) -> TorchInputs:
        bs = self.block_size
        num_new = np.array([n for _, n in rows], dtype=np.int64)
        computed = np.array([r.num_computed_tokens for r, _ in rows], dtype=np.int64)
        num_reqs, total = len(rows), int(num_new.sum())
        starts = np.zeros(num_reqs + 1, dtype=np.int64)
        np.cumsum(num_new, out=starts[1:])
        token_ids = np.fromiter(
            (t for (r, n), c in zip(rows, computed) for t in r.token_ids[c : c + n]), dtype=np.int64, count=total
        )
        req_of_token = np.repeat(np.arange(num_reqs), num_new)
        offset_in_query = np.arange(total) - starts[req_of_token]
        positions = computed[req_of_token] + offset_in_query
        tables = self._block_tables(rows, computed + num_new)
        slot_mapping = tables[req_of_token, positions // bs] * bs + positions % bs
        meta = self.attn_backend.build_metadata(num_new, computed, tables, slot_mapping, self.device, bs)
        samples = [i for i, (r, n) in enumerate(rows) if _samples(r, n)]
        sample_rows = starts[1:][samples] - 1
        # (row index, prompt tokens [first, end) it scores, flat batch row of the position before first)
        scored = []
        for i, ((r, n), c) in enumerate(zip(rows, computed)):
            first, end = _prompt_tokens_scored(r, n)
            if first < end:
                scored.append((i, first, end, int(starts[i] + first - 1 - c)))
        dev = self.device
        return TorchInputs(
            torch.from_numpy(token_ids).to(dev),
            torch.from_numpy(positions).to(dev),
            meta,
            samples,
            torch.from_numpy(sample_rows).to(dev),
            scored,
        )

    @staticmethod
    def _run_layers(
        run: Callable[[int, int], None], num_layers: int, between_layers: Callable[[], None] | None
    ) -> None:
        """The one loop over decoder layers, for the torch and the fused paths alike: all at once,
        or one at a time with between_layers() at every boundary."""
        if between_layers is None:
            run(0, num_layers)
            return
        for layer in range(num_layers):
            if layer:
                between_layers()
            run(layer, layer + 1)

    def _fused_decode_hidden(self, rows: Rows, between_layers: Callable[[], None] | None) -> torch.Tensor:
        """Final hidden states of one-token rows, from the C++ decoder."""
        bs = self.block_size
        positions = [r.num_computed_tokens for r, _ in rows]
        token_ids = [r.token_ids[p] for (r, _), p in zip(rows, positions)]
        width = max(positions, default=0) // bs + 1  # no rows: a data-parallel rank with none
        tables = []
        for r, _ in rows:
            t = r.block_ids[:width]
            tables.append(t + [0] * (width - len(t)))
        ids = torch.tensor(token_ids, dtype=torch.long)
        pos = torch.tensor(positions, dtype=torch.long)
        tables = torch.tensor(tables, dtype=torch.long).reshape(len(rows), width)
        fused = self.fused_decode
        if len(rows) < _CUT_IN_MIN_ROWS:
            between_layers = None  # a short step runs as one call: a boundary costs more than it saves
        x = fused.embed(ids)
        self._run_layers(
            lambda begin, end: fused.run_layers(x, pos, tables, begin, end), fused.num_layers, between_layers
        )
        return fused.final_norm(x)

    def _uses_fused_decode(self, rows: Rows) -> bool:
        return self.fused_decode is not None and all(_fusable(r, n) for r, n in rows)

    def _splits_mixed_step(self, rows: Rows) -> bool:
        """Whether a step with prefill chunks sends its one-token rows through the fused decoder.

        In a mixed step the torch path gathers every decode row's KV into padded copies and runs
        SDPA over them; the fused decoder reads the cache in place. Running the step as two
        forwards (fused decodes, torch prefills) pays once enough decodes ride along.
        """
        if self.fused_decode is None:
            return False
        return sum(_fusable(r, n) for r, n in rows) >= max(1, self.split_min_decodes)

    def _fused_part(
        self, rows: Rows, between_layers: Callable[[], None] | None
    ) -> tuple[list[int], torch.Tensor, PromptScores]:
        hidden = self._fused_decode_hidden(rows, between_layers)
        # A one-token step can also be the last prompt token of a chunked prefill that is
        # not yet level with its request (only those level with all their tokens sample).
        samples = [i for i, (r, n) in enumerate(rows) if _samples(r, n)]
        return samples, hidden if len(samples) == len(rows) else hidden[samples], {}

    def _torch_part(
        self, rows: Rows, between_layers: Callable[[], None] | None
    ) -> tuple[list[int], torch.Tensor, PromptScores]:
        if self.two_batch_overlap and between_layers is None and len(rows) >= 2:
            return self._two_batch_part(rows)
        built = self._build(rows)
        model = self.model
        with set_forward_context(built.meta):
            state = model.begin_forward(built.input_ids, built.positions)
            self._run_layers(
                lambda begin, end: model.forward_layers(state, begin, end), model.num_layers, between_layers
            )
            hidden = model.end_forward(state)
        return self._torch_outputs(rows, built, hidden)

    def _two_batch_part(self, rows: Rows) -> tuple[list[int], torch.Tensor, PromptScores]:
        """The torch path as two micro-batches of whole requests whose all-reduces overlap the
        other's compute (engine/two_batch_overlap.py); rows come back in scheduled order."""
        k = split_point([n for _, n in rows])
        halves = [rows[:k], rows[k:]]
        built = [self._build(half) for half in halves]
        model = self.model
        states = [model.begin_forward(b.input_ids, b.positions) for b in built]
        run_two_batches(
            [(model.forward_stages(state, 0, model.num_layers), b.meta) for state, b in zip(states, built)], self.comm
        )
        parts = [
            self._torch_outputs(half, b, model.end_forward(state)) for half, b, state in zip(halves, built, states)
        ]
        (samples_a, hidden_a, scores_a), (samples_b, hidden_b, scores_b) = parts
        return samples_a + [k + i for i in samples_b], torch.cat([hidden_a, hidden_b]), scores_a | scores_b

    def _torch_outputs(
        self, rows: Rows, built: TorchInputs, hidden: torch.Tensor
    ) -> tuple[list[int], torch.Tensor, PromptScores]:
        """The sampling rows' final hidden states and the prompt logprobs of the rows that score."""
        samples, sample_rows, scored = built.samples, built.sample_rows, built.scored
        prompt_logprobs = {
            rows[i][0].req_id: self._score_prompt(rows[i][0], first, end, hidden[row : row + end - first])
            for i, first, end, row in scored
        }
        return samples, hidden[sample_rows], prompt_logprobs

    def _score_prompt(self, r: CachedRequestState, first: int, end: int, hidden: torch.Tensor) -> RawPromptLogprobs:
        """r's prompt tokens [first, end) scored from the hidden states of the positions before them."""
        sink = self.full_prompt_logprobs
        full = None if sink is None else (lambda start, lp: sink(r.req_id, start, lp))
        return score_prompt_tokens(
            self.model.compute_logits,
            hidden,
            r.token_ids[first:end],
            first,
            r.sampling_params.prompt_logprobs,
            self.config.model.hf["vocab_size"],
            full,
        )

    def _split_part(
        self, rows: Rows, between_layers: Callable[[], None] | None
    ) -> tuple[list[int], torch.Tensor, PromptScores]:
        """One-token rows through the fused decoder, the rest through torch, rows back in
        scheduled order. The two forwards write the KV slots of disjoint requests."""
        decodes = [i for i, (r, n) in enumerate(rows) if _fusable(r, n)]
        prefills = [i for i, (r, n) in enumerate(rows) if not _fusable(r, n)]
        dec_samples, dec_hidden, _ = self._fused_part([rows[i] for i in decodes], between_layers)
        pre_samples, pre_hidden, prompt_logprobs = self._torch_part([rows[i] for i in prefills], between_layers)
        index = [decodes[i] for i in dec_samples] + [prefills[i] for i in pre_samples]
        order = sorted(range(len(index)), key=index.__getitem__)
        hidden = torch.cat([dec_hidden, pre_hidden.to(dec_hidden.dtype)])[torch.tensor(order, dtype=torch.long)]
        return [index[i] for i in order], hidden, prompt_logprobs

    def _data_parallel_forward(self, rows: Rows) -> tuple[torch.Tensor, torch.Tensor, TorchInputs | None]:
        """This rank's final hidden states of its own rows, those of its sampling rows, and the
        torch path's inputs (None on the C++ path or with no rows of its own)."""
        comm = self.comm
        counts = [0] * comm.world_size
        for r, n in rows:
            counts[r.dp_rank] += n
        own = [(r, n) for r, n in rows if r.dp_rank == comm.rank]
        dp = DataParallelMetadata(tuple(counts))
        if self.fused_decode is not None and all(_fusable(r, n) for r, n in rows):
            # A decode-only step (every rank sees the same rows, so all take this path): the C++
            # decoder, told where this rank's rows sit among everyone's.
            self.fused_decode.set_data_parallel_rows(sum(counts[: comm.rank]), sum(counts))
            with set_forward_context(None, dp):  # the vocabulary-split embedding gathers the ids
                hidden = self._fused_decode_hidden(own, None)
            return hidden, hidden[[j for j, (r, n) in enumerate(own) if _samples(r, n)]], None
        built = self._build(own) if own else None
        if built is None:
            empty = torch.empty(0, dtype=torch.long, device=self.device)
            ids, positions, meta = empty, empty, None
        else:
            ids, positions, meta = built.input_ids, built.positions, built.meta
        model = self.model
        with set_forward_context(meta, dp):
            state = model.begin_forward(ids, positions)
            model.forward_layers(state, 0, model.num_layers)
            hidden = model.end_forward(state)
        return hidden, hidden[built.sample_rows] if built is not None else hidden[:0], built

    def _data_parallel_part(self, rows: Rows) -> tuple[list[int], torch.Tensor | None, PromptScores]:
        """Data-parallel attention: this rank's forward over the rows of its own requests (none is
        fine: its layers still join every collective), then the hidden states that reach the
        head — every rank's sampling rows, and the prompt rows some request scores — all-gathered,
        so every rank runs the (vocabulary-split) head over the same rows, as under tensor
        parallelism. Every rank derives each rank's counts from the same rows: no collective is
        spent agreeing on them."""
        comm, model = self.comm, self.model
        world = comm.world_size
        hidden, local, built = self._data_parallel_forward(rows)
        # Rows in rank order (each rank's in step order, as its own batch has them).
        by_rank = sorted(range(len(rows)), key=lambda i: rows[i][0].dp_rank)
        sampling = [i for i in by_rank if _samples(*rows[i])]
        scored = [(i, *_prompt_tokens_scored(*rows[i])) for i in by_rank]
        scored = [(i, first, end) for i, first, end in scored if first < end]
        sampling_counts, scored_counts = [0] * world, [0] * world
        for i in sampling:
            sampling_counts[rows[i][0].dp_rank] += 1
        for i, first, end in scored:
            scored_counts[rows[i][0].dp_rank] += end - first
        prompt_logprobs: PromptScores = {}
        if scored:
            mine = [hidden[row : row + end - first] for _, first, end, row in built.scored] if built else []
            everyone = gather_tokens(torch.cat(mine) if mine else hidden[:0], tuple(scored_counts), comm)
            offset = 0
            for i, first, end in scored:
                prompt_logprobs[rows[i][0].req_id] = self._score_prompt(
                    rows[i][0], first, end, everyone[offset : offset + end - first]
                )
                offset += end - first
        if not sampling:
            return [], None, prompt_logprobs
        everyone = gather_tokens(local.contiguous(), tuple(sampling_counts), comm)  # in rank order
        step_order = sorted(sampling)
        position = {row: p for p, row in enumerate(sampling)}
        in_step_order = everyone[torch.tensor([position[i] for i in step_order])]
        return step_order, model.compute_logits(in_step_order), prompt_logprobs

    def rows(self, scheduler_output: SchedulerOutput) -> Rows:
        return [(self.requests[rid], n) for rid, n in scheduler_output.num_scheduled_tokens.items()]

    @torch.inference_mode()
    def compute_logits(
        self, rows: Rows, between_layers: Callable[[], None] | None = None
    ) -> tuple[list[int], torch.Tensor | None, PromptScores]:
        """Run the step's forward: (indexes of the rows that sample, their logits, the prompt
        logprobs its chunks scored); writes this step's KV. between_layers, if given, runs at
        every decoder-layer boundary."""
        if not rows:
            return [], None, {}
        if self.data_parallel:
            return self._data_parallel_part(rows)
        if self._uses_fused_decode(rows):
            samples, hidden, prompt_logprobs = self._fused_part(rows, between_layers)
        elif self._splits_mixed_step(rows):
            samples, hidden, prompt_logprobs = self._split_part(rows, between_layers)
        else:
            samples, hidden, prompt_logprobs = self._torch_part(rows, between_layers)
        if not samples:
            return [], None, prompt_logprobs
        return samples, self.model.compute_logits(hidden), prompt_logprobs

    @staticmethod
    def _add_grammar_bitmask(
        metadata: SamplingMetadata, states: list[CachedRequestState], scheduler_output: SchedulerOutput
    ) -> None:
        """Point the scheduler's bitmask rows at the sampling rows they constrain."""
        row_of = {r.req_id: i for i, r in enumerate(states)}
        ids = scheduler_output.structured_output_request_ids
        missing = [rid for rid in ids if rid not in row_of]
        if missing:  # the scheduler masks only rows that sample: anything else is a bookkeeping bug
            raise RuntimeError(f"grammar bitmask for requests that do not sample this step: {missing}")
        metadata.grammar_rows = [row_of[rid] for rid in ids]
        metadata.grammar_bitmask = torch.from_numpy(scheduler_output.grammar_bitmask)

    def rank_stats(self) -> dict[str, float]:
        """This rank's totals since load: seconds in its steps (execute_s summed) and seconds of
        them blocked in collectives. `tacit profile` compares the ranks' (Executor.rank_stats)."""
        return {"execute_s": self.execute_seconds, "communication_s": sum(self.communication_seconds().values())}

    def communication_seconds(self) -> dict[str, float]:
        """Tensor parallel: {layer: seconds this rank blocked in its collectives} since load,
        the torch path's modules and the fused decode step's layers alike; {} in one process."""
        out = communication_seconds(self.model)
        fused = getattr(self.fused_decode, "communication_seconds", None)
        if fused is not None:
            out.update(fused())
        return out

    def hidden_communication_seconds(self) -> dict[str, float]:
        """{decoder layer: seconds its all-reduces travelled while the other micro-batch computed}
        under two-micro-batch overlap; {} without it."""
        return hidden_communication_seconds(self.model)

    def append_sampled(self, req_ids: list[str], token_ids: list[int]) -> None:
        """Tokens another rank sampled for these requests (a tensor-parallel worker samples nothing
        itself: it takes the driver's tokens before the next step)."""
        for req_id, token in zip(req_ids, token_ids):
            state = self.requests.get(req_id)
            if state is not None:
                state.token_ids.append(token)

    @torch.inference_mode()
    def execute(
        self,
        scheduler_output: SchedulerOutput,
        between_layers: Callable[[], None] | None = None,
        sample: bool = True,
    ) -> ModelRunnerOutput:
        """Apply the step's request changes, run it and sample (sample=False: run the forward and
        the logits, whose collectives every rank joins, and stop there). Time spent inside
        between_layers (a cut-in runs another execute() there) is left out of execute_s."""
        update_request_states(self.requests, scheduler_output)
        # Before the forward: a swapped-out request's blocks may be this step's new blocks.
        swap_blocks, swap_s = (
            self.swap_store.apply(scheduler_output.swap_ops) if scheduler_output.swap_ops else (0, 0.0)
        )
        if scheduler_output.is_empty():
            return ModelRunnerOutput(swap_blocks=swap_blocks, swap_s=swap_s)
        t0 = time.perf_counter()
        nested_s = 0.0
        hook = None
        if between_layers is not None:

            def hook() -> None:
                nonlocal nested_s
                t = time.perf_counter()
                between_layers()
                nested_s += time.perf_counter() - t

        rows = self.rows(scheduler_output)
        samples, logits, prompt_logprobs = self.compute_logits(rows, hook)
        out = ModelRunnerOutput()
        if logits is not None and sample:
            states = [rows[i][0] for i in samples]
            params = [r.sampling_params for r in states]
            # Only penalties read the generated ids; slicing them out of every row's token list
            # each step would copy the whole context of every sampling row for nothing.
            output_ids = [r.output_token_ids if p.needs_penalties else [] for r, p in zip(states, params)]
            metadata = SamplingMetadata(params, output_ids, [r.generator for r in states])
            if scheduler_output.grammar_bitmask is not None:
                self._add_grammar_bitmask(metadata, states, scheduler_output)
            sampled = self.sampler(logits, metadata)
            for state, token in zip(states, sampled.token_ids):
                state.token_ids.append(token)
            out = ModelRunnerOutput([r.req_id for r in states], sampled.token_ids, sampled.logprobs)
        for req_id, scored in prompt_logprobs.items():
            self.requests[req_id].next_prompt_logprob = scored.start + len(scored.token_ids)
        out.prompt_logprobs = prompt_logprobs
        out.execute_s = time.perf_counter() - t0 - nested_s
        out.swap_blocks, out.swap_s = swap_blocks, swap_s
        self.execute_seconds += out.execute_s
        return out
