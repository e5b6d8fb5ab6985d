"""Two overlapping micro-batches (tensor parallel, torch-path steps of 2+ requests): each
micro-batch's all-reduces in flight while the other computes (paths/two_batch_overlap.py)."""

from __future__ import annotations

import torch

from tacit.worker.input_batch import Rows, build_inputs, has_pooling
from tacit.worker.paths.base import HiddenStatesPath, PathContext, PathResult, Steps, register_execution_path
from tacit.worker.paths.two_batch_overlap import run_two_batches, split_point


@register_execution_path("two_batch")
class TwoBatchPath(HiddenStatesPath):
    preference = 50  # before the torch path, whose rows it takes when on

    @classmethod
    def available(cls, ctx: PathContext) -> bool:
        return ctx.two_batch_overlap and ctx.comm is not None

    def accepts(self, rows: Rows, pausable: bool) -> bool:
        # A cut-in needs layer boundaries, which the interleaved stages do not offer; an embedding
        # request needs every token's hidden states, which this path does not export.
        return not pausable and len(rows) >= 2 and not has_pooling(rows)

    def hidden_steps(self, rows: Rows, pausable: bool) -> Steps[PathResult]:
        ctx = self.ctx
        k = split_point([n for _, n in rows])
        halves = [rows[:k], rows[k:]]
        built = [build_inputs(half, ctx.block_size, ctx.attn_backend, ctx.device) for half in halves]
        model = ctx.model
        states = [model.begin_forward(b.input_ids, b.positions) for b in built]
        run_two_batches(
            [(model.forward_stages(state, 0, model.num_layers), b.meta) for state, b in zip(states, built)], ctx.comm
        )
        (samples_a, hidden_a, scores_a, _), (samples_b, hidden_b, scores_b, _) = [
            ctx.torch_outputs(half, b, model.end_forward(state)) for half, b, state in zip(halves, built, states)
        ]
        return PathResult(samples_a + [k + i for i in samples_b], torch.cat([hidden_a, hidden_b]), scores_a | scores_b)
        yield  # a generator that never pauses (accepts() turned pausable steps away)
