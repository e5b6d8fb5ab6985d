"""The commands handlers send the engine thread (AsyncLLMEngine's one-way queue), applied between steps."""

from __future__ import annotations

from dataclasses import dataclass

from tacit.engine.request_stream import RequestStream
from tacit.sampling_params import SamplingParams


@dataclass
class _Add:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    priority: int
    stream: "RequestStream"
    check_queue: bool = True
    cache_salt: str | None = None


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Stop:
    pass
