"""The one piece of global state: the attention metadata of the step being run.

The model runner builds it once per step; every attention layer reads it. Passing it through
every module's forward would make model code unreadable, and there is only ever one step in
flight per process.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch


@dataclass
class AttentionGroup:
    """Requests attended together as one padded [R, Q] batch.

    Decodes (one query each) and prefill chunks go in separate groups: padded together, one
    1,280-token chunk would make 63 single-token decodes pay for 1,280 query rows each.
    Shapes: R requests, Q = the group's longest query, B = its most blocks, Tg its tokens.
    """

    token_index: torch.Tensor | None  # [Tg] flat tokens of the group; None: all of them, in order
    query_pad_index: torch.Tensor  # [R*Q] group token index for each padded query slot
    query_unpad_index: torch.Tensor  # [Tg] padded slot of each group token
    block_tables: torch.Tensor  # [R, B] each request's cache blocks, padded with block 0
    attn_mask: torch.Tensor  # [R, 1, Q, B*block_size] True where a query may attend
    num_reqs: int
    max_query_len: int

    @property
    def decode_only(self) -> bool:
        """Every request brings exactly one token: the flat batch already is the padded one."""
        return self.max_query_len == 1


@dataclass
class AttentionMetadata:
    """Where each token of a flat mixed batch (prefill chunks and decodes) reads and writes KV."""

    slot_mapping: torch.Tensor  # [T] cache slot each new token writes
    groups: list[AttentionGroup]
    num_tokens: int


_context: AttentionMetadata | None = None


@contextmanager
def set_forward_context(meta: AttentionMetadata) -> Iterator[None]:
    global _context
    prev, _context = _context, meta
    try:
        yield
    finally:
        _context = prev


def get_attention_metadata() -> AttentionMetadata:
    if _context is None:
        raise RuntimeError("attention called outside a model-runner step (no forward context set)")
    return _context
