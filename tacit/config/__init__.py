"""The engine's configuration: the frozen configs it runs on (model, cache, scheduler, parallel,
engine), the checks they make, and the recipes that pick their settings.

EngineArgs, the knobs these configs are resolved from, lives in tacit.config.engine_args (vLLM's
path tacit.config.engine_args re-exports it); it is not re-exported here because it sits a tier
above: it checks names against the scheduling policies, which import SchedulerConfig.
"""

from tacit.config.cache import CacheConfig
from tacit.config.engine_config import EngineConfig, fit_kv_capacity
from tacit.config.model import ModelConfig, normalize_rope, parse_dtype
from tacit.config.parallel import ParallelConfig
from tacit.config.quantization import (
    HF_QUANTIZATIONS,
    QUANTIZATION_OVERRIDE_TYPES,
    QUANTIZATIONS,
    check_quantization,
    check_quantization_overrides,
    parse_quantization_overrides,
)
from tacit.config.recipe import Recipe, read_recipe
from tacit.config.scheduler import (
    DEFAULT_CUT_IN_PREFILL_TOKENS,
    DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD,
    PREEMPTION_MODES,
    SLO_ADMISSION,
    SLO_KEYS,
    SchedulerConfig,
    parse_slo_class,
)

__all__ = [
    "CacheConfig",
    "EngineConfig",
    "ModelConfig",
    "ParallelConfig",
    "SchedulerConfig",
    "Recipe",
    "fit_kv_capacity",
    "normalize_rope",
    "parse_dtype",
    "parse_slo_class",
    "read_recipe",
    "check_quantization",
    "check_quantization_overrides",
    "parse_quantization_overrides",
    "QUANTIZATIONS",
    "HF_QUANTIZATIONS",
    "QUANTIZATION_OVERRIDE_TYPES",
    "DEFAULT_CUT_IN_PREFILL_TOKENS",
    "DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD",
    "PREEMPTION_MODES",
    "SLO_ADMISSION",
    "SLO_KEYS",
]
