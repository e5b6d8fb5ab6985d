"""EngineArgs: every engine knob once, with its default, its recipe key and its command-line flag.

The engine's flags (`tacit generate | chat | serve`, `tacit bench latency | throughput`), the
recipe sections (config/recipe.py), the LLM(...) and LLMEngine(...) keywords and the frozen
configs are all generated from the fields below (config/knobs.py): a new knob is one field.
Precedence, as a vLLM `--config` file: an explicit flag or keyword, then the recipe, then the
defaults. It sits a tier above the rest of tacit.config (tests/test_import_rules.py): it checks
names against the policies' and communicators' registries, and the policies import SchedulerConfig.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tacit.config.cache import CacheConfig
from tacit.config.engine_config import EngineConfig
from tacit.config.knobs import Knobs, config_default, knob
from tacit.config.model import ModelConfig, parse_dtype
from tacit.config.parallel import ParallelConfig
from tacit.config.quantization import check_quantization, check_quantization_overrides, parse_quantization_overrides
from tacit.config.recipe import Recipe
from tacit.config.scheduler import SchedulerConfig, parse_slo_class
from tacit.config.sizes import parse_bytes, parse_gib
from tacit.config.speculative import SpeculativeConfig, parse_speculative_config
from tacit.config.tunable import TuneSpec
from tacit.distributed.communicators import COMMUNICATORS
from tacit.kernels.cpu_kernels import cpu_kernels_default, ggml_bf16_activations_default
from tacit.scheduling.policy import POLICIES  # the package import registers every policy

if TYPE_CHECKING:
    from tacit.loader import ModelSource
    from tacit.platforms import Platform


def _aging_from_cli(seconds: float) -> float | None:
    return seconds or None  # --aging-s 0: no aging, which the config spells None


def _slo_classes_from_cli(specs: list[str]) -> dict[int, dict[str, float]]:
    return dict(parse_slo_class(s) for s in specs)


# The parallel layout's on/off flags: one process is all a measured tune trial runs, so only the
# performance model prices them (`tacit tune --hardware NAME`).
LAYOUT_FLAG_TUNE = TuneSpec("bool", model_only=True, why="a layout over 2+ ranks, priced by the model for --hardware")


@dataclass(frozen=True)
class EngineArgs(Knobs):
    # ---- model ----
    model: str | None = knob(
        None,
        "model",
        "HF model directory, .gguf file, or a Hugging Face repo id in the local cache (ORG/NAME; ORG/NAME:TAG "
        "picks a GGUF repo's file; never downloaded; `tacit models` lists them)",
        key="path",
        shown="embedded SmolLM2-135M-Instruct",
    )
    dtype: str = knob("auto", "model", "auto | float32 | bfloat16 | float16")
    max_model_len: int | None = knob(
        None, "model", "longest prompt plus output, in tokens", type=int, shown="the model's max_position_embeddings"
    )
    quantization: str = knob(
        config_default(ModelConfig, "quantization"),
        "model",
        "auto | gguf | none | int8 | int4: a GGUF's Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q5_K/Q6_K weights stay in their GGML "
        "blocks (gguf), are dequantized at load (none), or stay where the AVX512 CPU kernels run (auto); "
        "int8 (per output channel, or per group with quantization_group_size) and int4 (per group) quantize a Hugging Face "
        "checkpoint's linear weights at load, stored as Q8_0 / Q4_1 blocks (auto leaves it unquantized)",
        tune=TuneSpec(
            "choice",
            choices=("auto", "int8", "int4"),
            changes_output=True,
            why="the load-time quantizations of a Hugging Face checkpoint; a GGUF's blocks are what they are",
        ),
    )
    quantization_group_size: int | None = knob(
        config_default(ModelConfig, "quantization_group_size"),
        "model",
        "values of a row per int4 scale and min, or per int8 scale: 32 | 64 | 128 (int8 with 32 is llama.cpp's "
        "Q8_0 and scores a lower KL divergence than one scale per row, at the same 8.5 bits a weight)",
        type=int,
        shown="int4 32, int8 one scale per output channel",
    )
    quantization_overrides: dict[str, str] = knob(
        config_default(ModelConfig, "quantization_overrides"),
        "model",
        "a type per linear layer of a Hugging Face checkpoint quantized at load, over quantization's: "
        "{fnmatch pattern over HF module names: none | int8 | int4}, the first matching pattern wins, "
        "e.g. {'*.o_proj': 'int8', '*.down_proj': 'int8', 'lm_head': 'int8'}",
        shown="none",
        from_cli=parse_quantization_overrides,
        metavar="PATTERN=TYPE,...",
        cli_help="a type per linear layer of a Hugging Face checkpoint quantized at load, over --quantization's: "
        "comma-separated PATTERN=TYPE (fnmatch over HF module names; none | int8 | int4; the first match wins), "
        "e.g. '*.o_proj=int8,*.down_proj=int8,lm_head=int8'",
    )
    seed: int = knob(
        config_default(EngineConfig, "seed"), "model", "seed of torch's generator at engine start", type=int
    )
    tokenizer: str | None = knob(
        None, "model", "a tokenizer directory (tokenizer.json) other than the model's", shown="the model's"
    )
    chat_template: str | None = knob(
        None, "model", "a Jinja chat template file (or the template itself) over the checkpoint's", shown="the model's"
    )
    generation_config: str = knob(
        "auto",
        "model",
        "where requests' unset temperature / top_p / top_k / min_p / repetition_penalty come from, as vLLM's: "
        "auto (the model's generation_config.json), vllm (none: OpenAI's defaults) or a folder holding a "
        "generation_config.json",
    )
    allow_special_tokens_in_chat_content: bool = knob(
        False,
        "model",
        "parse special-token text inside chat messages as special tokens (false: it stays text, "
        "so a message cannot forge a turn such as <|im_start|>system)",
        action="store_const",
        const=True,
        cli_help="parse special-token text inside chat messages as special tokens (by default it stays "
        "text, so a message cannot forge a turn such as <|im_start|>system)",
    )
    expert_cache_memory: int | None = knob(
        None,
        "model",
        "bytes of memory for MoE expert weights: experts stay in the safetensors checkpoint and pass through a "
        "cache of this size, the next layer's prefetched on a background thread (a model larger than memory)",
        type=parse_bytes,
        metavar="SIZE",
        shown="every expert resident",
    )
    speculative_config: dict | None = knob(
        None,
        "model",
        'vLLM\'s speculative decoding config, e.g. {"method": "ngram", "num_speculative_tokens": 4, '
        '"prompt_lookup_max": 4, "prompt_lookup_min": 2}: drafts verified in one step; methods ngram, '
        'suffix, draft_model ({"model": PATH}: a smaller checkpoint, same tokenizer), mtp (DeepSeek-V3/R1)',
        shown="none",
        from_cli=parse_speculative_config,
        metavar="JSON",
        # The draft-length controller's bounds (scheduling/spec_controller.py), searched only where
        # the base configuration has a method: these keys mean nothing without one.
        tune={
            "num_speculative_tokens": TuneSpec(
                "int",
                low=1,
                high=8,
                why="vLLM's examples draft 1-5 tokens; 8 bounds a verify step at 9 tokens a request",
            ),
            "min_speculative_tokens": TuneSpec(
                "int", low=0, high=8, why="0 lets the controller stop drafting; at most num_speculative_tokens"
            ),
        },
    )
    # ---- platform ----
    device: str = knob("auto", "platform", "auto | cpu | cuda")
    cpu_kernels: bool | None = knob(
        None,
        "platform",
        "tacit's AVX512-BF16 CPU kernels (bf16 and GGML GEMVs, the fused decode step, the MoE kernel) where the "
        "CPU has them (false: the torch path everywhere)",
        flag="--no-cpu-kernels",
        action="store_const",
        const=False,
        shown="true; TACIT_NO_CPU_KERNELS=1 makes it false",
        cli_help="run the torch path everywhere instead of tacit's AVX512-BF16 CPU kernels "
        "(the default where TACIT_NO_CPU_KERNELS=1)",
    )
    ggml_bf16_activations: bool | None = knob(
        None,
        "platform",
        "GGML-quantized decode rows multiply the blocks unpacked to bf16 by bf16 activations, the dequantized "
        "model's arithmetic (false: activations rounded to int8 per block, llama.cpp's)",
        action="store_const",
        const=True,
        shown="false; TACIT_GGML_BF16_ACTIVATIONS=1 makes it true",
        cli_help="GGML-quantized decode rows multiply bf16 activations, the dequantized model's arithmetic "
        "(by default activations rounded to int8 per block, llama.cpp's; also TACIT_GGML_BF16_ACTIVATIONS=1)",
    )
    threads: int | None = knob(
        None,
        "platform",
        "torch and CPU-kernel threads per process (each tensor-parallel rank), llama.cpp's --threads",
        type=int,
        shown="torch's own; a tensor-parallel rank's: one per core of its share",
        tune=TuneSpec(
            "int",
            low=1,
            high=256,
            upto_cores=True,
            measured_only=True,
            why="1 up to this machine's cores; a step-cost calibration holds only at the thread count it was fitted at",
        ),
    )
    # ---- parallel ----
    tensor_parallel_size: int = knob(
        config_default(ParallelConfig, "tensor_parallel_size"),
        "parallel",
        "processes that each hold 1/N of every layer (heads, features, vocabulary), pinned to disjoint cores",
        type=int,
        tune=TuneSpec(
            "choice",
            choices=(1, 2, 4, 8),
            model_only=True,
            why="powers of two divide the head counts of the models tacit runs; a layout is priced for --hardware",
        ),
    )
    expert_parallel: bool = knob(
        config_default(ParallelConfig, "expert_parallel"),
        "parallel",
        "MoE layers: each tensor-parallel rank holds 1/N of the experts, whole (false: 1/N of every expert's "
        "intermediate features)",
        action="store_const",
        const=True,
        aliases=("--enable-expert-parallel",),  # vLLM's spelling
        tune=LAYOUT_FLAG_TUNE,
        cli_help="MoE layers: each tensor-parallel rank holds 1/N of the experts, whole (by default 1/N of "
        "every expert's intermediate features)",
    )
    two_batch_overlap: bool = knob(
        config_default(ParallelConfig, "two_batch_overlap"),
        "parallel",
        "tensor parallel: prefill and mixed steps of 2+ requests run as two micro-batches, each one's all-reduces "
        "in flight while the other computes",
        action="store_const",
        const=True,
        tune=LAYOUT_FLAG_TUNE,
    )
    data_parallel_attention: bool = knob(
        config_default(ParallelConfig, "data_parallel_attention"),
        "parallel",
        "tensor parallel: each rank runs the whole attention for its own requests with its own KV pool (MLA's "
        "latent cache split by request, not copied), the MLPs split as before over all ranks' tokens gathered; "
        "SGLang's --enable-dp-attention",
        action="store_const",
        const=True,
        aliases=("--enable-dp-attention",),
        tune=LAYOUT_FLAG_TUNE,
    )
    communicator: str = knob(
        config_default(ParallelConfig, "communicator"),
        "parallel",
        "tensor parallel: the collectives' implementation, auto (the platform's: shared memory on CPU, "
        "torch.distributed's NCCL on GPU; torch.distributed where that cannot be built), shm or torch",
    )
    # ---- cache ----
    block_size: int = knob(
        config_default(CacheConfig, "block_size"),
        "cache",
        "tokens per KV block",
        type=int,
        tune=TuneSpec(
            "choice",
            choices=(8, 16, 32, 64),
            why="vLLM's 8/16/32 and 64; any size >= 1 runs, and multiples of 4 keep int8 KV scales aligned",
        ),
    )
    num_kv_blocks: int | None = knob(
        None, "cache", "KV blocks in the pool", type=int, shown="what kv_cache_memory holds"
    )
    kv_cache_memory: int | None = knob(
        None,
        "cache",
        "bytes for the KV pool (on the command line also 2GiB, 512MiB, 1.5GB)",
        type=parse_bytes,
        metavar="SIZE",
        shown="half the free memory, at most 2 GiB",
    )
    swap_space: float = knob(
        config_default(CacheConfig, "swap_space"),
        "cache",
        "GiB of host memory for swapped-out KV blocks (0: no swapping)",
        type=parse_gib,
        metavar="GIB",
    )
    kv_cache_dtype: str = knob(
        config_default(CacheConfig, "cache_dtype"),
        "cache",
        "auto | bfloat16 | float16 | float32 | int8: what the KV cache stores (auto: the model's dtype; "
        "int8: values with a scale per token and kv head, half of bf16's bytes)",
        tune=TuneSpec("choice", choices=("auto", "int8"), changes_output=True, why="int8 halves the KV bytes"),
    )
    enable_prefix_caching: bool = knob(
        config_default(CacheConfig, "enable_prefix_caching"),
        "cache",
        "share full KV blocks of identical prompt prefixes between requests (a hit skips their prefill)",
        flag="--no-enable-prefix-caching",
        action="store_const",
        const=False,
        cli_help="compute every prompt token: no KV block is shared between requests",
    )
    kv_offloading_size: float = knob(
        0.0,
        "cache",
        "GiB of a second prefix-cache tier for blocks evicted from the pool (0: none)",
        type=parse_gib,
        metavar="GIB",
    )
    kv_offloading_dir: str | None = knob(
        None, "cache", "keep that tier in files here, across restarts (else in host memory)", shown="host memory"
    )
    # ---- scheduler ----
    scheduling_policy: str = knob(
        config_default(SchedulerConfig, "policy"),
        "scheduler",
        "fcfs | priority | sjf | sla",
        key="policy",
        tune=TuneSpec(
            "choice",
            choices=("fcfs", "priority", "sjf", "sla"),
            choices_need=(("sla", "slo_classes"),),
            why="every policy; sla orders by slack against the slo_classes' targets, so only where they are set",
        ),
    )
    max_num_seqs: int = knob(
        config_default(SchedulerConfig, "max_num_seqs"),
        "scheduler",
        "most requests in one step",
        type=int,
        tune=TuneSpec(
            "int", low=4, high=256, log=True, why="4 requests a step on a 2-core CPU up to vLLM's default of 256"
        ),
    )
    max_num_batched_tokens: int = knob(
        config_default(SchedulerConfig, "max_num_batched_tokens"),
        "scheduler",
        "most tokens in one step",
        type=int,
        tune=TuneSpec(
            "int",
            low=256,
            high=16384,
            log=True,
            why="256 a step on a 2-core CPU up to 16384, vLLM's LLM class's default on a GPU",
        ),
    )
    enable_chunked_prefill: bool = knob(
        config_default(SchedulerConfig, "enable_chunked_prefill"),
        "scheduler",
        "prefill a long prompt in chunks over several steps (false: whole in one "
        "step, with max_num_batched_tokens raised to max_model_len)",
        flag="--no-chunked-prefill",
        action="store_const",
        const=False,
        cli_help="prefill each prompt whole in one step, with max_num_batched_tokens raised to max_model_len",
        tune=TuneSpec("bool", why="whole prompts in one step trade decode stalls for fewer passes over the weights"),
    )
    long_prefill_token_threshold: int = knob(
        config_default(SchedulerConfig, "long_prefill_token_threshold"),
        "scheduler",
        "most prompt tokens one request prefills per step (0: no cap)",
        type=int,
        # 0 is a mode (no cap), not the low end of a range: a choice, so it is drawn as often as any cap.
        tune=TuneSpec(
            "choice",
            choices=(0, 64, 128, 256, 512, 1024, 2048, 4096),
            why="no cap, or a cap of 64..4096 tokens; 512 is this CPU's measured default",
        ),
    )
    max_long_partial_prefills: int = knob(
        config_default(SchedulerConfig, "max_long_partial_prefills"),
        "scheduler",
        "how many prompts longer than the threshold prefill in one step",
        type=int,
        tune=TuneSpec(
            "int", low=1, high=8, why="vLLM's default is 1; 8 prompts capped at 2048 already fill a 16384-token step"
        ),
    )
    aging_s: float | None = knob(
        config_default(SchedulerConfig, "aging_s"),
        "scheduler",
        "seconds after which a waiting request goes ahead of all newer ones (None: never)",
        type=float,
        from_cli=_aging_from_cli,
        cli_help="seconds after which a waiting request goes ahead of all newer ones (0: never)",
        tune=TuneSpec(
            "choice", choices=(None, 5.0, 15.0, 60.0, 300.0), why="never, or a starvation bound from 5 s to 5 min"
        ),
    )
    slo_classes: dict[int, dict[str, float]] = knob(
        config_default(SchedulerConfig, "slo_classes"),
        "scheduler",
        "default TTFT/TPOT targets per priority class, e.g. {0: {'ttft_ms': 500, 'tpot_ms': 100}}",
        shown="none",
        flag="--slo-class",
        from_cli=_slo_classes_from_cli,
        action="append",
        metavar="PRIORITY:ttft=MS,tpot=MS",
        cli_help="default TTFT/TPOT targets for a priority class (repeatable), e.g. 0:ttft=500,tpot=100",
    )
    slo_admission: str = knob(
        config_default(SchedulerConfig, "slo_admission"),
        "scheduler",
        "reject | defer: what sla does with a request whose estimated TTFT misses its target",
    )
    preemption_mode: str = knob(
        config_default(SchedulerConfig, "preemption_mode"),
        "scheduler",
        "auto | recompute | swap",
        tune=TuneSpec(
            "choice",
            choices=("auto", "recompute", "swap"),
            choices_need=(("swap", "swap_space"),),
            why="every mode the engine has; swap only with swap space to swap to",
        ),
    )
    cut_in_prefill_tokens: int = knob(
        config_default(SchedulerConfig, "cut_in_prefill_tokens"),
        "scheduler",
        "a waiting request that outranks someone in the step in flight and has at "
        "most this many prompt tokens is prefilled between that step's layers "
        "(tacit serve; 0: never)",
        type=int,
        tune=TuneSpec(
            "choice",
            choices=(0, 64, 128, 256, 512, 1024, 2048),
            why="never, or prompts of up to 64..2048 tokens; an interactive turn is ~30-200",
        ),
    )
    enable_cache_aware_scheduling: bool = knob(
        config_default(SchedulerConfig, "enable_cache_aware_scheduling"),
        "scheduler",
        "with the prefix cache, waiting requests of equal rank (fcfs; priority within a priority) "
        "that arrived in the same second go longest cached prefix first (SGLang's lpm)",
        flag="--no-enable-cache-aware-scheduling",
        action="store_const",
        const=False,
        cli_help="serve waiting requests of equal rank in arrival order, whatever the prefix cache holds of them",
        tune=TuneSpec("bool", why="longest cached prefix first, or arrival order"),
    )

    # ---- the scheduler's flags alone ---------------------------------------------------------

    @classmethod
    def scheduler_config_from_cli(cls, args: argparse.Namespace, max_model_len: int | None = None) -> SchedulerConfig:
        """The SchedulerConfig of the scheduler-section flags in args (add_section_cli_args), the
        other engine fields at their defaults: how the engine itself would schedule."""
        names = cls.recipe_sections()["scheduler"].values()
        given = argparse.Namespace(**{n: getattr(args, n, None) for n in names})
        return cls.from_cli_args(given).create_scheduler_config(max_model_len)

    # ---- checks and configs ------------------------------------------------------------------

    def check(self) -> None:
        """Every check that needs no model, the same ones the engine makes: what a recipe is held to on load."""
        self.create_scheduler_config()
        self.create_cache_config()
        self.create_parallel_config()
        if self.dtype != "auto":
            parse_dtype(self.dtype)
        check_quantization(self.quantization, self.quantization_group_size)
        check_quantization_overrides(self.quantization_overrides)
        SpeculativeConfig.from_dict(self.speculative_config)
        self._check_plain_fields()

    def _check_plain_fields(self) -> None:
        # The fields no config checks before the model is open.
        for key in ("max_model_len", "seed"):
            v = getattr(self, key)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ValueError(f"{key}={v!r} is invalid: must be an integer >= 0")
        for key in ("model", "device", "tokenizer", "chat_template", "generation_config"):
            v = getattr(self, key)
            if v is not None and not isinstance(v, str):
                raise ValueError(f"{key}={v!r} is invalid: must be a string")
        for key in ("cpu_kernels", "ggml_bf16_activations"):
            v = getattr(self, key)
            if v is not None and not isinstance(v, bool):
                raise ValueError(f"{key}={v!r} is invalid: must be true or false")
        if not isinstance(self.allow_special_tokens_in_chat_content, bool):
            raise ValueError(
                f"allow_special_tokens_in_chat_content={self.allow_special_tokens_in_chat_content!r} is invalid: "
                f"must be true or false"
            )

    def create_parallel_config(self) -> ParallelConfig:
        if self.communicator != "auto" and self.communicator not in COMMUNICATORS:
            raise ValueError(
                f"communicator={self.communicator!r} is not known; valid: auto, {', '.join(COMMUNICATORS)}"
            )
        return ParallelConfig(
            tensor_parallel_size=self.tensor_parallel_size,
            expert_parallel=self.expert_parallel,
            two_batch_overlap=self.two_batch_overlap,
            data_parallel_attention=self.data_parallel_attention,
            communicator=self.communicator,
            threads=self.threads,
        )

    def create_cache_config(self) -> CacheConfig:
        return CacheConfig(
            block_size=self.block_size,
            num_kv_blocks=self.num_kv_blocks,
            kv_cache_memory=self.kv_cache_memory,
            # Data-parallel attention preempts by recompute: a resumed request may land on another
            # rank's pool than the one whose host copy it left (README, "Not supported yet").
            swap_space=0 if self.data_parallel_attention else self.swap_space,
            cache_dtype=self.kv_cache_dtype,
            enable_prefix_caching=self.enable_prefix_caching,
            kv_offloading_size=self.kv_offloading_size,
            kv_offloading_dir=self.kv_offloading_dir,
        )

    def create_scheduler_config(self, max_model_len: int | None = None) -> SchedulerConfig:
        """max_model_len: the model's resolved one, once known; the budget may depend on it."""
        budget = self.max_num_batched_tokens
        if (
            self.enable_chunked_prefill is False
            and max_model_len is not None
            and isinstance(budget, int)
            and budget < max_model_len
        ):
            # Without chunking a whole prompt must fit in one step's budget.
            budget = max_model_len
        # Checked here, not in SchedulerConfig: the policies import the config (a cycle otherwise).
        if self.scheduling_policy not in POLICIES:
            raise ValueError(f"scheduling_policy={self.scheduling_policy!r} is not known; valid: {', '.join(POLICIES)}")
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=budget,
            enable_chunked_prefill=self.enable_chunked_prefill,
            policy=self.scheduling_policy,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
            max_long_partial_prefills=self.max_long_partial_prefills,
            aging_s=self.aging_s,
            slo_classes=self.slo_classes,
            slo_admission=self.slo_admission,
            preemption_mode=self.preemption_mode,
            cut_in_prefill_tokens=self.cut_in_prefill_tokens,
            enable_cache_aware_scheduling=self.enable_cache_aware_scheduling,
        )

    def create_model_config(self, source: ModelSource, platform: Platform) -> ModelConfig:
        dtype = platform.default_dtype() if self.dtype == "auto" else parse_dtype(self.dtype)
        return ModelConfig(
            path=str(source.path),
            hf=source.hf_config,
            dtype=dtype,
            eos_token_ids=source.eos_token_ids,
            max_model_len=self.max_model_len or 0,
            quantization=self.quantization,
            quantization_group_size=self.quantization_group_size,
            quantization_overrides=self.quantization_overrides,
            expert_cache_memory=self.expert_cache_memory,
            tokenizer=self.tokenizer,
            # Unsaid: the environment's, as before these were fields.
            cpu_kernels=cpu_kernels_default() if self.cpu_kernels is None else self.cpu_kernels,
            ggml_bf16_activations=(
                ggml_bf16_activations_default() if self.ggml_bf16_activations is None else self.ggml_bf16_activations
            ),
        )

    def create_engine_config(self, source: ModelSource, platform: Platform) -> EngineConfig:
        """The frozen configs the engine runs on, for the opened model on this platform.

        Everything resolved from more than one knob is resolved here, once; the configs only check.
        """
        self._check_plain_fields()
        model = self.create_model_config(source, platform)
        return EngineConfig(
            model=model,
            cache=self.create_cache_config(),
            scheduler=self.create_scheduler_config(model.max_model_len),
            device=platform.name,
            seed=self.seed,
            parallel=self.create_parallel_config(),
            speculative=SpeculativeConfig.from_dict(self.speculative_config),
        )


def load_recipe(path: str | Path) -> Recipe:
    """Read and check a recipe file (or a folder holding recipe.yaml) against EngineArgs (Knobs.load_recipe)."""
    return EngineArgs.load_recipe(path)
