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
from tacit.forward_context import has_layer_hook, layer_boundary, set_forward_context
from tacit.layers.attention_selector import select_attention_backend
from tacit.layers.kv_cache import KVCacheLayer
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


def kv_cache_layers(model: nn.Module) -> list[KVCacheLayer]:
    return [m for m in model.modules() if isinstance(m, KVCacheLayer)]


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
        # Chosen once for the model: how its linear layers multiply, which backend attends.
        use_linear_method(model, select_linear_method(device.type, config.model.dtype))
        self.attn_backend = select_attention_backend(device.type, config.model.dtype, config.model)
        layers = kv_cache_layers(model)
        for m in layers:
            m.set_attention_backend(self.attn_backend)
        dtype = config.model.dtype
        self.bytes_per_block = self.block_size * sum(m.kv_numel_per_token() for m in layers) * dtype.itemsize
        self.num_blocks = self._num_blocks(free_memory)
        for m in layers:
            m.allocate_kv_cache(self.num_blocks, self.block_size, dtype, device)
        # Decode-only steps run as one C++ call when the model and CPU allow it.
        self.fused_decode = None
        build_fused_decoder = getattr(model, "build_fused_decoder", None)
        if kernels is not None and build_fused_decoder is not None:
            self.fused_decode = build_fused_decoder(kernels, self.block_size, config.model.max_model_len)
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
        meta = self.attn_backend.build_metadata(num_new, computed, tables, slot_mapping, self.device, bs)
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
