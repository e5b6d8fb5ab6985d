"""vLLM's import path for EngineArgs (`from vllm.engine.arg_utils import EngineArgs`), kept so a
user's script ports unchanged; EngineArgs lives in tacit/config/engine_args.py."""

from tacit.config.engine_args import EngineArgs, load_recipe
from tacit.config.knobs import RECIPE_SECTIONS, knob

__all__ = ["EngineArgs", "RECIPE_SECTIONS", "knob", "load_recipe"]
