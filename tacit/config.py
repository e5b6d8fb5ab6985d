"""Engine configuration: the model, the KV cache, the scheduler, and how they are checked."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from tacit.kernels.kv_quant import parse_kv_cache_dtype
from tacit.kernels.weight_quant import GROUP_SIZES
from tacit.model_config_checks import check_architecture_numbers

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


_KEY_ALIASES = [("num_experts", "num_local_experts"), ("n_routed_experts", "num_local_experts")]


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    name = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}.get(dtype, dtype)
    if name not in _DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; valid: {', '.join(_DTYPES)}")
    return _DTYPES[name]


# auto | gguf | none: what happens to a GGUF's GGML blocks. int8 | int4: a Hugging Face
# checkpoint's linear weights quantized at load (kernels/weight_quant.py).
QUANTIZATIONS = ("auto", "gguf", "none", "int8", "int4")
HF_QUANTIZATIONS = ("int8", "int4")


def check_quantization(value: str, group_size: int | None = None) -> None:
    if value not in QUANTIZATIONS:
        raise ValueError(
            f"quantization={value!r} is not supported; valid: {', '.join(QUANTIZATIONS)} "
            f"(auto|gguf|none: a GGUF's quantized weights; int8|int4: quantize a Hugging Face checkpoint at load)"
        )
    if group_size is not None and (group_size not in GROUP_SIZES or isinstance(group_size, bool)):
        raise ValueError(
            f"quantization_group_size={group_size!r} is not supported; valid: "
            f"{', '.join(map(str, GROUP_SIZES))} (values of a row per int4 scale and min or per int8 scale), "
            f"or unset (int4: 32; int8: one scale per output channel)"
        )


# --quantization-overrides: a layer's type, whatever --quantization says (none: the model's dtype).
QUANTIZATION_OVERRIDE_TYPES = ("none", "int8", "int4")


def check_quantization_overrides(overrides: Any) -> None:
    """{fnmatch pattern over HF module names: none | int8 | int4}; which layers each pattern
    matches is checked against the model (models/quantize_at_load.py)."""
    if not isinstance(overrides, dict):
        raise ValueError(
            f"quantization_overrides={overrides!r} is invalid: must be a mapping of pattern to type, "
            f"e.g. {{'*.down_proj': 'int8'}}"
        )
    for pattern, qtype in overrides.items():
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"quantization_overrides: pattern {pattern!r} is invalid: must be a non-empty string")
        if qtype not in QUANTIZATION_OVERRIDE_TYPES:
            raise ValueError(
                f"quantization_overrides[{pattern!r}]={qtype!r} is not a type; valid: "
                f"{', '.join(QUANTIZATION_OVERRIDE_TYPES)}"
            )


def parse_quantization_overrides(spec: str) -> dict[str, str]:
    """'*.o_proj=int8,lm_head=int8' -> {'*.o_proj': 'int8', 'lm_head': 'int8'}, in order (the
    CLI's --quantization-overrides)."""
    overrides: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in spec.split(","))):
        pattern, sep, qtype = pair.rpartition("=")
        if not sep or not pattern.strip():
            raise ValueError(
                f"--quantization-overrides {spec!r} is invalid at {pair!r}; write PATTERN=TYPE pairs separated "
                f"by commas, e.g. '*.o_proj=int8,*.down_proj=int8,lm_head=int8'"
            )
        overrides.setdefault(pattern.strip(), qtype.strip())  # first match wins: a repeat never would
    check_quantization_overrides(overrides)
    return overrides


def normalize_rope(hf: dict[str, Any]) -> dict[str, Any]:
    """One rope dict whatever the checkpoint's era.

    Older configs say `rope_theta` + `rope_scaling`; transformers 5 writes `rope_parameters`.
    """
    params = dict(hf.get("rope_parameters") or {})
    scaling = hf.get("rope_scaling") or {}
    params.update({k: v for k, v in scaling.items() if k not in params})
    params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type") or params.get("type") or "default"
    params["rope_type"] = rope_type
    return params


