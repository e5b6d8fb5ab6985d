"""tacit: an LLM inference engine written as a book of optimization recipes."""

from tacit.platforms.huge_pages import request_transparent_huge_pages

request_transparent_huge_pages()  # before anything allocates: see tacit/platforms/huge_pages.py

from tacit.engine.arg_utils import EngineArgs  # noqa: E402
from tacit.entrypoints.llm import LLM  # noqa: E402
from tacit.outputs import CompletionOutput, Logprob, RequestOutput  # noqa: E402
from tacit.sampling_params import SamplingParams, StructuredOutputsParams  # noqa: E402

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
