"""Plain-torch paged attention: the reference every faster backend is checked against.

It gathers each request's blocks out of the pool into a padded [R, B*block_size] batch and
runs one SDPA call with a causal/length mask, so a step costs one kernel launch per layer
however many requests it holds. Gathering whole blocks (16 rows, 6 KB each for SmolLM2's
K) instead of single slots turns L small copies into L/16 large ones. It still copies the
whole context each step; a decode kernel that reads blocks in place is the later step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from tacit.kernels.attention_backend import AttentionBackend, AttentionMetadata, register_attention_backend
from tacit.kernels.kv_quant import gather_paged_int8, write_paged_int8


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
    # [R] each request's query position, for decode-only groups: what a kernel reading the
    # cache in place needs instead of the padded mask.
    decode_positions: torch.Tensor | None = None
    # What a sliding window's variant of the group is built from (numpy): the requests' new and
    # computed token counts and their block tables; a flat group's key range per query instead.
    num_new: np.ndarray | None = None
    computed: np.ndarray | None = None
    tables: np.ndarray | None = None
    flat_keys: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # (key, lo, q_pos)
    block_size: int = 0
    _windows: dict[int, AttentionGroup] = field(default_factory=dict, repr=False)

    def windowed(self, window: int) -> AttentionGroup:
        """This group as a layer with a sliding window of `window` tokens sees it: a query at
        position p attends to keys p - window + 1 .. p (transformers' sliding_window). Built once
        a step per window, on the first layer that asks. A padded group gathers only the blocks
        the window reaches: at 32k context and a 128-token window that is 9 blocks of 2,048."""
        got = self._windows.get(window)
        if got is None:
            got = self._windows[window] = (
                _flat_window(self, window) if self.flat_keys is not None else _padded_window(self, window)
            )
        return got

    @property
    def decode_only(self) -> bool:
        """Every request brings exactly one token: the flat batch already is the padded one."""
        return self.max_query_len == 1


@dataclass
class TorchAttentionMetadata(AttentionMetadata):
    """Where each token of a flat mixed batch (prefill chunks and decodes) reads and writes KV."""

    groups: list[AttentionGroup]


def group_requests(num_new: np.ndarray, computed: np.ndarray, block_size: int) -> list[np.ndarray]:
    """Decodes bucketed by context length (powers of two in blocks), prefills together.

    A padded group costs its longest context for every member: 64 decodes padded to one
    1,800-token context gathered 2.6 GB of KV per step (400 ms) on the long-tail benchmark.
    Power-of-two buckets bound that waste at 2x with at most ~8 groups, never one per request.
    """
    decodes = np.flatnonzero(num_new == 1)
    prefills = np.flatnonzero(num_new > 1)
    sets = []
    if len(decodes):
        blocks = -(-(computed[decodes] + 1) // block_size)
        bucket = np.ceil(np.log2(blocks)).astype(np.int64)
        sets += [decodes[bucket == b] for b in np.unique(bucket)]
    if len(prefills):
        sets.append(prefills)
    return sets


def runs_flat(n: np.ndarray, c: np.ndarray, max_q: int, keys: int) -> bool:
    """Whether a group of several prefill chunks (n new tokens on c cached each; its longest
    chunk max_q, its most blocks `keys` keys) runs flat (build_flat_group: sum(n) x sum(c + n)
    scores) rather than padded (len(n) x max_q x keys): whichever scores fewer."""
    return max_q > 1 and len(n) > 1 and int(n.sum()) * int((c + n).sum()) < len(n) * max_q * keys


def build_group(
    reqs: np.ndarray,
    num_new: np.ndarray,
    computed: np.ndarray,
    tables: np.ndarray,
    req_of_token: np.ndarray | None,
    device: torch.device,
    block_size: int,
) -> AttentionGroup:
    """Padded-batch indexes for the requests `reqs` (positions in the step's request list)."""
    bs = block_size
    n, c = num_new[reqs], computed[reqs]
    max_q = int(n.max())
    blocks = -(-int((c + n).max()) // bs)
    token_index = None
    if req_of_token is not None:
        token_index = torch.from_numpy(np.flatnonzero(np.isin(req_of_token, reqs))).to(device)
    if runs_flat(n, c, max_q, blocks * bs):
        return build_flat_group(reqs, n, c, tables, token_index, device, block_size)
    local_starts = np.zeros(len(reqs) + 1, dtype=np.int64)
    np.cumsum(n, out=local_starts[1:])
    # Padded query slots repeat the request's last real token; their rows are discarded.
    q_off = np.minimum(np.arange(max_q)[None, :], n[:, None] - 1)
    local_req = np.repeat(np.arange(len(reqs)), n)
    offset = np.arange(int(n.sum())) - local_starts[local_req]
    key_pos = np.arange(blocks * bs)
    mask = key_pos[None, None, :] <= (c[:, None] + q_off)[:, :, None]
    dev = device
    return AttentionGroup(
        token_index=token_index,
        query_pad_index=torch.from_numpy((local_starts[:-1, None] + q_off).reshape(-1)).to(dev),
        query_unpad_index=torch.from_numpy(local_req * max_q + offset).to(dev),
        block_tables=torch.from_numpy(np.ascontiguousarray(tables[reqs, :blocks])).to(dev),
        attn_mask=torch.from_numpy(mask).to(dev)[:, None],
        num_reqs=len(reqs),
        max_query_len=max_q,
        decode_positions=torch.from_numpy(np.ascontiguousarray(c)).to(dev) if max_q == 1 else None,
        num_new=n,
        computed=c,
        tables=tables[reqs],
        block_size=bs,
    )


def _padded_window(g: AttentionGroup, window: int) -> AttentionGroup:
    """Each request's table from the block holding its first query's first key in the window."""
    bs, n, c = g.block_size, g.num_new, g.computed
    first = np.maximum(c - window + 1, 0) // bs  # [R] first block any of its queries needs
    last = -(-(c + n) // bs)  # [R] blocks through its last query
    nb = int((last - first).max())
    cols = first[:, None] + np.arange(nb)[None, :]
    valid = cols < last[:, None]
    tables = np.where(valid, np.take_along_axis(g.tables, np.minimum(cols, g.tables.shape[1] - 1), 1), 0)
    q_off = np.minimum(np.arange(g.max_query_len)[None, :], n[:, None] - 1)
    q_pos = (c[:, None] + q_off)[:, :, None]  # [R, Q, 1]
    key_pos = (first[:, None] * bs + np.arange(nb * bs)[None, :])[:, None, :]  # [R, 1, L]
    mask = (key_pos <= q_pos) & (key_pos > q_pos - window)
    dev = g.block_tables.device
    return AttentionGroup(
        token_index=g.token_index,
        query_pad_index=g.query_pad_index,
        query_unpad_index=g.query_unpad_index,
        block_tables=torch.from_numpy(np.ascontiguousarray(tables)).to(dev),
        attn_mask=torch.from_numpy(mask).to(dev)[:, None],
        num_reqs=g.num_reqs,
        max_query_len=g.max_query_len,
    )


def _flat_window(g: AttentionGroup, window: int) -> AttentionGroup:
    """A flat group keeps its keys; each query's range starts at most window - 1 before it."""
    key, lo, q_pos = g.flat_keys
    start = lo + np.maximum(q_pos - window + 1, 0)
    mask = (key[None, :] >= start[:, None]) & (key[None, :] <= (lo + q_pos)[:, None])
    return AttentionGroup(
        token_index=g.token_index,
        query_pad_index=g.query_pad_index,
        query_unpad_index=g.query_unpad_index,
        block_tables=g.block_tables,
        attn_mask=torch.from_numpy(mask).to(g.block_tables.device)[None, None],
        num_reqs=1,
        max_query_len=g.max_query_len,
    )


def build_flat_group(
    reqs: np.ndarray,
    n: np.ndarray,
    c: np.ndarray,
    tables: np.ndarray,
    token_index: torch.Tensor | None,
    device: torch.device,
    block_size: int,
) -> AttentionGroup:
    """Prefills of very different lengths as one sequence: every token against every key of
    the group, masked to its own request. Padding to the longest chunk costs R x Qmax x Lmax;
    this costs sum(Q) x sum(L), far less when one long prompt shares a step with short ones
    (16 chunks, one of 1,280 tokens: 26M scores padded, 4M flat)."""
    bs = block_size
    req_blocks = -(-(c + n) // bs)
    sub = tables[reqs]
    block_list = sub[np.arange(sub.shape[1])[None, :] < req_blocks[:, None]]  # row-major: request order
    key_start = np.zeros(len(reqs) + 1, dtype=np.int64)
    np.cumsum(req_blocks * bs, out=key_start[1:])
    local_req = np.repeat(np.arange(len(reqs)), n)
    starts = np.zeros(len(reqs) + 1, dtype=np.int64)
    np.cumsum(n, out=starts[1:])
    q_pos = c[local_req] + np.arange(int(n.sum())) - starts[local_req]  # position within its request
    key = np.arange(int(key_start[-1]))
    lo, hi = key_start[local_req], key_start[local_req] + q_pos
    mask = (key[None, :] >= lo[:, None]) & (key[None, :] <= hi[:, None])
    total = int(n.sum())
    dev = device
    ident = torch.arange(total, device=dev)
    return AttentionGroup(
        token_index=token_index,
        query_pad_index=ident,
        query_unpad_index=ident,
        block_tables=torch.from_numpy(block_list[None, :]).to(dev),
        attn_mask=torch.from_numpy(mask).to(dev)[None, None],
        num_reqs=1,
        max_query_len=total,
        flat_keys=(key, lo, q_pos),
    )


def build_torch_metadata(
    num_new_tokens: np.ndarray,
    num_computed_tokens: np.ndarray,
    block_tables: np.ndarray,
    slot_mapping: np.ndarray,
    device: torch.device,
    block_size: int,
) -> TorchAttentionMetadata:
    """The step's requests split into padded groups (group_requests), their indexes built once
    per step in numpy rather than per layer or per request in torch."""
    num_new, computed = num_new_tokens, num_computed_tokens
    sets = group_requests(num_new, computed, block_size)
    req_of_token = np.repeat(np.arange(len(num_new)), num_new) if len(sets) > 1 else None
    groups = [build_group(reqs, num_new, computed, block_tables, req_of_token, device, block_size) for reqs in sets]
    return TorchAttentionMetadata(
        slot_mapping=torch.from_numpy(slot_mapping).to(device), num_tokens=int(num_new.sum()), groups=groups
    )


def gather_blocks(cache: torch.Tensor, group: AttentionGroup) -> torch.Tensor:
    """[blocks, block_size, ...] -> [R, B*block_size, ...]: each request's context in order."""
    # index_select over whole rows is a memcpy per block: 30 us for 16 requests x 13 blocks of
    # SmolLM2's K here, against 143 us for the same gather as advanced indexing.
    r, b = group.block_tables.shape
    rows = torch.index_select(cache.reshape(cache.shape[0], -1), 0, group.block_tables.reshape(-1))
    return rows.view(r, b * cache.shape[1], *cache.shape[2:])


def pad_queries(x: torch.Tensor, group: AttentionGroup) -> torch.Tensor:
    """[T, ...] -> [R, Q, ...]."""
    if group.decode_only:
        return x.unsqueeze(1)
    return x[group.query_pad_index].view(group.num_reqs, group.max_query_len, *x.shape[1:])


def unpad_queries(x: torch.Tensor, group: AttentionGroup) -> torch.Tensor:
    """[R, Q, ...] -> [T, ...]."""
    if group.decode_only:
        return x.squeeze(1)
    return x.reshape(group.num_reqs * group.max_query_len, *x.shape[2:])[group.query_unpad_index]


def padded_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: AttentionGroup,
    scale: float,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, H, D], k/v [R, L, Hkv, D*] -> [T, H, Dv]. sinks [H]: a learned logit per head
    that joins each query's softmax and adds nothing to its output (gpt-oss)."""
    qp = pad_queries(q, group).transpose(1, 2)
    k, v, mask = k.transpose(1, 2), v.transpose(1, 2), group.attn_mask
    if sinks is not None:
        # The sink as one more key: k = 0 and v = 0, its score the additive bias sinks[h], so
        # SDPA's own softmax includes it and the output gains nothing from it.
        k, v = F.pad(k, (0, 0, 0, 1)), F.pad(v, (0, 0, 0, 1))
        bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))
        sink = sinks.to(q.dtype).view(1, -1, 1, 1).expand(bias.shape[0], -1, bias.shape[2], 1)
        mask = torch.cat([bias.expand(-1, sink.shape[1], -1, -1), sink], dim=-1)
    out = F.scaled_dot_product_attention(qp, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return unpad_queries(out.transpose(1, 2), group)


def run_groups(
    query: torch.Tensor,
    meta: TorchAttentionMetadata,
    out_dim: int,
    attend: Callable[[torch.Tensor, AttentionGroup], torch.Tensor],
) -> torch.Tensor:
    """attend(group queries, group) per group (at most two: decodes, prefills), scattered back."""
    if len(meta.groups) == 1 and meta.groups[0].token_index is None:
        return attend(query, meta.groups[0])
    out = query.new_empty(query.shape[0], query.shape[1], out_dim)
    for g in meta.groups:
        out[g.token_index] = attend(query[g.token_index], g)
    return out


class TorchMetadataBackend:
    """What the torch backends share: plain torch ops (any device, any float dtype) over the
    padded-group metadata above. Mixed into the paged and the MLA backend."""

    @classmethod
    def supports(cls, platform: str, dtype: torch.dtype) -> bool:
        return dtype.is_floating_point  # plain torch ops: any device torch runs on

    def build_metadata(
        self,
        num_new_tokens: np.ndarray,
        num_computed_tokens: np.ndarray,
        block_tables: np.ndarray,
        slot_mapping: np.ndarray,
        device: torch.device,
        block_size: int,
    ) -> TorchAttentionMetadata:
        return build_torch_metadata(num_new_tokens, num_computed_tokens, block_tables, slot_mapping, device, block_size)


@register_attention_backend("torch_paged")
class TorchAttentionBackend(TorchMetadataBackend, AttentionBackend):
    priority = 100  # the reference: chosen when nothing faster supports the platform

    def write_kv(
        self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, meta: TorchAttentionMetadata
    ) -> None:
        if kv_cache.dtype == torch.int8:
            write_paged_int8(kv_cache, meta.slot_mapping, key, value)
            return
        flat = kv_cache.view(2, -1, *kv_cache.shape[3:])
        flat[0].index_copy_(0, meta.slot_mapping, key.to(kv_cache.dtype))
        flat[1].index_copy_(0, meta.slot_mapping, value.to(kv_cache.dtype))

    def forward(
        self,
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: TorchAttentionMetadata,
        scale: float,
        *,
        sliding_window: int | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        quantized = kv_cache.dtype == torch.int8
        head_dim = query.shape[-1]

        def attend(q: torch.Tensor, g: AttentionGroup) -> torch.Tensor:
            if sliding_window is not None:
                g = g.windowed(sliding_window)
            if quantized:
                k, v = gather_paged_int8(kv_cache, g.block_tables, head_dim, q.dtype)
            else:
                k, v = gather_blocks(kv_cache[0], g).to(q.dtype), gather_blocks(kv_cache[1], g).to(q.dtype)
            return padded_sdpa(q, k, v, g, scale, sinks)

        return run_groups(query, meta, query.shape[-1], attend)
