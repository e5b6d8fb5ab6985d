"""Data-parallel attention: this rank's forward over the rows of its own requests (none is fine:
its layers still join every collective), then the hidden states that reach the head — every
rank's sampling rows, and the prompt rows some request scores — all-gathered, so every rank runs
the (vocabulary-split) head over the same rows, as under tensor parallelism. Every rank derives
each rank's counts from the same rows: no collective is spent agreeing on them. It takes every
row of every step (each rank sees the whole step), so it hands back logits, not hidden states.
"""

from __future__ import annotations

import torch

from tacit.forward_context import DataParallelMetadata, set_forward_context
from tacit.layers.data_parallel import gather_tokens
from tacit.worker.input_batch import (
    PromptScores,
    Rows,
    TorchInputs,
    build_inputs,
    decode_row_sampled,
    fusable,
    prompt_tokens_scored,
    samples,
)
from tacit.worker.paths.base import ExecutionPath, PathContext, PathResult, Steps, finish, register_execution_path
from tacit.worker.paths.fused_decode import fused_decode_hidden


@register_execution_path("data_parallel")
class DataParallelPath(ExecutionPath):
    preference = 0  # when on, it takes every step

    @classmethod
    def available(cls, ctx: PathContext) -> bool:
        return ctx.data_parallel and ctx.comm is not None

    def accepts(self, rows: Rows, pausable: bool) -> bool:
        return True  # every step: a pause on one rank would stall the others' collectives

    def _forward(self, rows: Rows) -> tuple[torch.Tensor, torch.Tensor, TorchInputs | None]:
        """This rank's final hidden states of its own rows, those of its sampling rows, and the
        torch path's inputs (None on the C++ path or with no rows of its own)."""
        ctx = self.ctx
        comm = ctx.comm
        counts = [0] * comm.world_size
        for r, n in rows:
            counts[r.dp_rank] += n
        own = [(r, n) for r, n in rows if r.dp_rank == comm.rank]
        dp = DataParallelMetadata(tuple(counts))
        if ctx.fused_decode is not None and all(fusable(r, n) for r, n in rows):
            # A decode-only step (every rank sees the same rows, so all take this path): the C++
            # decoder, told where this rank's rows sit among everyone's.
            ctx.fused_decode.set_data_parallel_rows(sum(counts[: comm.rank]), sum(counts))
            with set_forward_context(None, dp):  # the vocabulary-split embedding gathers the ids
                hidden = finish(fused_decode_hidden(ctx, own, False))
            return hidden, hidden[decode_row_sampled(own)], None
        built = build_inputs(own, ctx.block_size, ctx.attn_backend, ctx.device) if own else None
        if built is None:
            empty = torch.empty(0, dtype=torch.long, device=ctx.device)
            ids, positions, meta = empty, empty, None
        else:
            ids, positions, meta = built.input_ids, built.positions, built.meta
        model = ctx.model
        with set_forward_context(meta, dp):
            state = model.begin_forward(ids, positions)
            model.forward_layers(state, 0, model.num_layers)
            hidden = model.end_forward(state)
        return hidden, hidden[built.sample_rows] if built is not None else hidden[:0], built

    def steps(self, rows: Rows, pausable: bool) -> Steps[PathResult]:
        ctx = self.ctx
        comm, model = ctx.comm, ctx.model
        world = comm.world_size
        hidden, local, built = self._forward(rows)
        # Rows in rank order (each rank's in step order, as its own batch has them).
        by_rank = sorted(range(len(rows)), key=lambda i: rows[i][0].dp_rank)
        sampling = [i for i in by_rank if samples(*rows[i])]
        scored = [(i, *prompt_tokens_scored(*rows[i])) for i in by_rank]
        scored = [(i, first, end) for i, first, end in scored if first < end]
        sampling_counts, scored_counts = [0] * world, [0] * world
        # Hidden rows per sampling row: its last token's, and one per draft token it verifies.
        width = {i: 1 + rows[i][0].num_draft_tokens for i in sampling}
        for i in sampling:
            sampling_counts[rows[i][0].dp_rank] += width[i]
        for i, first, end in scored:
            scored_counts[rows[i][0].dp_rank] += end - first
        prompt_logprobs: PromptScores = {}
        if scored:
            mine = [hidden[row : row + end - first] for _, first, end, row in built.scored] if built else []
            everyone = gather_tokens(torch.cat(mine) if mine else hidden[:0], tuple(scored_counts), comm)
            offset = 0
            for i, first, end in scored:
                prompt_logprobs[rows[i][0].req_id] = ctx.score_prompt(
                    rows[i][0], first, end, everyone[offset : offset + end - first]
                )
                offset += end - first
        if not sampling:
            return PathResult([], None, prompt_logprobs)
        everyone = gather_tokens(local.contiguous(), tuple(sampling_counts), comm)  # in rank order
        step_order = sorted(sampling)
        start, offset = {}, 0
        for i in sampling:
            start[i], offset = offset, offset + width[i]
        in_step_order = everyone[torch.tensor([start[i] + j for i in step_order for j in range(width[i])])]
        return PathResult(step_order, model.compute_logits(in_step_order), prompt_logprobs)
        yield  # a generator that never pauses (see accepts)
