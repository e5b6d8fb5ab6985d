"""LLMEngine: add requests, step, collect outputs. The loop that wires the parts of one step:

InputProcessor.process()        prompt -> validated, tokenized Requests (n>1 fanned out)
Scheduler.schedule()            -> SchedulerOutput (plain data)
ModelRunner.execute()           -> ModelRunnerOutput (sampled ids, logprobs)
Scheduler.update_from_output()  -> EngineCoreOutputs (tokens appended, EOS/length, blocks freed)
OutputProcessor.process_outputs -> RequestOutputs (text, stop strings, logprobs, n>1 grouped)
"""

from __future__ import annotations

import itertools
import logging
import weakref
from typing import Any

import torch

from tacit.config import fit_kv_capacity
from tacit.config.engine_args import EngineArgs
from tacit.engine.executor import make_executor
from tacit.engine.input_processor import InputProcessor
from tacit.engine.metrics import EngineSnapshot
from tacit.engine.output_processor import OutputProcessor
from tacit.kv_cache_interface import KVCacheConfig
from tacit.loader import ModelSource, open_model, sampling_defaults
from tacit.memory.kv_offload import KVOffloadIndex
from tacit.memory.paged_kv_cache_manager import PagedKVCacheManager
from tacit.memory.swap import SwapSpace
from tacit.outputs import ModelRunnerOutput, RequestOutput
from tacit.platforms import get_platform
from tacit.sampling_params import SamplingParams
from tacit.scheduling.policy import get_policy
from tacit.scheduling.scheduler import Scheduler
from tacit.scheduling.scheduler_output import SchedulerOutput
from tacit.structured_output import StructuredOutputManager
from tacit.tokenizer import Tokenizer
from tacit.worker.model_runner import ModelRunner
from tacit.worker.paths.base import Steps, finish

logger = logging.getLogger("tacit.engine")


