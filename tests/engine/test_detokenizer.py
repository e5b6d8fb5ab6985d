import pytest

from tacit.engine.detokenizer import IncrementalDetokenizer
from tacit.tokenizer import Tokenizer

from tiny_models import build_tokenizer

TEXTS = [
    "Grüße aus München, naïve café",
    "東京 🙂🚀 Привет мир",
    "def main():\n    return 42\n",
    "  leading and trailing spaces  ",
    "<|im_start|>special<|im_end|> text",
]


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(build_tokenizer())


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_equals_full_decode(tok, text):
    prompt = tok.encode("Prompt: ")
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, prompt)
    pieces = [detok.step(i) for i in ids]
    assert "".join(pieces) == tok.decode(ids)
    assert all("\ufffd" not in p for p in pieces)  # never half a character


def test_long_stream_keeps_window_small(tok):
    ids = tok.encode("Paris is the capital of France. " * 40, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, [])
    assert "".join(detok.step(i) for i in ids) == tok.decode(ids)
    assert len(detok.ids) < 80


def test_sentencepiece_style_spaces():
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "▁Hello": 1, "▁world": 2, "!": 3, "▁": 4}
    hf = HFTokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Metaspace()
    hf.decoder = decoders.Metaspace()
    tok = Tokenizer(hf)
    detok = IncrementalDetokenizer(tok, [1])
    # Decoding "▁world" alone would drop its space; with the prompt as context it must not.
    assert detok.step(2) + detok.step(3) == " world!"
