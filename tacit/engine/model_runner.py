"""ModelRunner: a SchedulerOutput in, sampled tokens out.

It turns the step's requests into one flat batch (input_ids, positions, slot_mapping and the
attention metadata, built once per step in numpy rather than per layer or per request in
torch), runs the model, projects only the rows that sample, and calls the sampler.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from tacit.config import EngineConfig
from tacit.forward_context import (AttentionGroup, AttentionMetadata, has_layer_hook, layer_boundary,
                                   set_forward_context)
from tacit.kernels.cpu_fused_decode import build_fused_decoder
from tacit.layers.linear import select_linear_method, use_linear_method
from tacit.layers.sampler import Sampler, SamplerOutput
from tacit.memory.kv_cache_manager import KVCacheManager
from tacit.scheduling.request import Request
from tacit.scheduling.scheduler import SchedulerOutput

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


def kv_cache_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if hasattr(m, "allocate_kv_cache")]


class ModelRunner:
    def __init__(self, config: EngineConfig, model: nn.Module, device: torch.device, free_memory: int) -> None:
        self.config = config
        self.model = model
        self.device = device
        self.block_size = config.cache.block_size
        self.sampler = Sampler()
        kernels = None
        if device.type == "cpu" and config.model.dtype == torch.bfloat16:
            from tacit.kernels.cpu_kernels import load_cpu_kernels

            kernels = load_cpu_kernels()
        # Chosen once for the model: how its linear layers multiply.
        use_linear_method(model, select_linear_method(device.type, config.model.dtype))
        layers = kv_cache_layers(model)
        dtype = config.model.dtype
        self.bytes_per_block = self.block_size * sum(m.kv_numel_per_token() for m in layers) * dtype.itemsize
        self.num_blocks = self._num_blocks(free_memory)
        for m in layers:
            m.allocate_kv_cache(self.num_blocks, self.block_size, dtype, device)
        # Decode-only steps run as one C++ call when the model and CPU allow it.
        self.fused_decode = None
        if kernels is not None:
            self.fused_decode = build_fused_decoder(model, kernels, self.block_size, config.model.max_model_len)
        self.split_min_decodes = _SPLIT_MIN_DECODES

    def _num_blocks(self, free_memory: int) -> int:
        cache = self.config.cache
        if cache.num_kv_blocks is not None:
            return cache.num_kv_blocks
        budget = cache.kv_cache_memory or min(_DEFAULT_KV_BUDGET, free_memory // 2)
        num = budget // self.bytes_per_block
        # No point holding more than max_num_seqs full-length sequences.
        most = -(-self.config.model.max_model_len // self.block_size) * self.config.scheduler.max_num_seqs
        num = min(num, most)
        if num < 1:
            raise ValueError(f"kv_cache_memory={budget} bytes is below one KV block ({self.bytes_per_block} bytes)")
        return int(num)

    def _block_tables(self, scheduled: list[tuple[Request, int]], kv: KVCacheManager,
                      seq_lens: np.ndarray) -> np.ndarray:
        max_blocks = -(-int(seq_lens.max()) // self.block_size)
        tables = np.zeros((len(scheduled), max_blocks), dtype=np.int64)
        for i, (r, _) in enumerate(scheduled):
            t = kv.block_tables[r.request_id]
            tables[i, :len(t)] = t[:max_blocks]
        return tables

    def _group_requests(self, num_new: np.ndarray, computed: np.ndarray) -> list[np.ndarray]:
        """Decodes bucketed by context length (powers of two in blocks), prefills together.

        A padded group costs its longest context for every member: 64 decodes padded to one
        1,800-token context gathered 2.6 GB of KV per step (400 ms) on the long-tail benchmark.
        Power-of-two buckets bound that waste at 2x with at most ~8 groups, never one per request.
        """
        decodes = np.flatnonzero(num_new == 1)
        prefills = np.flatnonzero(num_new > 1)
        sets = []
        if len(decodes):
            blocks = -(-(computed[decodes] + 1) // self.block_size)
            bucket = np.ceil(np.log2(blocks)).astype(np.int64)
            sets += [decodes[bucket == b] for b in np.unique(bucket)]
        if len(prefills):
            sets.append(prefills)
        return sets

    def _group(self, reqs: np.ndarray, num_new: np.ndarray, computed: np.ndarray, tables: np.ndarray,
               req_of_token: np.ndarray | None) -> AttentionGroup:
        """Padded-batch indexes for the requests `reqs` (positions in the step's request list)."""
        bs = self.block_size
        n, c = num_new[reqs], computed[reqs]
        max_q = int(n.max())
        blocks = -(-int((c + n).max()) // bs)
        token_index = None
        if req_of_token is not None:
            token_index = torch.from_numpy(np.flatnonzero(np.isin(req_of_token, reqs))).to(self.device)
        if max_q > 1 and len(reqs) > 1 and int(n.sum()) * int((c + n).sum()) < len(reqs) * max_q * blocks * bs:
            return self._flat_group(reqs, n, c, tables, token_index)
        local_starts = np.zeros(len(reqs) + 1, dtype=np.int64)
        np.cumsum(n, out=local_starts[1:])
        # Padded query slots repeat the request's last real token; their rows are discarded.
        q_off = np.minimum(np.arange(max_q)[None, :], n[:, None] - 1)
        local_req = np.repeat(np.arange(len(reqs)), n)
        offset = np.arange(int(n.sum())) - local_starts[local_req]
        key_pos = np.arange(blocks * bs)
        mask = key_pos[None, None, :] <= (c[:, None] + q_off)[:, :, None]
        dev = self.device
        return AttentionGroup(
            token_index=token_index,
            query_pad_index=torch.from_numpy((local_starts[:-1, None] + q_off).reshape(-1)).to(dev),
            query_unpad_index=torch.from_numpy(local_req * max_q + offset).to(dev),
            block_tables=torch.from_numpy(np.ascontiguousarray(tables[reqs, :blocks])).to(dev),
            attn_mask=torch.from_numpy(mask).to(dev)[:, None],
            num_reqs=len(reqs), max_query_len=max_q)

    def _flat_group(self, reqs: np.ndarray, n: np.ndarray, c: np.ndarray, tables: np.ndarray,
                    token_index: torch.Tensor | None) -> AttentionGroup:
        """Prefills of very different lengths as one sequence: every token against every key of
        the group, masked to its own request. Padding to the longest chunk costs R x Qmax x Lmax;
        this costs sum(Q) x sum(L), far less when one long prompt shares a step with short ones
        (16 chunks, one of 1,280 tokens: 26M scores padded, 4M flat)."""
        bs = self.block_size
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
        dev = self.device
        ident = torch.arange(total, device=dev)
        return AttentionGroup(token_index=token_index, query_pad_index=ident, query_unpad_index=ident,
                              block_tables=torch.from_numpy(block_list[None, :]).to(dev),
                              attn_mask=torch.from_numpy(mask).to(dev)[None, None], num_reqs=1, max_query_len=total)

    def _build(self, scheduled: list[tuple[Request, int]], kv: KVCacheManager):
        bs = self.block_size
        num_new = np.array([n for _, n in scheduled], dtype=np.int64)
        computed = np.array([r.num_computed_tokens for r, _ in scheduled], dtype=np.int64)
        num_reqs, total = len(scheduled), int(num_new.sum())
        starts = np.zeros(num_reqs + 1, dtype=np.int64)
        np.cumsum(num_new, out=starts[1:])
        token_ids = np.fromiter(
            (t for (r, n), c in zip(scheduled, computed) for t in r.all_token_ids[c:c + n]), dtype=np.int64, count=total)
        req_of_token = np.repeat(np.arange(num_reqs), num_new)
        offset_in_query = np.arange(total) - starts[req_of_token]
        positions = computed[req_of_token] + offset_in_query
        tables = self._block_tables(scheduled, kv, computed + num_new)
        slot_mapping = tables[req_of_token, positions // bs] * bs + positions % bs
        groups = [self._group(reqs, num_new, computed, tables, req_of_token if len(sets) > 1 else None)
                  for sets in [self._group_requests(num_new, computed)] for reqs in sets]
        meta = AttentionMetadata(slot_mapping=torch.from_numpy(slot_mapping).to(self.device), groups=groups,
                                 num_tokens=total)
        # A request samples when this step brings it level with all its tokens (not mid-prefill).
        samples = [i for i, ((r, n), c) in enumerate(zip(scheduled, computed)) if c + n == r.num_tokens]
        sample_rows = starts[1:][samples] - 1
        dev = self.device
        return (torch.from_numpy(token_ids).to(dev), torch.from_numpy(positions).to(dev), meta,
                samples, torch.from_numpy(sample_rows).to(dev))

    def _fused_decode_hidden(self, scheduled: list[tuple[Request, int]], kv: KVCacheManager) -> torch.Tensor:
        """Final hidden states of a decode-only step, from one C++ call."""
        bs = self.block_size
        positions = [r.num_computed_tokens for r, _ in scheduled]
        token_ids = [r.all_token_ids[p] for (r, _), p in zip(scheduled, positions)]
        width = max(positions) // bs + 1
        tables = []
        for r, _ in scheduled:
            t = kv.block_tables[r.request_id][:width]
            tables.append(t + [0] * (width - len(t)))
        ids, pos, tables = torch.tensor(token_ids), torch.tensor(positions), torch.tensor(tables)
        if len(scheduled) < _CUT_IN_MIN_ROWS or not has_layer_hook():
            return self.fused_decode.forward(ids, pos, tables)
        # Layer by layer, so an urgent prefill can cut in at a layer boundary
        # (Scheduler.schedule_cut_in, LLMEngine.cut_in_step).
        x = self.fused_decode.embed(ids)
        for layer in range(self.fused_decode.num_layers):
            if layer:
                layer_boundary()
            self.fused_decode.run_layers(x, pos, tables, layer, layer + 1)
        return self.fused_decode.final_norm(x)

    def _uses_fused_decode(self, scheduled: list[tuple[Request, int]]) -> bool:
        return self.fused_decode is not None and all(n == 1 for _, n in scheduled)

    def _splits_mixed_step(self, scheduled: list[tuple[Request, int]]) -> bool:
        """Whether a step with prefill chunks sends its one-token rows through the fused decoder.

        In a mixed step the torch path gathers every decode row's KV into padded copies and runs
        SDPA over them; the fused decoder reads the cache in place. Running the step as two
        forwards (fused decodes, torch prefills) pays once enough decodes ride along.
        """
        if self.fused_decode is None:
            return False
        return sum(n == 1 for _, n in scheduled) >= self.split_min_decodes

    def _fused_part(self, scheduled: list[tuple[Request, int]], kv: KVCacheManager) -> tuple[list[int], torch.Tensor]:
        hidden = self._fused_decode_hidden(scheduled, kv)
        # A one-token step can also be the last prompt token of a chunked prefill that is
        # not yet level with its request (only those level with all their tokens sample).
        samples = [i for i, (r, _) in enumerate(scheduled) if r.num_computed_tokens + 1 == r.num_tokens]
        return samples, hidden if len(samples) == len(scheduled) else hidden[samples]

    def _torch_part(self, scheduled: list[tuple[Request, int]], kv: KVCacheManager) -> tuple[list[int], torch.Tensor]:
        input_ids, positions, meta, samples, sample_rows = self._build(scheduled, kv)
        with set_forward_context(meta):
            hidden = self.model(input_ids, positions)
        return samples, hidden[sample_rows]

    def _split_part(self, scheduled: list[tuple[Request, int]], kv: KVCacheManager) -> tuple[list[int], torch.Tensor]:
        """One-token rows through the fused decoder, the rest through torch, rows back in
        scheduled order. The two forwards write the KV slots of disjoint requests."""
        decodes = [i for i, (_, n) in enumerate(scheduled) if n == 1]
        prefills = [i for i, (_, n) in enumerate(scheduled) if n > 1]
        dec_samples, dec_hidden = self._fused_part([scheduled[i] for i in decodes], kv)
        pre_samples, pre_hidden = self._torch_part([scheduled[i] for i in prefills], kv)
        index = [decodes[i] for i in dec_samples] + [prefills[i] for i in pre_samples]
        order = sorted(range(len(index)), key=index.__getitem__)
        hidden = torch.cat([dec_hidden, pre_hidden.to(dec_hidden.dtype)])[torch.tensor(order, dtype=torch.long)]
        return [index[i] for i in order], hidden

    @torch.inference_mode()
    def compute_logits(self, out: SchedulerOutput, kv: KVCacheManager) -> tuple[list[Request], torch.Tensor | None]:
        """Run the step's forward: (requests that sample, their logits); writes this step's KV."""
        if not out.scheduled:
            return [], None
        if self._uses_fused_decode(out.scheduled):
            samples, hidden = self._fused_part(out.scheduled, kv)
        elif self._splits_mixed_step(out.scheduled):
            samples, hidden = self._split_part(out.scheduled, kv)
        else:
            samples, hidden = self._torch_part(out.scheduled, kv)
        if not samples:
            return [], None
        return [out.scheduled[i][0] for i in samples], self.model.compute_logits(hidden)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, kv: KVCacheManager) -> tuple[list[Request], SamplerOutput | None]:
        requests, logits = self.compute_logits(out, kv)
        if logits is None:
            return [], None
        return requests, self.sampler(logits, requests)
