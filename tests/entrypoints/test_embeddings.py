"""Embeddings (issue 35): LLM.embed and POST /v1/embeddings pool a prompt's final hidden states
(LAST, MEAN, CLS; Matryoshka `dimensions`; L2-normalised) exactly as transformers' hidden states
pooled by hand, through the scheduler beside generation traffic, chunked prefill included; the
official openai client's embeddings.create (base64 by default) gets the same vectors; bad input
is a 400 naming the field."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from tacit import LLM, SamplingParams
from tacit.pooling_params import PoolingParams

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from tacit.engine.async_engine import AsyncLLMEngine  # noqa: E402
from tacit.entrypoints.openai.api_server import build_app  # noqa: E402

PROMPTS = [[5, 6, 7, 8, 9], list(range(20, 60)), [3] * 17]


@pytest.fixture(scope="module")
def qwen3(tiny_model_factory):
    return tiny_model_factory("qwen3")


def reference(qwen3, prompt: list[int], pooling: PoolingParams) -> torch.Tensor:
    """transformers' final hidden states (the base model's last_hidden_state), pooled by hand."""
    with torch.no_grad():
        h = qwen3[0].model(torch.tensor([prompt])).last_hidden_state[0]
    v = {"LAST": h[-1], "MEAN": h.mean(0), "CLS": h[0]}[pooling.pooling_type]
    if pooling.dimensions is not None:
        v = v[: pooling.dimensions]
    return torch.nn.functional.normalize(v, dim=0) if pooling.normalize else v


@pytest.mark.parametrize(
    "pooling",
    [PoolingParams(), PoolingParams("MEAN"), PoolingParams("CLS"), PoolingParams(dimensions=16, normalize=False)],
    ids=["last", "mean", "cls", "matryoshka-16-raw"],
)
@pytest.mark.parametrize("engine_kw", [{}, {"max_num_batched_tokens": 16}], ids=["whole", "chunked"])
def test_embed_equals_transformers_pooled_hidden_states(qwen3, pooling, engine_kw):
    llm = LLM(str(qwen3[2]), dtype="float32", **engine_kw)
    for p, out in zip(PROMPTS, llm.embed(PROMPTS, pooling)):
        got = torch.tensor(out.outputs.embedding)
        torch.testing.assert_close(got, reference(qwen3, p, pooling), atol=1e-5, rtol=1e-5)
        assert out.prompt_token_ids == p
    assert llm.engine.get_stats().kv_blocks_used == 0


def test_embedding_requests_run_beside_generation_and_change_nothing(qwen3):
    """Embedding and generation requests in the same steps: both answer as they do alone; a LAST
    embedding may read the prefix cache (a repeated prompt), a MEAN one never does."""
    llm = LLM(str(qwen3[2]), dtype="float32")
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    alone_tokens = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, greedy)]
    alone_vectors = [o.outputs.embedding for o in llm.embed(PROMPTS)]
    engine = llm.engine
    gen = [engine.add_request(p, greedy) for p in PROMPTS]
    emb = [engine.add_request(p, SamplingParams(max_tokens=0, pooling=PoolingParams())) for p in PROMPTS]
    mean = engine.add_request(PROMPTS[1], SamplingParams(max_tokens=0, pooling=PoolingParams("MEAN")))
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    assert [done[r].outputs[0].token_ids for r in gen] == alone_tokens
    for r, want in zip(emb, alone_vectors):
        torch.testing.assert_close(torch.tensor(done[r].embedding), torch.tensor(want), atol=1e-5, rtol=1e-5)
    assert done[emb[1]].num_cached_tokens > 0 and done[mean].num_cached_tokens == 0
    mean_want = reference(qwen3, PROMPTS[1], PoolingParams("MEAN"))
    torch.testing.assert_close(torch.tensor(done[mean].embedding), mean_want, atol=1e-5, rtol=1e-5)


def test_bad_pooling_params_are_named(qwen3):
    with pytest.raises(ValueError, match="pooling_type='MAX' is invalid: one of LAST, MEAN, CLS"):
        PoolingParams("MAX")
    with pytest.raises(ValueError, match="pooling=.* needs max_tokens=0"):
        SamplingParams(max_tokens=4, pooling=PoolingParams())
    llm = LLM(str(qwen3[2]), dtype="float32")
    with pytest.raises(ValueError, match="dimensions=65 is invalid: this model's embeddings have 64 values"):
        llm.embed([PROMPTS[0]], PoolingParams(dimensions=65))


@pytest.fixture(scope="module")
def engine(qwen3):
    e = AsyncLLMEngine.from_engine_args(model=str(qwen3[2]), dtype="float32")
    e.start()
    yield e
    e.shutdown()


def _post_all(engine, bodies: list[dict]) -> list[httpx.Response]:
    app = build_app(engine, "tiny/q")

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return [await c.post("/v1/embeddings", json=b) for b in bodies]

    return asyncio.run(run())


def test_v1_embeddings_with_the_official_client(qwen3, engine):
    app = build_app(engine, "tiny/q")
    text = "The quick brown fox jumps over the lazy dog."

    async def run():
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
        client = openai.AsyncOpenAI(base_url="http://t/v1", api_key="unused", http_client=http, max_retries=0)
        async with http:
            default = await client.embeddings.create(model="tiny/q", input=[text, "hello"])  # base64 on the wire
            floats = await client.embeddings.create(model="tiny/q", input=PROMPTS[1], encoding_format="float")
            short = await client.embeddings.create(model="tiny/q", input=text, dimensions=16)
        return default, floats, short

    default, floats, short = asyncio.run(run())
    ids = qwen3[1].encode(text).ids
    assert [d.index for d in default.data] == [0, 1] and default.model == "tiny/q"
    torch.testing.assert_close(
        torch.tensor(default.data[0].embedding), reference(qwen3, ids, PoolingParams()), atol=1e-5, rtol=1e-5
    )
    assert default.usage.prompt_tokens == len(ids) + len(qwen3[1].encode("hello").ids)
    torch.testing.assert_close(
        torch.tensor(floats.data[0].embedding), reference(qwen3, PROMPTS[1], PoolingParams()), atol=1e-5, rtol=1e-5
    )
    v = np.asarray(short.data[0].embedding)
    assert v.shape == (16,) and abs(np.linalg.norm(v) - 1) < 1e-5


@pytest.mark.parametrize(
    "body, param",
    [
        ({"input": ""}, None),
        ({"input": []}, None),
        ({"input": "hi", "dimensions": 0}, "dimensions"),
        ({"input": "hi", "dimensions": 65}, "dimensions"),
        ({"input": [[5, 6], [100000]]}, "input"),
        ({"input": [7] * 5000}, "input"),
        ({"input": "hi", "encoding_format": "int8"}, None),
        ({"input": "hi", "normalize": False}, None),
    ],
    ids=["empty", "empty-list", "dims-0", "dims-over", "bad-id", "too-long", "format", "unknown-field"],
)
def test_bad_embedding_requests_are_400s_naming_the_field(engine, body, param):
    (r,) = _post_all(engine, [{"model": "tiny/q", **body}])
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    if param is not None:
        assert error["param"] == param, error
    (ok,) = _post_all(engine, [{"model": "tiny/q", "input": "still served"}])
    assert ok.status_code == 200 and len(ok.json()["data"][0]["embedding"]) == 64