@dataclass(frozen=True)
class ModelConfig:
    """A model's architecture, read from config.json (or GGUF metadata mapped onto the same keys).

    Frozen: __post_init__ fills in what derives from `hf` (object.__setattr__, at construction
    only); nothing changes it afterwards.
    """

    path: str
    hf: dict[str, Any]
    dtype: torch.dtype
    architecture: str = ""
    eos_token_ids: list[int] = field(default_factory=list)
    # 0: the model's max_position_embeddings, capped once the KV pool is sized (fit_kv_capacity).
    max_model_len: int = 0
    # GGUF weights in GGML blocks: "auto" keeps them where the CPU kernels run, "gguf" always,
    # "none" dequantizes them at load (models/quantization.py keeps_ggml_weights). "int8" / "int4"
    # quantize a Hugging Face checkpoint's linear weights at load (models/quantize_at_load.py).
    quantization: str = "auto"
    # Values of a row per int4 scale and min or per int8 scale (32, 64 or 128); None: int4 groups
    # of 32, int8 one scale per output channel (quantize_at_load.group_size_of).
    quantization_group_size: int | None = None
    # {fnmatch pattern over HF module names: none | int8 | int4}, first match wins: a type per
    # layer of a Hugging Face checkpoint quantized at load, over `quantization`'s.
    quantization_overrides: dict[str, str] = field(default_factory=dict)
    # Bytes of memory for MoE expert weights, which then stay in the checkpoint and are read
    # into this cache as steps need them (memory/expert_cache.py); None: every expert resident.
    expert_cache_memory: int | None = None
    # tacit's AVX512-BF16 CPU kernels for this engine (kernels/cpu_kernels.py); False: torch everywhere.
    cpu_kernels: bool = True
    # GGML decode rows against bf16 activations (the dequantized model's arithmetic) rather than
    # int8-rounded ones (llama.cpp's; csrc/ggml_gemv.h).
    ggml_bf16_activations: bool = False
    rope: dict[str, Any] = field(init=False)
    # True when max_model_len came from the model rather than the user: only then is it capped.
    max_model_len_derived: bool = field(init=False)

    def __post_init__(self) -> None:
        check_quantization(self.quantization, self.quantization_group_size)
        if self.quantization in HF_QUANTIZATIONS and str(self.path).endswith(".gguf"):
            raise ValueError(
                f"quantization={self.quantization!r}: int8/int4 quantize a Hugging Face checkpoint at load; "
                f"a GGUF's weights are already quantized: use auto|gguf|none"
            )
        check_quantization_overrides(self.quantization_overrides)
        if self.expert_cache_memory is not None:
            if isinstance(self.expert_cache_memory, bool) or not isinstance(self.expert_cache_memory, int):
                raise ValueError(f"expert_cache_memory={self.expert_cache_memory!r} is invalid: must be a byte count")
            if self.expert_cache_memory <= 0:
                raise ValueError(f"expert_cache_memory={self.expert_cache_memory!r} is invalid: must be > 0 bytes")
            if str(self.path).endswith(".gguf") or self.quantization in HF_QUANTIZATIONS:
                raise ValueError(
                    "expert_cache_memory streams experts from an unquantized safetensors checkpoint; "
                    f"{self.path} with quantization={self.quantization!r} is not one"
                )
        # A copy, so the caller's dict (a recipe's, a CLI's) cannot change a built config.
        object.__setattr__(self, "quantization_overrides", dict(self.quantization_overrides))
        if self.quantization_overrides and (str(self.path).endswith(".gguf") or self.quantization == "gguf"):
            raise ValueError(
                "quantization_overrides apply to a Hugging Face checkpoint quantized at load; a GGUF's tensor "
                "types are fixed by the file (re-quantize it with llama.cpp's --tensor-type to change them)"
            )
        check_architecture_numbers(self.path, self.hf)
        hf = dict(self.hf)
        # transformers 5 writes some keys under their attribute-map alias; real checkpoints use the originals.
        for original, alias in _KEY_ALIASES:
            if hf.get(original) is None and hf.get(alias) is not None:
                hf[original] = hf[alias]
        object.__setattr__(self, "hf", hf)
        archs = hf.get("architectures") or []
        if not self.architecture:
            if not archs:
                raise ValueError(f"{self.path}: config has no 'architectures' entry; cannot tell which model this is")
            object.__setattr__(self, "architecture", archs[0])
        object.__setattr__(self, "rope", normalize_rope(hf))
        limit = int(hf.get("max_position_embeddings", 2048))
        object.__setattr__(self, "max_model_len_derived", not self.max_model_len)
        if not self.max_model_len:
            object.__setattr__(self, "max_model_len", limit)
        elif self.max_model_len > limit and self.rope["rope_type"] == "default":
            raise ValueError(f"max_model_len={self.max_model_len} exceeds the model's max_position_embeddings={limit}")

    def get(self, key: str, default: Any = None) -> Any:
        value = self.hf.get(key, default)
        return default if value is None else value

    @property
    def max_position_embeddings(self) -> int:
        return int(self.get("max_position_embeddings", 2048))

    @property
    def num_layers(self) -> int:
        return int(self.hf["num_hidden_layers"])

    @property
    def head_dim(self) -> int:
        return int(self.get("head_dim") or self.hf["hidden_size"] // self.hf["num_attention_heads"])

    @property
    def num_kv_heads(self) -> int:
        return int(self.get("num_key_value_heads", self.hf["num_attention_heads"]))


@dataclass(frozen=True)
class ParallelConfig:
    """How many processes run the model: tensor_parallel_size ranks, each holding 1/N of every
    layer's heads and features (tacit/distributed/, engine/executor.py)."""

    tensor_parallel_size: int = 1
    # MoE layers: each rank holds 1/N of the experts, whole, instead of 1/N of every expert.
    expert_parallel: bool = False
    # Torch-path steps of 2+ requests run as two micro-batches, each one's all-reduces in flight
    # while the other computes (worker/paths/two_batch_overlap.py). Off by default: on a CPU whose
    # ranks have one core each, the transfer and the other half's compute share that core.
    two_batch_overlap: bool = False
    # Attention data-parallel (SGLang's --enable-dp-attention): each rank holds the whole attention
    # and serves its own requests with its own KV pool, so MLA's latent cache is split by request
    # instead of copied on every rank; the MLPs stay split and run on all ranks' tokens, gathered
    # (layers/data_parallel.py).
    data_parallel_attention: bool = False
    # The Communicator the ranks' collectives run on: "auto" (the platform's default) or a name
    # in distributed/communicator.py's registry (checked by EngineArgs, which sees the registry).
    communicator: str = "auto"

    def __post_init__(self) -> None:
        n = self.tensor_parallel_size
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"tensor_parallel_size={n!r} is invalid: must be an integer >= 1")
        for flag in ("expert_parallel", "two_batch_overlap", "data_parallel_attention"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag}={getattr(self, flag)!r} is invalid: must be true or false")
        if self.two_batch_overlap and n == 1:
            raise ValueError(
                "two_batch_overlap=true needs tensor_parallel_size >= 2: one process has no communication to overlap"
            )
        if self.data_parallel_attention and n == 1:
            raise ValueError(
                "data_parallel_attention=true needs tensor_parallel_size >= 2: it spreads requests over the ranks"
            )
        if self.data_parallel_attention and self.two_batch_overlap:
            raise ValueError(
                "data_parallel_attention and two_batch_overlap cannot be combined: each rank's step is already "
                "its own requests; pick one"
            )


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    num_kv_blocks: int | None = None
    # Bytes for the KV pool when num_kv_blocks is not given.
    kv_cache_memory: int | None = None
    # Host memory (GiB) that preempted requests' KV blocks may be swapped to; vLLM's name and
    # default. 4 GiB holds ~180k tokens of SmolLM2-135M's bf16 KV (23 KB a token).
    swap_space: float = 4.0
    # What the KV cache stores: "auto" the model's dtype, or int8 rows with a scale each
    # (kernels/kv_quant.py): half of bf16's bytes, so twice the tokens in the same pool.
    cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        parse_kv_cache_dtype(self.cache_dtype, torch.float32)  # refuses an unknown one, naming the valid
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size={self.block_size!r} is invalid: must be an integer >= 1")
        if self.num_kv_blocks is not None and (not isinstance(self.num_kv_blocks, int) or self.num_kv_blocks < 1):
            raise ValueError(f"num_kv_blocks={self.num_kv_blocks!r} is invalid: must be an integer >= 1")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory={self.kv_cache_memory!r} is invalid: must be a byte count > 0")
        if not isinstance(self.swap_space, (int, float)) or self.swap_space < 0:
            raise ValueError(f"swap_space={self.swap_space!r} is invalid: must be GiB >= 0 (0 turns swapping off)")


