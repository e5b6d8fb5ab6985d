"""SD/SDXL's CLIP tokenizers rebuilt from the BPE merges file that wheels ship (open_clip's
bpe_simple_vocab_16e6.txt.gz), for when no tokenizer/ directory is at hand: SDXL-shaped random
benchmarks, or a single-file checkpoint (`write_tokenizer_dirs` makes a directory for --tokenizer).

The vocabulary is CLIP's construction (OpenAI's simple_tokenizer.py): the 256 byte symbols, the
same with the end-of-word mark, one token per merge (the first 48,894 merges), then
<|startoftext|> and <|endoftext|> -- 49,408 ids, the same as openai/clip-vit-large-patch14's
vocab.json. SDXL's two tokenizers differ only in the pad token: "<|endoftext|>" for the first,
"!" for the second (as in the SDXL base repository's tokenizer_2/).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from typing import Any

# 49152 - 256 - 2: the vocabulary is 49408 = 2 x 256 byte tokens + merges + 2 specials.
N_MERGES = 49152 - 256 - 2
OPEN_CLIP_BPE = "bpe_simple_vocab_16e6.txt.gz"


def find_open_clip_bpe() -> Path | None:
    """The BPE file inside an installed open_clip, located without importing it (its import pulls torchvision)."""
    spec = importlib.util.find_spec("open_clip")
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / OPEN_CLIP_BPE
        if path.is_file():
            return path
    return None


def _vocab_and_merges(bpe_path: Path) -> tuple[dict[str, int], list[str]]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    try:
        lines = gzip.open(bpe_path, "rt", encoding="utf-8").read().split("\n")
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise ValueError(f"bpe={str(bpe_path)!r}: not a gzip'd CLIP BPE merges file ({e})") from e
    merges = [line for line in lines[1 : N_MERGES + 1] if line]  # line 0 is the "#version" header
    symbols = list(bytes_to_unicode().values())
    tokens = symbols + [s + "</w>" for s in symbols] + ["".join(m.split()) for m in merges]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    return {t: i for i, t in enumerate(tokens)}, merges


def write_tokenizer_dirs(bpe_path: str | Path, out_dir: str | Path, sdxl: bool = True, max_length: int = 77) -> Path:
    """Write out_dir/tokenizer (and out_dir/tokenizer_2 for SDXL) as CLIPTokenizer directories."""
    from transformers import CLIPTokenizer

    vocab, merges = _vocab_and_merges(Path(bpe_path))
    out = Path(out_dir)
    pads = {"tokenizer": "<|endoftext|>", "tokenizer_2": "!"} if sdxl else {"tokenizer": "<|endoftext|>"}
    for sub, pad in pads.items():
        (out / sub).mkdir(parents=True, exist_ok=True)
        (out / sub / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
        (out / sub / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
        tok = CLIPTokenizer(
            str(out / sub / "vocab.json"), str(out / sub / "merges.txt"), pad_token=pad, model_max_length=max_length
        )
        tok.save_pretrained(out / sub)
    return out


def clip_tokenizers(bpe_path: str | Path, out_dir: str | Path, sdxl: bool = True) -> tuple[Any, Any | None]:
    """(tokenizer, tokenizer_2 or None) built from the BPE file, via write_tokenizer_dirs(out_dir)."""
    from transformers import CLIPTokenizer

    out = write_tokenizer_dirs(bpe_path, out_dir, sdxl)
    return CLIPTokenizer.from_pretrained(out / "tokenizer"), (
        CLIPTokenizer.from_pretrained(out / "tokenizer_2") if sdxl else None
    )