class LLMEngine:
    def __init__(self, model: str | None = None, *, engine_args: EngineArgs | None = None, **kwargs: Any) -> None:
        """model and kwargs: EngineArgs' fields (LLMEngine(path, dtype="float32", ...)); or engine_args, built."""
        if engine_args is None:
            engine_args = EngineArgs.from_kwargs(model=model, **kwargs)
        elif model is not None or kwargs:
            raise ValueError("pass LLMEngine either engine_args or keyword arguments, not both")
        self.engine_args = engine_args
        self._closed = False
        platform = get_platform(engine_args.device)
        self.platform = platform
        source: ModelSource = open_model(engine_args.model, engine_args.tokenizer, engine_args.chat_template)
        self.source = source
        self.config = engine_args.create_engine_config(source, platform)
        # What a request that sets no temperature / top_p / top_k / min_p / repetition_penalty samples
        # with (--generation-config).
        self.sampling_defaults = sampling_defaults(source.path, engine_args.generation_config)
        # The names the rest of __init__ reads, from the resolved configs.
        model_cfg, seed = self.config.model, self.config.seed
        swap_space = self.config.cache.swap_space
        scheduling_policy = self.config.scheduler.policy
        torch.manual_seed(seed)
        self.tokenizer: Tokenizer = source.tokenizer
        self.tokenizer.allow_special_tokens_in_chat_content = engine_args.allow_special_tokens_in_chat_content
        self.device = platform.device()
        self.executor = make_executor(self.config, engine_args.device, source, platform)
        # An engine dropped without shutdown() still stops its workers and leaves the process
        # group, so the next tensor-parallel engine in this process can form its own (it once
        # failed: "trying to initialize the default process group twice").
        weakref.finalize(self, self.executor.shutdown)
        try:  # a failure past this point stops the workers now, not whenever self is collected
            self._set_up_around(
                self.executor.runner, self.executor.kv_cache_config, model_cfg, swap_space, scheduling_policy
            )
        except BaseException:
            self.executor.shutdown()
            raise

    def _set_up_around(
        self, runner: ModelRunner, kv_config: KVCacheConfig, model_cfg, swap_space: float, scheduling_policy
    ) -> None:
        """The scheduler, KV manager and processors around the executor's runner, built from the
        KV cache configuration the workers answered (the pool, its size and the max_model_len it
        caps to), never from the runner's internals."""
        self.runner: ModelRunner = runner
        self.model = self.runner.model
        self.kv_cache_config = kv_config
        if kv_config.max_model_len != model_cfg.max_model_len:
            logger.info(
                "max_model_len capped at %d tokens, what the KV cache holds (%d blocks of %d); the model's "
                "max_position_embeddings is %d. Pass max_model_len or a larger kv_cache_memory to change it",
                kv_config.max_model_len,
                kv_config.num_blocks,
                kv_config.block_size,
                model_cfg.max_position_embeddings,
            )
            # The workers' cap, applied by the one function that caps (it only ever lowers a
            # max_model_len the user did not set, to what the pool holds).
            self.config = fit_kv_capacity(self.config, kv_config.max_model_len)
            if self.config.model.max_model_len != kv_config.max_model_len:
                raise RuntimeError(
                    f"the workers capped max_model_len to {kv_config.max_model_len}; the engine's config "
                    f"({self.config.model.max_model_len}) does not allow that cap"
                )
        model_cfg = self.config.model
        cache = self.config.cache
        if len(kv_config.sliding_windows) > 1:
            # One table per group: a swap's block list and the second tier's blocks name one.
            kinds = sorted({g.kv_cache_spec.kind for g in kv_config.kv_cache_groups})
            if cache.kv_offloading_size:
                raise ValueError(
                    f"kv_offloading_size={cache.kv_offloading_size}: the second prefix-cache tier keeps one KV "
                    f"cache group's blocks; this model has {len(kv_config.kv_cache_groups)} ({', '.join(kinds)})"
                )
            logger.info(
                "%d KV cache groups (%s): swap preemption is off for this model; a preempted request is recomputed",
                len(kv_config.kv_cache_groups),
                ", ".join(kinds),
            )
            swap_space = 0
        swapper = None
        if swap_space > 0:
            if kv_config.swap_bytes_per_s is None:
                raise RuntimeError(f"swap_space={swap_space} GiB but the workers measured no swap bandwidth")
            swapper = SwapSpace(
                int(swap_space * (1 << 30)) // kv_config.bytes_per_block,
                kv_config.bytes_per_block,
                kv_config.swap_bytes_per_s,
            )
        offload = None
        if cache.kv_offloading_size:
            offload = KVOffloadIndex(
                int(cache.kv_offloading_size * (1 << 30)) // kv_config.bytes_per_block,
                kv_config.offloaded_block_hashes,
            )
        kv = PagedKVCacheManager.from_kv_cache_config(
            kv_config, cache.enable_prefix_caching, record_evictions=offload is not None
        )
        # The logits' width (vocab_size), which may exceed the tokenizer's: padding ids stay masked.
        structured_output = StructuredOutputManager(self.tokenizer, model_cfg.hf["vocab_size"], model_cfg.eos_token_ids)
        self.scheduler = Scheduler(
            self.config.scheduler,
            kv,
            get_policy(scheduling_policy),
            swapper=swapper,
            offload=offload,
            eos_token_ids=model_cfg.eos_token_ids,
            structured_output=structured_output,
            min_speculative_tokens=self.config.speculative.min_speculative_tokens if self.config.speculative else 0,
            num_speculative_tokens=self.config.speculative.num_speculative_tokens if self.config.speculative else 0,
            num_lookahead_tokens=(
                self.config.speculative.num_speculative_tokens
                if self.config.speculative and self.config.speculative.uses_target_hidden_states
                else 0
            ),
        )
        self.max_model_len = model_cfg.max_model_len
        self.num_kv_blocks = kv.num_blocks  # every rank's pool under data-parallel attention
        self.input_processor = InputProcessor(
            self.tokenizer,
            model_cfg.hf["vocab_size"],
            self.max_model_len,
            kv.capacity_tokens,
            self.config.scheduler.slo_classes,
            structured_output,
            hidden_size=int(model_cfg.hf["hidden_size"]),
            pooling_refused=(
                "data-parallel attention leaves each request's hidden states on the rank that ran it"
                if self.config.parallel.data_parallel_attention
                else None
            ),
        )
        self.output_processor = OutputProcessor(self.tokenizer)
        self._ids = itertools.count()
        self.num_steps = 0
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0

    # ---- requests -------------------------------------------------------------------------

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> str:
        """cache_salt (vLLM's name): requests share prefix-cache blocks only with requests of the
        same salt (one per tenant closes the timing side channel: docs/prefix_caching.md)."""
        parent = request_id if request_id is not None else f"req-{next(self._ids)}"
        if self.output_processor.has_request(parent):
            raise ValueError(f"request_id {parent!r} is already in use")
        processed = self.input_processor.process(parent, prompt, params, priority, cache_salt)
        added = []
        try:
            for req in processed.children:
                self.scheduler.add_request(req)  # the policy may refuse it (sla admission)
                added.append(req)
        except ValueError:
            for req in added:  # all of an n>1 request or none of it
                self.scheduler.finish_request(req.request_id, "abort")
            raise
        self.output_processor.add_request(parent, processed.prompt, processed.prompt_token_ids, processed.children)
        self.num_prompt_tokens += len(processed.prompt_token_ids)
        return parent

    def abort_request(self, request_id: str) -> None:
        for seq_id in self.output_processor.abort_request(request_id):
            self.scheduler.finish_request(seq_id, "abort")
        self._hand_over_finished_when_idle()

    def shutdown(self) -> None:
        """Save the prefix cache to its second tier when that is on disk (so a restart finds it),
        then stop the tensor-parallel workers, if any (they also exit when this process does)."""
        if self._closed:
            return
        self._closed = True
        if self.scheduler.offload is not None and self.config.cache.kv_offloading_dir is not None:
            self._run(self.scheduler.save_prefix_cache())
        self.runner.close()
        self.executor.shutdown()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def running_request_ids(self) -> set[str]:
        """Parent ids of every request with a sequence in the running batch."""
        return {r.parent_id for r in self.scheduler.running}

    def get_stats(self) -> EngineSnapshot:
        cache = self.runner.expert_cache
        return EngineSnapshot.of(
            self.scheduler.make_stats(),
            self.num_prompt_tokens,
            self.num_generation_tokens,
            self.num_steps,
            cache.stats.as_dict() if cache is not None else None,
        )

    def score_full_logprobs(self, chunks: list[list[int]]) -> list[torch.Tensor]:
        """Teacher-forced float32 log-softmax over the whole vocabulary, [len(c) - 1, vocab] for
        each chunk c of token ids: row i is the distribution the model predicts for c[i + 1] from
        c[: i + 1]. Each chunk is scored from its own start (nothing carries over between chunks).

        It goes through the normal request path (max_tokens=0, prompt_logprobs=0 requests): the
        scheduler allocates and frees their KV blocks like any prompt's, chunked prefill and
        preemption behave as usual, and no later request can see a corrupted cache. The runner's
        full_prompt_logprobs hook copies out the whole distributions that prompt_logprobs
        computes anyway and otherwise cuts to the top N. It needs an idle engine: it steps the
        engine until everything finishes, which would swallow other requests' outputs."""
        if self.has_unfinished_requests():
            raise RuntimeError("score_full_logprobs needs an idle engine (requests are in flight)")
        short = [i for i, c in enumerate(chunks) if len(c) < 2]
        if short:
            raise ValueError(f"chunks {short} have fewer than 2 tokens: nothing to predict")
        vocab = self.config.model.hf["vocab_size"]
        out = [torch.empty(len(c) - 1, vocab, dtype=torch.float32) for c in chunks]
        filled = [torch.zeros(len(c) - 1, dtype=torch.bool) for c in chunks]
        index: dict[str, int] = {}

        def sink(req_id: str, start: int, logprobs: torch.Tensor) -> None:
            i = index[req_id]
            # start counts prompt tokens: token `start` is predicted by row start - 1.
            out[i][start - 1 : start - 1 + len(logprobs)] = logprobs
            filled[i][start - 1 : start - 1 + len(logprobs)] = True

        params = SamplingParams(max_tokens=0, prompt_logprobs=0, temperature=0.0)
        self.runner.full_prompt_logprobs = sink
        try:
            for i, c in enumerate(chunks):
                index[self.add_request(list(c), params)] = i
            while self.has_unfinished_requests():
                self.step()
        finally:
            self.runner.full_prompt_logprobs = None
            for rid in index:
                self.abort_request(rid)  # a no-op for finished ones; frees the rest after an error
        missing = [i for i, f in enumerate(filled) if not bool(f.all())]
        if missing:
            raise RuntimeError(f"chunks {missing} were not fully scored")
        return out

    # ---- the step -------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One step, run through at once."""
        return finish(self.step_in_layers(pausable=False))

    def step_in_layers(self, pausable: bool = True) -> Steps[list[RequestOutput]]:
        """One step that pauses (yields) at every decoder-layer boundary of its forward where the
        executor can: the online engine runs cut_in_step() in a pause when urgent work arrived,
        then resumes this step where it stopped."""
        scheduler_output = self.scheduler.schedule()
        if pausable:
            runner_output = yield from self.executor.execute_steps(scheduler_output)
        else:
            runner_output = self.executor.execute(scheduler_output)
        outputs = self._update(scheduler_output, runner_output)
        self._hand_over_finished_when_idle()
        return outputs

    def _hand_over_finished_when_idle(self) -> None:
        """Finished ids reach the runner with the next SchedulerOutput. With nothing left to run
        there is no next one until a request arrives, and the runner held the last batch's
        states (up to max_num_seqs token lists) all that time; an empty step hands them over
        now, so an idle engine holds no per-request state anywhere."""
        if not self.scheduler.has_unfinished_requests():
            self._run(self.scheduler.schedule())

    def cut_in_step(self) -> list[RequestOutput]:
        """Prefill the requests Scheduler.schedule_cut_in() picks, now: run while another step is
        paused between two of its layers (step_in_layers), never on its own."""
        return self._run(self.scheduler.schedule_cut_in())

    def _run(self, scheduler_output: SchedulerOutput) -> list[RequestOutput]:
        # Even an empty step goes to the runner: it carries the finished ids whose state it drops.
        return self._update(scheduler_output, self.executor.execute(scheduler_output))

    def _update(self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput) -> list[RequestOutput]:
        if scheduler_output.is_empty():
            return []
        self.num_steps += 1
        core_outputs = self.scheduler.update_from_output(scheduler_output, runner_output)
        self.num_generation_tokens += sum(len(o.new_token_ids) for o in core_outputs)
        outputs, stopped = self.output_processor.process_outputs(core_outputs)
        for seq_id, stop in stopped:
            self.scheduler.finish_request(seq_id, "stop", stop)
        return outputs