# 512 tokens: on the default model (bf16, 2 cores) a 2,000-token prompt prefilled in one step
# took 1.5 s beside 32 decodes, so each of them waited 1.5 s for that token. Capped at 512, four
# steps of 0.28-0.38 s, 1.3 s in all; at 256, steps of 0.19-0.25 s but 1.7 s in all (each step
# pays the weights again). 512 cuts the stall 4x for no loss. Command: docs/benchmarks.md.
DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD = 512


# 256 tokens: the cut-in's prefill delays every request of the step it cuts into. An interactive
# turn's prompt (~30-200 tokens) prefills in ~40-150 ms on the default model (bf16, 2 cores);
# a longer prompt is not interactive-sized and waits for the step to end like everyone else.
DEFAULT_CUT_IN_PREFILL_TOKENS = 256


PREEMPTION_MODES = ("auto", "recompute", "swap")
SLO_ADMISSION = ("reject", "defer")
SLO_KEYS = ("ttft_ms", "tpot_ms")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    policy: str = "fcfs"
    # vLLM's knob: one request prefills at most this many tokens a step, so a long prompt
    # cannot fill the whole budget and stall everyone else's decode. 0 turns the cap off. See
    # DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD for the measured reason behind the default.
    long_prefill_token_threshold: int = DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD
    # vLLM's knob and default: how many prompts longer than the threshold prefill in one step.
    # The cap above bounds each; this bounds their sum. Without it four 1,500-token prompts
    # filled a 2,048-token step (~1 s) and put the interactive p99 TTFT at ~2 s in the
    # mixed-priority benchmark (docs/benchmarks.md).
    max_long_partial_prefills: int = 1
    # A request that has waited this long since arrival is served before every request that
    # has not (FCFS among such requests), and no newer request preempts it: the bound that
    # keeps priority, sjf and sla from starving anyone. None: strict order, as vLLM's priority.
    aging_s: float | None = 60.0
    # Default TTFT/TPOT targets per priority class, {priority: {"ttft_ms": .., "tpot_ms": ..}};
    # a request's own ttft_slo_ms / tpot_slo_ms win over its class's.
    slo_classes: dict[int, dict[str, float]] = field(default_factory=dict)
    # What the sla policy does with a request whose estimated TTFT already misses its target.
    slo_admission: str = "reject"
    preemption_mode: str = "auto"
    # A waiting request that outranks someone in the step in flight, with at most this many
    # prompt tokens, is prefilled between two of that step's layers rather than after it (the
    # online engine only; fcfs never lets anyone cut in). 0: never. See DEFAULT_CUT_IN_PREFILL_TOKENS.
    cut_in_prefill_tokens: int = DEFAULT_CUT_IN_PREFILL_TOKENS

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_long_partial_prefills"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} is invalid: must be an integer >= 1")
        if not isinstance(self.enable_chunked_prefill, bool):
            raise ValueError(
                f"enable_chunked_prefill={self.enable_chunked_prefill!r} is invalid: must be true or false"
            )
        t = self.long_prefill_token_threshold
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise ValueError(f"long_prefill_token_threshold={t!r} is invalid: must be an integer >= 0 (0: no cap)")
        t = self.cut_in_prefill_tokens
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise ValueError(f"cut_in_prefill_tokens={t!r} is invalid: must be an integer >= 0 (0: never cut in)")
        if self.aging_s is not None and (not isinstance(self.aging_s, (int, float)) or self.aging_s <= 0):
            raise ValueError(f"aging_s={self.aging_s!r} is invalid: must be seconds > 0, or None for no aging")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(
                f"preemption_mode={self.preemption_mode!r} is not known; valid: {', '.join(PREEMPTION_MODES)}"
            )
        if self.slo_admission not in SLO_ADMISSION:
            raise ValueError(f"slo_admission={self.slo_admission!r} is not known; valid: {', '.join(SLO_ADMISSION)}")
        # A copy, so the caller's dict (a recipe's, a CLI's) cannot change a built config.
        object.__setattr__(self, "slo_classes", {k: dict(v) for k, v in (self.slo_classes or {}).items()})
        for prio, targets in self.slo_classes.items():
            if not isinstance(prio, int) or isinstance(prio, bool):
                raise ValueError(f"slo_classes key {prio!r} is invalid: must be an integer priority")
            for key, ms in targets.items():
                if key not in SLO_KEYS:
                    raise ValueError(f"slo_classes[{prio}] key {key!r} is not known; valid: {', '.join(SLO_KEYS)}")
                if not isinstance(ms, (int, float)) or isinstance(ms, bool) or ms <= 0:
                    raise ValueError(f"slo_classes[{prio}][{key!r}]={ms!r} is invalid: must be milliseconds > 0")


