"""ModelRunner: a SchedulerOutput in, a ModelRunnerOutput out.

The step, in order: apply the step's request changes to this rank's own per-request state
(request_state.py, from the plain data the scheduler sends); carry out swap copies; take the
first execution path that accepts the step's rows (paths/: data-parallel attention, the fused
C++ decode step, a mixed step split between it and torch, two overlapping micro-batches, the
torch reference), which builds its input batch (input_batch.py), runs the decoder layers itself
(so work can run between two of them: a cut-in prefill) and projects only the rows that sample;
then sample. The KV pool is sized once at load from the specs the attention backend declares
for each layer (kv_allocation.py), and answered to the engine as a KVCacheConfig.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from tacit.config import EngineConfig, fit_kv_capacity
from tacit.distributed.communicator import Communicator
from tacit.kernels.kv_quant import parse_kv_cache_dtype
from tacit.kv_cache_interface import KVCacheConfig, bytes_per_block_of, capacity_tokens_of, sliding_windows_of
from tacit.layers.linear import (
    communication_seconds,
    hidden_communication_seconds,
    use_communicator,
)
from tacit.layers.sampler import Sampler
from tacit.models.expert_streaming import stream_experts
from tacit.outputs import ModelRunnerOutput
from tacit.scheduling.scheduler_output import SchedulerOutput
from tacit.worker.drafter import DraftProposer
from tacit.worker.input_batch import PromptScores, Rows, has_pooling
from tacit.worker.kernel_binding import bind_attention_backend, bind_compute_kernels, load_kernels
from tacit.worker.kv_allocation import allocate_kv_caches, kv_cache_groups, num_kv_blocks
from tacit.worker.kv_offload_store import KVOffloadId, make_kv_offload_store
from tacit.worker.paths import PathContext, PathResult
from tacit.worker.paths.base import ExecutionPath, Steps, build_paths, finish, first_accepting
from tacit.worker.paths.fused_binders import build_fused_decoder, fused_decoder_unsupported_reason
from tacit.worker.pooler import PoolState, pool_rows
from tacit.worker.request_state import CachedRequestState, update_request_states
from tacit.worker.sample_step import sample_and_verify
from tacit.worker.swap_store import KVSwapStore


def why_not_fused(device_type: str, dtype: torch.dtype, kernels, model: nn.Module) -> str:
    """Why decode steps run on the torch path rather than the fused C++ step."""
    if device_type != "cpu":
        return f"device {device_type}: the fused step is the CPU's"
    if dtype != torch.bfloat16:
        return f"dtype {str(dtype).removeprefix('torch.')}: the fused step runs bfloat16"
    if kernels is None:
        return "the CPU kernels are not loaded: no AVX512-BF16, or cpu_kernels off"
    return fused_decoder_unsupported_reason(model) or "the model's shapes: see the message above"


class ModelRunner:
    def __init__(
        self,
        config: EngineConfig,
        model: nn.Module,
        device: torch.device,
        free_memory: int,
        comm: Communicator | None = None,
        agree_num_blocks: Callable[[int], int] | None = None,
        kv_offload_id: KVOffloadId | None = None,
    ) -> None:
        """comm: the tensor-parallel group's communicator (one rank of several); agree_num_blocks
        turns this rank's KV block count into the one every rank uses (the smallest);
        kv_offload_id: who this rank is to the prefix cache's second tier, when there is one."""
        self.config = config
        self.model = model
        self.device = device
        self.block_size = config.cache.block_size
        self.sampler = Sampler()
        self.execute_seconds = 0.0  # execute_s summed since load (rank_stats)
        int8_activations = not config.model.ggml_bf16_activations
        kernels = load_kernels(config.model, device)
        # Chosen once for the model: how its linear layers multiply, which kernel runs its
        # experts (then, below, which backend attends).
        bind_compute_kernels(model, config.model, device)
        if comm is not None:
            use_communicator(model, comm)
        # MoE experts read from the checkpoint through a cache, when they do not all fit.
        self.expert_cache = None
        if config.model.expert_cache_memory is not None:
            self.expert_cache = stream_experts(
                model,
                Path(config.model.path),
                config.model.expert_cache_memory,
                config.scheduler.max_num_batched_tokens,
                config.model.dtype,
            )
        self.attn_backend, layers = bind_attention_backend(model, config.model, device)
        # --kv-cache-dtype parsed once; from here on it lives in each layer's spec.
        dtype = parse_kv_cache_dtype(config.cache.cache_dtype, config.model.dtype)
        groups = kv_cache_groups(layers, self.block_size, dtype)
        bytes_per_block = bytes_per_block_of(groups)
        # This rank's KV blocks in host memory while their request is swapped out (every rank
        # holds its own shard; the scheduler's SwapOps say what to copy).
        self.swap_store = KVSwapStore(list(layers.values())) if config.cache.swap_space > 0 else None
        self.num_blocks = num_kv_blocks(config, bytes_per_block, groups, free_memory)
        if agree_num_blocks is not None:
            # Every rank's scheduler-side block ids index its own pool: all pools are one size.
            self.num_blocks = agree_num_blocks(self.num_blocks)
        chunk = config.scheduler.max_num_batched_tokens
        self.config = config = fit_kv_capacity(
            config, capacity_tokens_of(sliding_windows_of(groups), self.block_size, self.num_blocks, chunk)
        )
        allocate_kv_caches(layers, groups, self.num_blocks, device)
        swap_bytes_per_s = None
        if self.swap_store is not None:
            probe = min(self.num_blocks, 4)  # one timed copy: the first cost comparison's bandwidth
            swap_bytes_per_s = probe * bytes_per_block / max(self.swap_store.probe(probe), 1e-9)
        # The prefix cache's second tier: blocks evicted from the pool, kept below it.
        self.kv_offload_store = (
            make_kv_offload_store(config.cache, list(layers.values()), kv_offload_id) if kv_offload_id else None
        )
        parallel = config.parallel
        # What this rank answers the engine (Executor.kv_cache_config): the engine reads nothing else of the pool.
        self.kv_cache_config = KVCacheConfig(
            num_blocks=self.num_blocks,
            kv_cache_groups=groups,
            max_model_len=config.model.max_model_len,
            # Data-parallel attention: one pool of num_blocks per rank, each request in one of them.
            num_pools=parallel.tensor_parallel_size if parallel.data_parallel_attention and comm is not None else 1,
            max_chunk_tokens=chunk,
            swap_bytes_per_s=swap_bytes_per_s,
            offloaded_block_hashes=tuple(self.kv_offload_store.held()) if self.kv_offload_store else (),
        )
        # Decode-only steps run as one C++ call when the model and CPU allow it.
        # Its rope tables cover every position a sequence can reach: no more than the pool
        # holds, even when an explicit max_model_len is longer.
        positions = min(config.model.max_model_len, self.num_blocks * self.block_size)
        fused_decode = build_fused_decoder(model, kernels, self.block_size, positions, int8_activations)
        # What runs a decode step, for the start-up line: users ask why a model decodes slowly.
        self.decode_path = (
            "fused C++ decode step"
            if fused_decode is not None
            else f"torch path ({why_not_fused(device.type, config.model.dtype, kernels, model)})"
        )
        self.paths_context = PathContext(
            model=model,
            device=device,
            block_size=self.block_size,
            attn_backend=self.attn_backend,
            vocab_size=config.model.hf["vocab_size"],
            fused_decode=fused_decode,
            comm=comm,
            # Torch-path steps of 2+ requests run as two overlapping micro-batches (tensor parallel).
            two_batch_overlap=config.parallel.two_batch_overlap and comm is not None,
            # Data-parallel attention: this rank runs only the rows of the requests placed on it.
            data_parallel=config.parallel.data_parallel_attention and comm is not None,
            # MTP drafts from every token's final hidden states: every rank builds the same paths.
            keep_row_hidden=config.speculative is not None and config.speculative.uses_target_hidden_states,
        )
        self.paths: list[ExecutionPath] = build_paths(self.paths_context)
        self.requests: dict[str, CachedRequestState] = {}
        # Embedding requests mid-prefill: their pools so far (worker/pooler.py).
        self.pool_states: dict[str, PoolState] = {}
        # Speculative decoding: proposes each sampling request's draft tokens for its next step
        # (tacit/worker/drafter.py, --speculative-config); None: every step yields one token. Set
        # by load_rank (worker/rank.py) on the rank that samples, once this runner's pool exists:
        # a draft model sizes its own pool from it.
        self.drafter: DraftProposer | None = None

    # The context's mutable fields, where the engine, benchmarks and tests reach them.
    @property
    def fused_decode(self):
        return self.paths_context.fused_decode

    @fused_decode.setter
    def fused_decode(self, value) -> None:
        self.paths_context.fused_decode = value

    @property
    def full_prompt_logprobs(self) -> Callable[[str, int, torch.Tensor], None] | None:
        return self.paths_context.full_prompt_logprobs

    @full_prompt_logprobs.setter
    def full_prompt_logprobs(self, sink: Callable[[str, int, torch.Tensor], None] | None) -> None:
        self.paths_context.full_prompt_logprobs = sink

    def path_for(self, rows: Rows, pausable: bool = False) -> ExecutionPath:
        """The path this step's rows run on."""
        return first_accepting(self.paths, rows, pausable)

    def rows(self, scheduler_output: SchedulerOutput) -> Rows:
        return [(self.requests[rid], n) for rid, n in scheduler_output.num_scheduled_tokens.items()]

    def forward_steps(self, rows: Rows, pausable: bool) -> Steps[PathResult]:
        """The step's forward on its path (writing its KV), pausing at decoder-layer boundaries
        if pausable: indexes of the rows that sample, their logits, the prompt logprobs scored."""
        if not rows:
            return PathResult([], None, {})
        return (yield from self.path_for(rows, pausable).steps(rows, pausable))

    @torch.inference_mode()
    def compute_logits(self, rows: Rows) -> tuple[list[int], torch.Tensor | None, PromptScores]:
        """The step's forward without pauses: (indexes of the rows that sample, their logits, the
        prompt logprobs its chunks scored)."""
        return tuple(finish(self.forward_steps(rows, False)))[:3]

    def rank_stats(self) -> dict[str, float]:
        """This rank's totals since load: seconds in its steps (execute_s summed) and seconds of
        them blocked in collectives. `tacit profile` compares the ranks' (Executor.rank_stats)."""
        return {"execute_s": self.execute_seconds, "communication_s": sum(self.communication_seconds().values())}

    def communication_seconds(self) -> dict[str, float]:
        """Tensor parallel: {layer: seconds this rank blocked in its collectives} since load,
        the torch path's modules and the fused decode step's layers alike; {} in one process."""
        out = communication_seconds(self.model)
        fused = getattr(self.fused_decode, "communication_seconds", None)
        if fused is not None:
            out.update(fused())
        return out

    def hidden_communication_seconds(self) -> dict[str, float]:
        """{decoder layer: seconds its all-reduces travelled while the other micro-batch computed}
        under two-micro-batch overlap; {} without it."""
        return hidden_communication_seconds(self.model)

    def append_sampled(self, req_ids: list[str], token_ids: list[list[int]]) -> None:
        """Tokens another rank sampled for these requests (a tensor-parallel worker samples nothing
        itself: it takes the driver's tokens, accepted drafts included, before the next step)."""
        for req_id, tokens in zip(req_ids, token_ids):
            state = self.requests.get(req_id)
            if state is not None:
                state.settle(tokens)

    def close(self) -> None:
        """Finish what runs beside the steps (the second tier's file writes) before the process ends."""
        if self.kv_offload_store is not None:
            self.kv_offload_store.close()

    def execute(self, scheduler_output: SchedulerOutput, sample: bool = True) -> ModelRunnerOutput:
        """The whole step at once (see execute_steps)."""
        return finish(self.execute_steps(scheduler_output, pausable=False, sample=sample))

    def execute_steps(
        self, scheduler_output: SchedulerOutput, pausable: bool = True, sample: bool = True
    ) -> Steps[ModelRunnerOutput]:
        """Apply the step's request changes, run it and sample (sample=False: run the forward and
        the logits, whose collectives every rank joins, and stop there). Pausable, it yields at
        decoder-layer boundaries; the time it spends paused is left out of execute_s."""
        with torch.inference_mode():
            if self.drafter is not None:
                for req_id in scheduler_output.finished_req_ids:
                    if req_id in self.requests:
                        self.drafter.request_finished(self.requests[req_id])
            update_request_states(self.requests, scheduler_output)
            if self.pool_states:  # embedding requests aborted mid-prefill
                for req_id in scheduler_output.finished_req_ids:
                    self.pool_states.pop(req_id, None)
            # Before the forward, in this order: blocks evicted to the second tier are copied out
            # before anything writes them, a swapped-out request's blocks may be this step's new
            # blocks, and loads fill new blocks last.
            offload_ops = scheduler_output.kv_offload_ops
            if offload_ops:
                self.kv_offload_store.apply_stores(offload_ops)
            swap_blocks, swap_s = (
                self.swap_store.apply(scheduler_output.swap_ops) if scheduler_output.swap_ops else (0, 0.0)
            )
            if offload_ops:
                self.kv_offload_store.apply_loads(offload_ops)
            if scheduler_output.is_empty():
                return ModelRunnerOutput(swap_blocks=swap_blocks, swap_s=swap_s)
            rows = self.rows(scheduler_output)
            forward = self.forward_steps(rows, pausable)
            busy_s = 0.0
        while True:
            t = time.perf_counter()
            try:
                with torch.inference_mode():
                    next(forward)
            except StopIteration as done:
                result: PathResult = done.value
                break
            finally:
                busy_s += time.perf_counter() - t
            yield  # paused at a layer boundary: whoever drives this step may run other work now
        t = time.perf_counter()
        with torch.inference_mode():
            if result.row_hidden is not None and self.drafter is not None:
                self.drafter.observe(rows, result.row_hidden)
            out = self._sample(scheduler_output, rows, result) if sample else ModelRunnerOutput()
            if sample and has_pooling(rows):
                out.pooler_output = pool_rows(self.pool_states, rows, result.row_hidden)
        out.prompt_logprobs = result.prompt_logprobs
        for req_id, scored in result.prompt_logprobs.items():
            self.requests[req_id].next_prompt_logprob = scored.start + len(scored.token_ids)
        out.execute_s = busy_s + time.perf_counter() - t
        out.swap_blocks, out.swap_s = swap_blocks, swap_s
        self.execute_seconds += out.execute_s
        return out

    def _sample(self, scheduler_output: SchedulerOutput, rows: Rows, result: PathResult) -> ModelRunnerOutput:
        """Sample (and verify drafts) from the step's logits; ask the drafter for the next drafts."""
        if result.values is None:
            return ModelRunnerOutput()
        states = [rows[i][0] for i in result.samples]
        tokens, logprobs = sample_and_verify(self.sampler, result.values, states, scheduler_output)
        for state, kept in zip(states, tokens):
            state.settle(kept)
        out = ModelRunnerOutput([r.req_id for r in states], tokens, logprobs)
        if self.drafter is not None:
            t = time.perf_counter()
            self.drafter.catch_up_s = 0.0
            if scheduler_output.propose_drafts:
                out.draft_token_ids = self.drafter.propose(states)
            else:
                self.drafter.advance(states)
            out.propose_s = time.perf_counter() - t
            out.propose_catch_up_s = self.drafter.catch_up_s
        return out
