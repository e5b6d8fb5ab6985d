"""POST /v1/embeddings: each input becomes an embedding request (SamplingParams.pooling), scheduled
beside the generation traffic like any prompt; the reply carries one vector per input, in order."""

from __future__ import annotations

import asyncio
import base64
import time

import numpy as np
from fastapi import Request

from tacit.engine.input_processor import check_token_ids
from tacit.entrypoints.openai.embeddings_protocol import EmbeddingData, EmbeddingRequest, EmbeddingResponse
from tacit.entrypoints.openai.errors import bad_request
from tacit.entrypoints.openai.protocol import UsageInfo, random_id
from tacit.entrypoints.openai.serving_common import ServingContext, final_outputs_unless_disconnected
from tacit.pooling_params import PoolingParams
from tacit.sampling_params import SamplingParams


class EmbeddingServing:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def create(self, req: EmbeddingRequest, raw: Request) -> EmbeddingResponse | None:
        ctx = self.ctx
        ctx.check_model(req.model)
        try:
            pooling = PoolingParams(dimensions=req.dimensions)
        except ValueError as e:
            raise bad_request(str(e).removeprefix("PoolingParams."), "dimensions") from None
        if req.dimensions is not None and req.dimensions > ctx.engine.hidden_size:
            raise bad_request(
                f"dimensions={req.dimensions} is invalid: this model's embeddings have {ctx.engine.hidden_size} values",
                "dimensions",
            )
        inputs = req.inputs()
        texts = [x for x in inputs if isinstance(x, str)]
        if texts:
            ctx.refuse_surely_too_long(texts, "input")
        for x in inputs:
            if not isinstance(x, str):
                try:
                    check_token_ids(x, ctx.vocab_size, "input token ids")
                except ValueError as e:
                    raise bad_request(str(e), "input") from None
        # Off the event loop: tokenizing a long batch would stall every stream.
        prompts = await asyncio.to_thread(
            lambda: [ctx.tokenizer.encode(x) if isinstance(x, str) else x for x in inputs]
        )
        for i, ids in enumerate(prompts):
            if len(ids) > ctx.max_model_len:
                raise bad_request(
                    f"input {i} is {len(ids)} tokens; this model's maximum context length is {ctx.max_model_len} "
                    "tokens: shorten or split it",
                    "input",
                )
        request_id = random_id("embd")
        streams = await ctx.submit(prompts, SamplingParams(max_tokens=0, pooling=pooling), request_id, 0)
        outs = await final_outputs_unless_disconnected(raw, ctx, streams)
        if outs is None:
            return None
        data = [EmbeddingData(index=i, embedding=_encode(o.embedding, req.encoding_format)) for i, o in enumerate(outs)]
        tokens = sum(len(ids) for ids in prompts)
        return EmbeddingResponse(
            id=request_id,
            created=int(time.time()),
            model=ctx.model_name,
            data=data,
            usage=UsageInfo(prompt_tokens=tokens, total_tokens=tokens),
        )


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":  # what the openai client sends by default: float32, little-endian
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector
