"""ModelRunner: a SchedulerOutput in, a ModelRunnerOutput out.

The step, in order: apply the step's request changes to this rank's own per-request state
(request_state.py, from the plain data the scheduler sends); carry out swap copies; take the
first execution path that accepts the step's rows (paths/: data-parallel attention, the fused
C++ decode step, a mixed step split between it and torch, two overlapping micro-batches, the
torch reference), which builds its input batch (input_batch.py), runs the decoder layers itself
(so work can run between two of them: a cut-in prefill) and projects only the rows that sample;
then sample. The KV pool is sized once at load (kv_allocation.py).
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
from tacit.layers.attention_selector import select_attention_backend
from tacit.layers.kv_cache import KVCacheLayer
from tacit.layers.linear import (
    communication_seconds,
    hidden_communication_seconds,
    select_linear_method,
    use_communicator,
    use_linear_method,
)
from tacit.layers.moe import select_moe_kernel, use_moe_kernel
from tacit.layers.sampler import Sampler, SamplingMetadata
from tacit.models.expert_streaming import stream_experts
from tacit.outputs import ModelRunnerOutput
from tacit.scheduling.scheduler_output import SchedulerOutput
from tacit.worker.input_batch import PromptScores, Rows
from tacit.worker.kv_allocation import num_kv_blocks
from tacit.worker.paths import PathContext, PathResult
from tacit.worker.paths.base import BetweenLayers, ExecutionPath, build_paths, first_accepting
from tacit.worker.paths.fused_binders import build_fused_decoder
from tacit.worker.request_state import CachedRequestState, update_request_states
from tacit.worker.swap_store import KVSwapStore


def kv_cache_layers(model: nn.Module) -> list[KVCacheLayer]:
    return [m for m in model.modules() if isinstance(m, KVCacheLayer)]


class ModelRunner:
    def __init__(
        self,
        config: EngineConfig,
        model: nn.Module,
        device: torch.device,
        free_memory: int,
        comm: Communicator | None = None,
        agree_num_blocks: Callable[[int], int] | None = None,
    ) -> None:
        """comm: the tensor-parallel group's communicator (one rank of several); agree_num_blocks
        turns this rank's KV block count into the one every rank uses (the smallest)."""
        self.config = config
        self.model = model
        self.device = device
        self.block_size = config.cache.block_size
        self.sampler = Sampler()
        self.execute_seconds = 0.0  # execute_s summed since load (rank_stats)
        kernels = None
        cpu_kernels, int8_activations = config.model.cpu_kernels, not config.model.ggml_bf16_activations
        if device.type == "cpu" and config.model.dtype == torch.bfloat16:
            from tacit.kernels.cpu_kernels import load_cpu_kernels

            kernels = load_cpu_kernels(cpu_kernels)
        # Chosen once for the model: how its linear layers multiply, which kernel runs its
        # experts, which backend attends.
        use_linear_method(model, select_linear_method(device.type, config.model.dtype, cpu_kernels))
        use_moe_kernel(model, select_moe_kernel(device.type, config.model.dtype, cpu_kernels, int8_activations))
        self.comm = comm
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
        self.attn_backend = select_attention_backend(device.type, config.model.dtype, config.model)
        layers = kv_cache_layers(model)
        for m in layers:
            m.set_attention_backend(self.attn_backend)
        dtype = self.kv_cache_dtype = parse_kv_cache_dtype(config.cache.cache_dtype, config.model.dtype)
        self.bytes_per_block = self.block_size * sum(m.kv_numel_per_token(dtype) for m in layers) * dtype.itemsize
        # This rank's KV blocks in host memory while their request is swapped out (every rank
        # holds its own shard; the scheduler's SwapOps say what to copy).
        self.swap_store = KVSwapStore(layers) if config.cache.swap_space > 0 else None
        self.num_blocks = num_kv_blocks(config, self.bytes_per_block, self.block_size, free_memory)
        if agree_num_blocks is not None:
            # Every rank's scheduler-side block ids index its own pool: all pools are one size.
            self.num_blocks = agree_num_blocks(self.num_blocks)
        self.config = config = fit_kv_capacity(config, self.num_blocks * self.block_size)
        for m in layers:
            m.allocate_kv_cache(self.num_blocks, self.block_size, dtype, device)
        # Decode-only steps run as one C++ call when the model and CPU allow it.
        # Its rope tables cover every position a sequence can reach: no more than the pool
        # holds, even when an explicit max_model_len is longer.
        positions = min(config.model.max_model_len, self.num_blocks * self.block_size)
        fused_decode = build_fused_decoder(model, kernels, self.block_size, positions, int8_activations)
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
        )
        self.paths: list[ExecutionPath] = build_paths(self.paths_context)
        self.requests: dict[str, CachedRequestState] = {}

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

    def path_for(self, rows: Rows, between_layers: BetweenLayers = None) -> ExecutionPath:
        """The path this step's rows run on."""
        return first_accepting(self.paths, rows, between_layers)

    def rows(self, scheduler_output: SchedulerOutput) -> Rows:
        return [(self.requests[rid], n) for rid, n in scheduler_output.num_scheduled_tokens.items()]

    @torch.inference_mode()
    def compute_logits(
        self, rows: Rows, between_layers: BetweenLayers = None
    ) -> tuple[list[int], torch.Tensor | None, PromptScores]:
        """Run the step's forward: (indexes of the rows that sample, their logits, the prompt
        logprobs its chunks scored); writes this step's KV. between_layers, if given, runs at
        every decoder-layer boundary."""
        if not rows:
            return [], None, {}
        out: PathResult = self.path_for(rows, between_layers).run(rows, between_layers)
        return out.samples, out.values, out.prompt_logprobs

    @staticmethod
    def _add_grammar_bitmask(
        metadata: SamplingMetadata, states: list[CachedRequestState], scheduler_output: SchedulerOutput
    ) -> None:
        """Point the scheduler's bitmask rows at the sampling rows they constrain."""
        row_of = {r.req_id: i for i, r in enumerate(states)}
        ids = scheduler_output.structured_output_request_ids
        missing = [rid for rid in ids if rid not in row_of]
        if missing:  # the scheduler masks only rows that sample: anything else is a bookkeeping bug
            raise RuntimeError(f"grammar bitmask for requests that do not sample this step: {missing}")
        metadata.grammar_rows = [row_of[rid] for rid in ids]
        metadata.grammar_bitmask = torch.from_numpy(scheduler_output.grammar_bitmask)

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

    def append_sampled(self, req_ids: list[str], token_ids: list[int]) -> None:
        """Tokens another rank sampled for these requests (a tensor-parallel worker samples nothing
        itself: it takes the driver's tokens before the next step)."""
        for req_id, token in zip(req_ids, token_ids):
            state = self.requests.get(req_id)
            if state is not None:
                state.token_ids.append(token)

    @torch.inference_mode()
    def execute(
        self,
        scheduler_output: SchedulerOutput,
        between_layers: Callable[[], None] | None = None,
        sample: bool = True,
    ) -> ModelRunnerOutput:
        """Apply the step's request changes, run it and sample (sample=False: run the forward and
        the logits, whose collectives every rank joins, and stop there). Time spent inside
        between_layers (a cut-in runs another execute() there) is left out of execute_s."""
        update_request_states(self.requests, scheduler_output)
        # Before the forward: a swapped-out request's blocks may be this step's new blocks.
        swap_blocks, swap_s = (
            self.swap_store.apply(scheduler_output.swap_ops) if scheduler_output.swap_ops else (0, 0.0)
        )
        if scheduler_output.is_empty():
            return ModelRunnerOutput(swap_blocks=swap_blocks, swap_s=swap_s)
        t0 = time.perf_counter()
        nested_s = 0.0
        hook = None
        if between_layers is not None:

            def hook() -> None:
                nonlocal nested_s
                t = time.perf_counter()
                between_layers()
                nested_s += time.perf_counter() - t

        rows = self.rows(scheduler_output)
        samples, logits, prompt_logprobs = self.compute_logits(rows, hook)
        out = ModelRunnerOutput()
        if logits is not None and sample:
            states = [rows[i][0] for i in samples]
            params = [r.sampling_params for r in states]
            # Only penalties read the generated ids; slicing them out of every row's token list
            # each step would copy the whole context of every sampling row for nothing.
            output_ids = [r.output_token_ids if p.needs_penalties else [] for r, p in zip(states, params)]
            metadata = SamplingMetadata(params, output_ids, [r.generator for r in states])
            if scheduler_output.grammar_bitmask is not None:
                self._add_grammar_bitmask(metadata, states, scheduler_output)
            sampled = self.sampler(logits, metadata)
            for state, token in zip(states, sampled.token_ids):
                state.token_ids.append(token)
            out = ModelRunnerOutput([r.req_id for r in states], sampled.token_ids, sampled.logprobs)
        for req_id, scored in prompt_logprobs.items():
            self.requests[req_id].next_prompt_logprob = scored.start + len(scored.token_ids)
        out.prompt_logprobs = prompt_logprobs
        out.execute_s = time.perf_counter() - t0 - nested_s
        out.swap_blocks, out.swap_s = swap_blocks, swap_s
        self.execute_seconds += out.execute_s
        return out
