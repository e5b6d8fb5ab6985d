"""tacit: an LLM inference engine written as a book of optimization recipes."""

from tacit.engine.arg_utils import EngineArgs
from tacit.entrypoints.llm import LLM
from tacit.outputs import CompletionOutput, Logprob, RequestOutput
from tacit.sampling_params import SamplingParams, StructuredOutputsParams

__all__ = [
    "LLM",
    "EngineArgs",
    "SamplingParams",
    "StructuredOutputsParams",
    "RequestOutput",
    "CompletionOutput",
    "Logprob",
]
__version__ = "0.1.0"
