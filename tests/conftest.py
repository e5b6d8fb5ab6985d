import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from near_ties import save_bf16_valued  # noqa: E402

from tiny_models import build_hf_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """Build each tiny architecture once per session: (hf_model, tokenizer, path)."""
    cache: dict = {}

    def get(arch: str):
        if arch not in cache:
            path = tmp_path_factory.mktemp(arch)
            model, tok = build_hf_model(arch, path)
            cache[arch] = (model, tok, path)
        return cache[arch]

    return get


@pytest.fixture(scope="session")
def tiny_bf16_valued_model_factory(tmp_path_factory):
    """Each tiny architecture with its weights rounded to bf16 (see near_ties.save_bf16_valued),
    built once per session: (hf_model, tokenizer, path)."""
    cache: dict = {}

    def get(arch: str):
        if arch not in cache:
            path = tmp_path_factory.mktemp(f"{arch}_bf16_valued")
            model, tok = build_hf_model(arch, path)
            cache[arch] = (model, tok, save_bf16_valued(model, path))
        return cache[arch]

    return get


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_factory):
    return tiny_model_factory("llama")


@pytest.fixture
def bf16_ggml_activations(monkeypatch):
    """Engines built in the test multiply GGML decode rows against bf16 activations (the
    dequantized model's arithmetic) instead of llama.cpp's int8-per-block ones, for tests that
    compare tokens exactly: TACIT_GGML_BF16_ACTIVATIONS=1, EngineArgs.ggml_bf16_activations' default."""
    monkeypatch.setenv("TACIT_GGML_BF16_ACTIVATIONS", "1")


@pytest.fixture
def no_matplotlib(monkeypatch):
    """matplotlib made unimportable, as on an install without the bench extra."""
    import builtins

    real_import = builtins.__import__

    def refuse(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", refuse)
