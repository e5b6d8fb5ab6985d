"""A model's fingerprint: what KV blocks saved by one engine must match before another engine
reuses them (the prefix cache's disk tier, worker/kv_offload_disk.py).

A block's hash (memory/block_hash.py) names its tokens only; the KV computed from those tokens
depends on everything below: the architecture and its config, the weights, the dtype and the
KV cache's dtype, the quantization the weights were loaded with, the kernels that computed them,
the block size, this rank's shard. The tokenizer does not change the KV of a token id, but a
different tokenizer means a different model to its users, so it is part of the name too.

The weights are not read whole (a 600 GB checkpoint would take minutes at every start): each
checkpoint file contributes its name, its size and 16 chunks of 64 KiB spread evenly over it
(1 MiB a file). Two different checkpoints of one shape differ in their first tensor's bytes
already; a file edited in place somewhere no chunk covers is not detected.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tacit.config import EngineConfig
from tacit.loader import ModelSource

_CHUNKS, _CHUNK_BYTES = 16, 64 << 10


def checkpoint_files(path: Path) -> list[Path]:
    """The files that hold a checkpoint's weights: a .gguf, or a directory's weight files."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".gguf", ".bin", ".pt") and p.is_file())


def _file_digest(h: "hashlib._Hash", path: Path) -> None:
    size = path.stat().st_size
    h.update(f"{path.name}:{size}".encode())
    with path.open("rb") as f:
        for i in range(_CHUNKS):
            f.seek(max(0, (size - _CHUNK_BYTES) * i // max(_CHUNKS - 1, 1)))
            h.update(f.read(_CHUNK_BYTES))


def model_fingerprint(source: ModelSource, config: EngineConfig, device_type: str) -> str:
    """A hex sha256 naming the model as its KV depends on it (module docstring)."""
    m = config.model
    h = hashlib.sha256()
    described = {
        "hf_config": source.hf_config,
        "architecture": m.architecture,
        "dtype": str(m.dtype),
        "quantization": [m.quantization, m.quantization_group_size, sorted(m.quantization_overrides.items())],
        "cpu_kernels": m.cpu_kernels,
        "ggml_bf16_activations": getattr(m, "ggml_bf16_activations", None),
        "kv_cache_dtype": config.cache.cache_dtype,
        "block_size": config.cache.block_size,
        "device_type": device_type,
    }
    h.update(json.dumps(described, sort_keys=True, default=str).encode())
    h.update(hashlib.sha256(source.tokenizer.tokenizer.to_str().encode()).digest())
    for path in checkpoint_files(Path(source.path)):
        _file_digest(h, path)
    return h.hexdigest()