def parse_slo_class(spec: str) -> tuple[int, dict[str, float]]:
    """'0:ttft=500,tpot=100' -> (0, {'ttft_ms': 500.0, 'tpot_ms': 100.0}) (the CLI's --slo-class)."""
    prio, sep, rest = spec.partition(":")
    try:
        targets = {f"{k.strip()}_ms": float(v) for k, v in (p.split("=") for p in rest.split(","))}
        if not sep:
            raise ValueError
        return int(prio), targets
    except ValueError:
        raise ValueError(
            f"--slo-class {spec!r} is invalid; write PRIORITY:ttft=MS,tpot=MS, e.g. 0:ttft=500,tpot=100"
        ) from None


@dataclass(frozen=True)
class EngineConfig:
    """The model, cache, scheduler and parallel configs together, and the checks that need more
    than one of them.

    It checks and never rewrites: resolving one config from another (such as raising
    max_num_batched_tokens to max_model_len without chunked prefill) is EngineArgs' job, done
    once before these are built (tacit/engine/arg_utils.py).
    """

    model: ModelConfig
    cache: CacheConfig
    scheduler: SchedulerConfig
    device: str = "cpu"
    seed: int = 0
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self) -> None:
        if self.scheduler.preemption_mode == "swap" and self.parallel.data_parallel_attention:
            raise ValueError(
                "preemption_mode='swap' with data_parallel_attention: a resumed request may land on another rank's "
                "KV pool, so preemption recomputes there; use preemption_mode 'auto' or 'recompute'"
            )
        if self.scheduler.preemption_mode == "swap" and not self.cache.swap_space:
            raise ValueError("preemption_mode='swap' needs swap_space > 0 (GiB of host memory for swapped KV)")
        if (
            not self.scheduler.enable_chunked_prefill
            and self.scheduler.max_num_batched_tokens < self.model.max_model_len
        ):
            # Without chunking a whole prompt must fit in one step's budget.
            raise ValueError(
                f"enable_chunked_prefill=False needs max_num_batched_tokens >= max_model_len "
                f"({self.scheduler.max_num_batched_tokens} < {self.model.max_model_len}): "
                f"a whole prompt must fit in one step"
            )


def fit_kv_capacity(config: EngineConfig, capacity_tokens: int) -> EngineConfig:
    """The config with a max_model_len derived from the model capped at the tokens the KV pool
    holds; the one resolution that waits for the model (the pool's size needs its layers).

    A sequence never holds more tokens than the pool, so a longer max_model_len only made every
    request without max_tokens fail (max_position_embeddings 10**12 loaded and then refused them
    all; Qwen3's 40,960 against a 2 GiB pool of ~14,600 tokens did the same). An explicit
    max_model_len stays the user's: requests beyond the pool are refused one by one.
    """
    model = config.model
    if not model.max_model_len_derived or model.max_model_len <= capacity_tokens:
        return config
    return replace(config, model=replace(model, max_model_len=capacity_tokens))
