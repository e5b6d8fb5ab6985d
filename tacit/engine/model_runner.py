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
from tacit.forward_context import AttentionMetadata, set_forward_context
from tacit.layers.sampler import Sampler, SamplerOutput
from tacit.memory.kv_cache_manager import KVCacheManager
from tacit.scheduling.request import Request
from tacit.scheduling.scheduler import SchedulerOutput

_DEFAULT_KV_BUDGET = 2 << 30  # 2 GiB, capped by what the batch limits could ever use


def kv_cache_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if hasattr(m, "allocate_kv_cache")]


class ModelRunner:
    def __init__(self, config: EngineConfig, model: nn.Module, device: torch.device, free_memory: int) -> None:
        self.config = config
        self.model = model
        self.device = device
        self.block_size = config.cache.block_size
        self.sampler = Sampler()
        if device.type == "cpu" and config.model.dtype == torch.bfloat16:
            from tacit.kernels.cpu_gemv import load_gemv_kernel
            from tacit.layers.linear import enable_bf16_gemv

            enable_bf16_gemv(load_gemv_kernel())
        layers = kv_cache_layers(model)
        dtype = config.model.dtype
        self.bytes_per_block = self.block_size * sum(m.kv_numel_per_token() for m in layers) * dtype.itemsize
        self.num_blocks = self._num_blocks(free_memory)
        for m in layers:
            m.allocate_kv_cache(self.num_blocks, self.block_size, dtype, device)

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
        seq_lens = computed + num_new
        max_q, max_len = int(num_new.max()), int(seq_lens.max())
        max_blocks = -(-max_len // bs)
        tables = np.zeros((num_reqs, max_blocks), dtype=np.int64)
        for i, (r, _) in enumerate(scheduled):
            t = kv.block_tables[r.request_id]
            tables[i, :len(t)] = t[:max_blocks]
        slot_mapping = tables[req_of_token, positions // bs] * bs + positions % bs
        # Padded query slots repeat the request's last real token; their rows are discarded.
        q_off = np.minimum(np.arange(max_q)[None, :], num_new[:, None] - 1)
        query_pad_index = (starts[:-1, None] + q_off).reshape(-1)
        query_unpad_index = req_of_token * max_q + offset_in_query
        key_pos = np.arange(max_blocks * bs)
        q_pos = computed[:, None] + q_off
        mask = key_pos[None, None, :] <= q_pos[:, :, None]

        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.from_numpy(slot_mapping).to(dev),
            query_pad_index=torch.from_numpy(query_pad_index).to(dev),
            query_unpad_index=torch.from_numpy(query_unpad_index).to(dev),
            block_tables=torch.from_numpy(tables).to(dev),
            attn_mask=torch.from_numpy(mask).to(dev)[:, None],
            num_reqs=num_reqs, max_query_len=max_q, max_seq_len=max_len,
        )
        # A request samples when this step brings it level with all its tokens (not mid-prefill).
        samples = [i for i, ((r, n), c) in enumerate(zip(scheduled, computed)) if c + n == r.num_tokens]
        sample_rows = starts[1:][samples] - 1
        return (torch.from_numpy(token_ids).to(dev), torch.from_numpy(positions).to(dev), meta,
                samples, torch.from_numpy(sample_rows).to(dev))

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, kv: KVCacheManager) -> tuple[list[Request], SamplerOutput | None]:
        if not out.scheduled:
            return [], None
        input_ids, positions, meta, samples, sample_rows = self._build(out.scheduled, kv)
        with set_forward_context(meta):
            hidden = self.model(input_ids, positions)
        if not samples:
            return [], None
        logits = self.model.compute_logits(hidden[sample_rows])
        requests = [out.scheduled[i][0] for i in samples]
        return requests, self.sampler(logits, requests)
