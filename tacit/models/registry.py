"""Architecture name (config.json "architectures") -> model class."""

from __future__ import annotations

from torch import nn

from tacit.models.deepseek_v3 import DeepseekV3ForCausalLM
from tacit.models.deepseek_v32 import DeepseekV32ForCausalLM, GlmMoeDsaForCausalLM
from tacit.models.gemma3 import Gemma3ForCausalLM
from tacit.models.gpt_oss import GptOssForCausalLM
from tacit.models.llama import LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM
from tacit.models.qwen3_moe import Qwen3MoeForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "DeepseekV3ForCausalLM": DeepseekV3ForCausalLM,
    "GptOssForCausalLM": GptOssForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
    "DeepseekV32ForCausalLM": DeepseekV32ForCausalLM,
    "GlmMoeDsaForCausalLM": GlmMoeDsaForCausalLM,
}


def get_model_class(architecture: str) -> type[nn.Module]:
    cls = MODEL_REGISTRY.get(architecture)
    if cls is None:
        raise ValueError(
            f"architecture {architecture!r} is not supported; supported: {', '.join(sorted(MODEL_REGISTRY))}"
        )
    return cls
