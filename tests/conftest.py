import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

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
def tiny_llama(tiny_model_factory):
    return tiny_model_factory("llama")
