"""A Hugging Face model directory: config.json, safetensors shards, tokenizer, EOS ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open

from tacit.loader.progress import progress


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None


def safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(read_json(index)["weight_map"].values()))
        files = [path / n for n in names]
        missing = [str(f) for f in files if not f.exists()]
        if missing:
            raise FileNotFoundError(f"{index} lists shards that are not there: {', '.join(missing)}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        pickles = [p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth")]
        hint = (
            f" (found {', '.join(pickles)}: pickle checkpoints are never loaded; convert them to safetensors)"
            if pickles
            else ""
        )
        raise FileNotFoundError(f"{path}: no *.safetensors weights{hint}")
    return files


def iter_safetensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Stream tensors one at a time so peak memory is the model plus one tensor."""
    files = safetensors_files(path)
    handles = [safe_open(str(f), framework="pt") for f in files]
    names = [(h, k) for h in handles for k in h.keys()]
    for handle, name in progress(names, desc=f"loading {path.name}"):
        yield name, handle.get_tensor(name)


def hf_eos_token_ids(path: Path, config: dict) -> list[int]:
    gen = path / "generation_config.json"
    eos = read_json(gen).get("eos_token_id") if gen.exists() else None
    if eos is None:
        eos = config.get("eos_token_id")
    if eos is None:
        return []
    return list(eos) if isinstance(eos, list) else [int(eos)]
