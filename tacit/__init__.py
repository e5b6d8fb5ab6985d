"""tacit: an LLM inference engine written as a book of optimization recipes.

`import tacit` is cheap and changes nothing in the process: the public names are bound on first
use (PEP 562), so neither torch nor the engine is imported until one of them is asked for. The
first such use is also where 2 MB pages are requested for torch's CPU allocator
(platforms/huge_pages.py): torch reads the request at its first allocation, and importing the
engine's modules already allocates, so building the engine would be too late.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and the import-rule test see; bound lazily below
    from tacit.config.engine_args import EngineArgs
    from tacit.entrypoints.llm import LLM
    from tacit.outputs import CompletionOutput, EmbeddingRequestOutput, Logprob, RequestOutput
    from tacit.pooling_params import PoolingParams
    from tacit.sampling_params import SamplingParams, StructuredOutputsParams

# public name -> the module that defines it
_LAZY: dict[str, str] = {
    "LLM": "tacit.entrypoints.llm",
    "EngineArgs": "tacit.config.engine_args",
    "SamplingParams": "tacit.sampling_params",
    "StructuredOutputsParams": "tacit.sampling_params",
    "PoolingParams": "tacit.pooling_params",
    "RequestOutput": "tacit.outputs",
    "EmbeddingRequestOutput": "tacit.outputs",
    "CompletionOutput": "tacit.outputs",
    "Logprob": "tacit.outputs",
}

__all__ = [  # written out (not list(_LAZY)) so linters see the TYPE_CHECKING names exported
    "LLM",
    "EngineArgs",
    "SamplingParams",
    "StructuredOutputsParams",
    "PoolingParams",
    "RequestOutput",
    "EmbeddingRequestOutput",
    "CompletionOutput",
    "Logprob",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tacit' has no attribute {name!r}")
    from tacit.platforms.huge_pages import request_transparent_huge_pages

    request_transparent_huge_pages()  # before the engine's modules import torch and allocate
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later uses skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
