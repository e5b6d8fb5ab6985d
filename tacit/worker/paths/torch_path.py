"""The torch path: the reference every other path is tested against; it takes any rows."""

from __future__ import annotations

from tacit.forward_context import set_forward_context
from tacit.worker.input_batch import Rows, build_inputs
from tacit.worker.paths.base import HiddenStatesPath, PathResult, Steps, register_execution_path, run_layers


@register_execution_path("torch")
class TorchPath(HiddenStatesPath):
    preference = 100  # the fallback
    exports_row_hidden = True

    def accepts(self, rows: Rows, pausable: bool) -> bool:
        return True

    def hidden_steps(self, rows: Rows, pausable: bool) -> Steps[PathResult]:
        ctx = self.ctx
        built = build_inputs(rows, ctx.block_size, ctx.attn_backend, ctx.device)
        model = ctx.model
        with set_forward_context(built.meta):
            state = model.begin_forward(built.input_ids, built.positions)
            yield from run_layers(
                lambda begin, end: model.forward_layers(state, begin, end), model.num_layers, pausable
            )
            hidden = model.end_forward(state)
        return ctx.torch_outputs(rows, built, hidden)
