"""A mixed step split in two forwards: its one-token rows through the fused decoder, the rest
(prefill chunks, rows that score prompt tokens) through the next path that takes them, rows put
back in scheduled order. The two forwards write the KV slots of disjoint requests.

In a mixed step the torch path gathers every decode row's KV into padded copies and runs SDPA
over them; the fused decoder reads the cache in place. Measured on SmolLM2-135M bf16, ctx ~300,
torch path vs split, two runs each: 64 decodes + 16/64/512-token prefill 306-325/298-374/746-889
ms vs 243-251/213-281/571-625 ms; 1 decode + 16/64 prefill 107-116/140-141 ms vs 94-98/137-145
ms. No decode count lost beyond the noise (512-token prefills vary by +-150 ms run to run), so
every mixed step splits (PathContext.split_min_decodes = 1; benchmarks and tests may raise it).
"""

from __future__ import annotations

import torch

from tacit.worker.input_batch import Rows, fusable
from tacit.worker.paths.base import (
    ExecutionPath,
    HiddenStatesPath,
    PathContext,
    PathResult,
    Steps,
    first_accepting,
    register_execution_path,
)
from tacit.worker.paths.fused_decode import FusedDecodePath


@register_execution_path("split")
class SplitPath(HiddenStatesPath):
    preference = 20  # after the all-fused step, before the paths that take every row
    exports_row_hidden = True

    @classmethod
    def available(cls, ctx: PathContext) -> bool:
        return ctx.fused_decode is not None

    def compose(self, paths: list[ExecutionPath]) -> None:
        self.decodes = next(p for p in paths if isinstance(p, FusedDecodePath))
        # The paths that take the other rows, as the runner would choose among them.
        self.rest = [p for p in paths if p.preference > self.preference and isinstance(p, HiddenStatesPath)]

    def accepts(self, rows: Rows, pausable: bool) -> bool:
        if self.ctx.fused_decode is None:
            return False
        decodes = sum(fusable(r, n) for r, n in rows)
        return max(1, self.ctx.split_min_decodes) <= decodes < len(rows)  # a mixed step only

    def hidden_steps(self, rows: Rows, pausable: bool) -> Steps[PathResult]:
        decodes = [i for i, (r, n) in enumerate(rows) if fusable(r, n)]
        others = [i for i, (r, n) in enumerate(rows) if not fusable(r, n)]
        dec_rows, other_rows = [rows[i] for i in decodes], [rows[i] for i in others]
        dec_samples, dec_hidden, _, dec_rows_hidden = yield from self.decodes.hidden_steps(dec_rows, pausable)
        rest = first_accepting(self.rest, other_rows, pausable)
        pre_samples, pre_hidden, prompt_logprobs, pre_rows_hidden = yield from rest.hidden_steps(other_rows, pausable)
        index = [decodes[i] for i in dec_samples] + [others[i] for i in pre_samples]
        order = sorted(range(len(index)), key=index.__getitem__)
        # Each sampling row's hidden rows: its last token's, and one per draft it verifies,
        # contiguous on either side; put back in scheduled order as blocks.
        width = [1 + rows[i][0].num_draft_tokens for i in index]
        start = [0] * len(index)
        for j in range(1, len(index)):
            start[j] = start[j - 1] + width[j - 1]
        rows_in_order = [start[j] + w for j in order for w in range(width[j])]
        hidden = torch.cat([dec_hidden, pre_hidden.to(dec_hidden.dtype)])[torch.tensor(rows_in_order, dtype=torch.long)]
        row_hidden = None
        if self.ctx.wants_row_hidden(rows):  # every token's, row blocks put back in scheduled order
            part = [n for _, n in dec_rows] + [n for _, n in other_rows]
            blocks = torch.cat([dec_rows_hidden, pre_rows_hidden.to(dec_rows_hidden.dtype)]).split(part)
            where = {row: j for j, row in enumerate(decodes + others)}
            row_hidden = torch.cat([blocks[where[i]] for i in range(len(rows))])
        return PathResult([index[i] for i in order], hidden, prompt_logprobs, row_hidden)
