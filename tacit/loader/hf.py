"""A Hugging Face model directory: config.json, safetensors shards, tokenizer, EOS ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator

import torch
from safetensors import SafetensorError, safe_open

from tacit.loader.progress import progress
from tacit.loader.safetensors_check import check_safetensors_file
from tacit.loader.shards import Shard, narrow_tensor


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None


def safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        doc = read_json(index)
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(n, str) for n in weight_map.values()):
            raise ValueError(f"{index}: weight_map is invalid: must be an object of tensor name -> shard file name")
        names = sorted(set(weight_map.values()))
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


def iter_safetensors(
    path: Path, skip: Callable[[str], bool] | None = None, shards: dict[str, Shard] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Check every shard's header against its file now (one small read each, so a lying or
    truncated file fails before the model is allocated), then stream tensors one at a time so
    peak memory is the model plus one tensor. Tensors `skip` names are never read (streamed
    MoE experts); a tensor `shards` names is read only in its tensor-parallel slice."""
    files = safetensors_files(path)
    for f in files:
        check_safetensors_file(f)
    return _stream_safetensors(path, files, skip, shards or {})


def _read(handle, name: str, shard: Shard | None) -> torch.Tensor:
    if shard is None:
        return handle.get_tensor(name)
    dim, start, length = shard
    view = handle.get_slice(name)
    shape = view.get_shape()
    if dim >= len(shape) or start + length > shape[dim]:
        # narrow_tensor words the shape error; reading the whole tensor first costs nothing here.
        return narrow_tensor(name, handle.get_tensor(name), shard)
    index = tuple(slice(start, start + length) if d == dim else slice(None) for d in range(len(shape)))
    return view[index]


def _stream_safetensors(
    path: Path, files: list[Path], skip: Callable[[str], bool] | None, shards: dict[str, Shard]
) -> Iterator[tuple[str, torch.Tensor]]:
    names = []
    for f in files:
        # Checked above; a file changed since still fails with its name, not a traceback.
        try:
            handle = safe_open(str(f), framework="pt")
        except SafetensorError as e:
            raise ValueError(f"{f} is not a readable safetensors file: {e}") from None
        # A tensor whose shard is None belongs to another tensor-parallel rank: never read.
        names += [
            (f, handle, k)
            for k in handle.keys()
            if (skip is None or not skip(k)) and not (k in shards and shards[k] is None)
        ]
    for f, handle, name in progress(names, desc=f"loading {path.name}"):
        try:
            tensor = _read(handle, name, shards.get(name))
        except SafetensorError as e:
            raise ValueError(f"{f}: tensor {name!r} cannot be read: {e}") from None
        yield name, tensor


def hf_eos_token_ids(path: Path, config: dict) -> list[int]:
    gen = path / "generation_config.json"
    eos = read_json(gen).get("eos_token_id") if gen.exists() else None
    if eos is None:
        eos = config.get("eos_token_id")
    if eos is None:
        return []
    return list(eos) if isinstance(eos, list) else [int(eos)]


# generation_config.json's sampling values a request falls back to where it sets none (vLLM's
# get_diff_sampling_param, less max_new_tokens).
GENERATION_CONFIG_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def hf_sampling_defaults(directory: Path) -> dict[str, float | int]:
    """The sampling values the generation_config.json in `directory` sets ({} without one)."""
    gen = directory / "generation_config.json"
    if not gen.exists():
        return {}
    doc = read_json(gen)
    if not isinstance(doc, dict):
        raise ValueError(f"{gen} is invalid: must be a JSON object")
    return {k: doc[k] for k in GENERATION_CONFIG_SAMPLING_KEYS if doc.get(k) is not None}
