"""A prompt far past the context is refused before it is tokenized: quickly, with /health
answering throughout and the server's memory back where it was. The note's 12 MB measurement on
the default model is `python scripts/oversized_prompt_check.py --megabytes 12`; here 2 MB on a
tiny model, with the memory bound scaled to it (50 MB for 12 MB: 8.3 MB for 2)."""

import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from tacit.bench.launch import TacitServer  # noqa: E402
from tacit.bench.oversized import oversized_prompt_check  # noqa: E402


@pytest.fixture(scope="module")
def server(tiny_llama):
    with TacitServer(["--model", str(tiny_llama[2]), "--dtype", "float32"], ready_timeout_s=120) as s:
        yield s


def test_an_oversized_prompt_is_refused_at_once_and_keeps_no_memory(server):
    oversized_prompt_check(server.url, server.proc.pid, 2.0, settle_s=0.5)  # first-request allocations
    r = oversized_prompt_check(server.url, server.proc.pid, 2.0)
    assert r["status"] == 400 and "the prompt is at least" in r["message"], r
    assert r["refused_s"] < 1.0, r
    assert r["health_max_s"] < 0.2, r
    assert r["rss_after_mb"] - r["rss_before_mb"] < 50 * 2 / 12, r


def test_a_long_prompt_that_must_be_tokenized_leaves_health_answering(server):
    """Under the character bound, so it is tokenized (on a thread, the GIL released) and then
    refused by its exact count."""
    import httpx

    ctx = httpx.get(f"{server.url}/v1/models").json()["data"][0]["max_model_len"]
    r = oversized_prompt_check(server.url, server.proc.pid, 0.05)  # the bound is 4 x 13 x 1024 characters
    assert r["status"] == 400 and f"maximum context length is {ctx} tokens" in r["message"], r
    assert "the prompt is at least" not in r["message"], r  # it took the exact path
    assert r["health_max_s"] < 0.2, r
