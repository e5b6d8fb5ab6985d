"""CLIP tokenizers rebuilt from a BPE merges file (open_clip's format), on a 4-merge file written here."""

from __future__ import annotations

import gzip

import pytest

from tacit.diffusion.clip_bpe import clip_tokenizers


def _bpe(path):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write('"bpe_simple_vocab_16e6.txt#version: 0.2\nt h\nth e</w>\nc a\nca t</w>\n')
    return path


def test_vocabulary_layout_and_sdxl_pad_tokens(tmp_path):
    tok, tok2 = clip_tokenizers(_bpe(tmp_path / "bpe.txt.gz"), tmp_path / "out")
    # 256 byte symbols, 256 with </w>, then one id per merge (512..515), then the two specials.
    assert tok.convert_tokens_to_ids(["!", "!</w>", "th", "the</w>", "cat</w>"]) == [0, 256, 512, 513, 515]
    ids = tok("The cat", padding="max_length", max_length=8).input_ids
    assert ids == [516, 513, 515, 517, 517, 517, 517, 517]  # lower-cased, merged, padded with <|endoftext|>
    assert tok2("The cat", padding="max_length", max_length=8).input_ids[4:] == [0, 0, 0, 0]  # SDXL pads with "!"
    assert tok.model_max_length == tok2.model_max_length == 77
    assert (tmp_path / "out" / "tokenizer_2").is_dir()  # usable as a single-file checkpoint's --tokenizer DIR


def test_sd15_has_one_tokenizer_and_bad_file_is_named(tmp_path):
    _, tok2 = clip_tokenizers(_bpe(tmp_path / "bpe.txt.gz"), tmp_path / "out", sdxl=False)
    assert tok2 is None and not (tmp_path / "out" / "tokenizer_2").exists()
    (tmp_path / "plain.txt").write_text("t h\n")
    with pytest.raises(ValueError, match="not a gzip'd CLIP BPE merges file"):
        clip_tokenizers(tmp_path / "plain.txt", tmp_path / "out2")


def test_open_clips_real_vocabulary_gives_clips_ids(tmp_path):
    from tacit.diffusion.clip_bpe import find_open_clip_bpe

    bpe = find_open_clip_bpe()
    if bpe is None:
        pytest.skip("open_clip's BPE file is not installed (scripts/setup.sh installs it)")
    tok, _ = clip_tokenizers(bpe, tmp_path / "out")
    assert len(tok) == 49408  # openai/clip-vit-large-patch14's vocab.json
    # the ids openai/clip-vit-large-patch14's tokenizer gives this prompt
    assert tok("a photo of a cat").input_ids == [49406, 320, 1125, 539, 320, 2368, 49407]
