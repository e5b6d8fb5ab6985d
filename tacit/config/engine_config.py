"""EngineConfig: the model, cache, scheduler and parallel configs together, and the one
resolution that waits for the model (fit_kv_capacity)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tacit.config.cache import CacheConfig
from tacit.config.model import ModelConfig
from tacit.config.parallel import ParallelConfig
from tacit.config.scheduler import SchedulerConfig
from tacit.config.speculative import SpeculativeConfig


@dataclass(frozen=True)
class EngineConfig:
    """The model, cache, scheduler and parallel configs together, and the checks that need more
    than one of them.

    It checks and never rewrites: resolving one config from another (such as raising
    max_num_batched_tokens to max_model_len without chunked prefill) is EngineArgs' job, done
    once before these are built (tacit/config/engine_args.py).
    """

    model: ModelConfig
    cache: CacheConfig
    scheduler: SchedulerConfig
    device: str = "cpu"
    seed: int = 0
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    speculative: SpeculativeConfig | None = None  # None: one token a step

    def __post_init__(self) -> None:
        if self.scheduler.preemption_mode == "swap" and self.parallel.data_parallel_attention:
            raise ValueError(
                "preemption_mode='swap' with data_parallel_attention: a resumed request may land on another rank's "
                "KV pool, so preemption recomputes there; use preemption_mode 'auto' or 'recompute'"
            )
        if self.cache.kv_offloading_size and self.parallel.data_parallel_attention:
            raise ValueError(
                "kv_offloading_size > 0 with data_parallel_attention: the second tier serves one KV pool, and "
                "data-parallel attention keeps one per rank; turn one of them off"
            )
        if self.scheduler.preemption_mode == "swap" and not self.cache.swap_space:
            raise ValueError("preemption_mode='swap' needs swap_space > 0 (GiB of host memory for swapped KV)")
        if self.speculative is not None and self.speculative.method == "mtp":
            self._check_mtp()
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

    def _check_mtp(self) -> None:
        """MTP drafts with the checkpoint's own next-token-prediction layers (DeepSeek-V3/R1's)."""
        model = self.model
        if model.architecture not in ("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM"):
            raise ValueError(
                f"speculative_config method='mtp' runs DeepSeek-V3/R1/V3.2's MTP layers; {model.path} is "
                f"{model.architecture}: use ngram, suffix or draft_model"
            )
        if int(model.hf.get("num_nextn_predict_layers") or 0) < 1:
            raise ValueError(
                f"speculative_config method='mtp' needs a checkpoint with MTP layers (num_nextn_predict_layers >= 1); "
                f"{model.path} has none (Kimi-K2 ships none): use ngram, suffix or draft_model"
            )
        if model.path.endswith(".gguf"):
            raise ValueError(
                f"speculative_config method='mtp' reads the MTP layers from a Hugging Face checkpoint directory; "
                f"{model.path} is a GGUF file"
            )
        if self.parallel.tensor_parallel_size > 1:
            raise ValueError(
                "speculative_config method='mtp' with tensor_parallel_size > 1 is not supported yet: the MTP layer "
                "runs unsplit on the driver, and the target's embedding and head it shares are split; use ngram, "
                "suffix or draft_model"
            )
        if model.expert_cache_memory is not None:
            raise ValueError(
                "speculative_config method='mtp' with expert_cache_memory: the MTP layer's experts are loaded whole, "
                "not streamed; drop one of them"
            )
        if self.parallel.data_parallel_attention:
            raise ValueError(
                "speculative_config method='mtp' with data_parallel_attention: the MTP layer drafts on the driver "
                "from every request's hidden states, which data-parallel attention leaves on the rank that ran them"
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
