"""The fused C++ decode step (kernels/cpu_fused_decode.py): a decode-only step of one-token rows
(and of verify rows, each as its tokens' rows) in one call, or one call per layer when the step
is long enough for urgent work to cut in.

A verify row of k drafts costs the decoder k + 1 rows: the GEMVs read each weight once for up to
kMaxSkinnyRows (8) rows, so at batch 1 verifying 4 drafts reads the same bytes as one token."""

from __future__ import annotations

import torch

from tacit.worker.input_batch import Rows, decode_row_sampled, fusable, samples
from tacit.worker.paths.base import (
    HiddenStatesPath,
    PathContext,
    PathResult,
    Steps,
    register_execution_path,
    run_layers,
)

# Below this many rows a fused decode step is short (~11 ms at 1 row, ~40 ms at 8 on the default
# model) and runs as one call; above, one call per layer (~20 us each) lets urgent work cut in.
CUT_IN_MIN_ROWS = 8


def fused_decode_hidden(ctx: PathContext, rows: Rows, pausable: bool) -> Steps[torch.Tensor]:
    """Final hidden states of decode rows, from the C++ decoder: a row that verifies k drafts
    runs as k + 1 rows (its last token, then each draft, at their positions over the same
    blocks), every row's hidden states kept, sampling or not."""
    bs = ctx.block_size
    positions, token_ids, owners = [], [], []
    for r, n in rows:
        p = r.num_computed_tokens
        positions.extend(range(p, p + n))
        token_ids.extend(r.token_ids[p : p + n])
        owners.extend([r] * n)
    width = max(positions, default=0) // bs + 1  # no rows: a data-parallel rank with none
    tables = []
    for r in owners:
        t = r.block_ids[0][:width]  # fused decoders bind models of one KV cache group
        tables.append(t + [0] * (width - len(t)))
    ids = torch.tensor(token_ids, dtype=torch.long)
    pos = torch.tensor(positions, dtype=torch.long)
    tables = torch.tensor(tables, dtype=torch.long).reshape(len(owners), width)
    fused = ctx.fused_decode
    # A short step runs as one call: a boundary costs more than it saves.
    pausable = pausable and len(owners) >= CUT_IN_MIN_ROWS
    x = fused.embed(ids)
    yield from run_layers(lambda begin, end: fused.run_layers(x, pos, tables, begin, end), fused.num_layers, pausable)
    return fused.final_norm(x)


@register_execution_path("fused_decode")
class FusedDecodePath(HiddenStatesPath):
    preference = 10
    exports_row_hidden = True

    def accepts(self, rows: Rows, pausable: bool) -> bool:
        return self.ctx.fused_decode is not None and all(fusable(r, n) for r, n in rows)

    def hidden_steps(self, rows: Rows, pausable: bool) -> Steps[PathResult]:
        hidden = yield from fused_decode_hidden(self.ctx, rows, pausable)
        # A one-token step can also be the last prompt token of a chunked prefill that is
        # not yet level with its request (only those level with all their tokens sample).
        sampling = [i for i, (r, n) in enumerate(rows) if samples(r, n)]
        kept = decode_row_sampled(rows)
        row_hidden = hidden if self.ctx.wants_row_hidden(rows) else None
        return PathResult(sampling, hidden if len(kept) == hidden.shape[0] else hidden[kept], {}, row_hidden)
