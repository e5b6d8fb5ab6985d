"""The prefix cache's disk tier on file: one file per block of one rank's KV layers.

    <dir>/<model fingerprint>/rank<r>-of-<n>/<block hash hex>.kv

A file is MAGIC, a 4-byte little-endian header length, a JSON header (the fingerprint, the block
hash, each layer's dtype and shape, the payload's length and crc32) and the payload: every
layer's slice of the block, in layer order. It is written under a temporary name and renamed, so
a crash mid-write leaves no file under a block's name.

Before use every file is checked whole (scan): a file of another model (its fingerprint is in
its directory's name and in its header), of other layer shapes, truncated, or whose crc32 does
not match is dropped with a warning and deleted, never loaded. A model's fingerprint
(worker/model_fingerprint.py) covers its config, weights, dtypes, tokenizer and block size.
"""

from __future__ import annotations

import json
import logging
import math
import os
import struct
import zlib
from pathlib import Path

import torch

logger = logging.getLogger("tacit.kv_offload")

MAGIC = b"TACITKV1"
_LEN = struct.Struct("<I")
_SUFFIX = ".kv"
_TMP_PREFIX = ".tmp-"


class CorruptEntry(ValueError):
    """A block file that must not be loaded; the message says why."""


def layout_of(tensors: list[torch.Tensor]) -> list[list]:
    """[[dtype, shape], ...]: what a block's per-layer slices must look like."""
    return [[str(t.dtype).removeprefix("torch."), list(t.shape)] for t in tensors]


def entry_dir(root: str | Path, fingerprint: str, rank: int, world: int) -> Path:
    return Path(root) / fingerprint / f"rank{rank}-of-{world}"


def write_block(directory: Path, fingerprint: str, block_hash: bytes, tensors: list[torch.Tensor]) -> None:
    parts = [t.contiguous().reshape(-1).view(torch.uint8).numpy() for t in tensors]
    crc, nbytes = 0, 0
    for p in parts:
        crc = zlib.crc32(p, crc)
        nbytes += p.nbytes
    header = json.dumps(
        {
            "fingerprint": fingerprint,
            "block_hash": block_hash.hex(),
            "layers": layout_of(tensors),
            "nbytes": nbytes,
            "crc32": crc,
        }
    ).encode()
    final = directory / (block_hash.hex() + _SUFFIX)
    tmp = directory / (_TMP_PREFIX + final.name)
    with tmp.open("wb") as f:
        f.write(MAGIC)
        f.write(_LEN.pack(len(header)))
        f.write(header)
        for p in parts:
            f.write(memoryview(p))
    os.replace(tmp, final)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CorruptEntry(f"unknown dtype {name!r}")
    return dtype


def read_block(path: Path, fingerprint: str, layout: list[list]) -> list[torch.Tensor]:
    """The per-layer slices saved in `path`, checked whole; CorruptEntry says why not."""
    data = path.read_bytes()
    if data[: len(MAGIC)] != MAGIC:
        raise CorruptEntry("not a tacit KV block file (bad magic)")
    start = len(MAGIC) + _LEN.size
    if len(data) < start:
        raise CorruptEntry("truncated header")
    (hlen,) = _LEN.unpack_from(data, len(MAGIC))
    try:
        header = json.loads(data[start : start + hlen])
    except ValueError as e:
        raise CorruptEntry(f"unreadable header ({e})") from None
    if not isinstance(header, dict):
        raise CorruptEntry("unreadable header (not an object)")
    if header.get("fingerprint") != fingerprint:
        raise CorruptEntry("saved by another model (fingerprint differs)")
    if header.get("block_hash") != path.name.removesuffix(_SUFFIX):
        raise CorruptEntry("its header names another block")
    if header.get("layers") != layout:
        raise CorruptEntry(f"layer layout {header.get('layers')} differs from this engine's")
    payload = memoryview(data)[start + hlen :]
    if len(payload) != header.get("nbytes"):
        raise CorruptEntry(f"payload of {len(payload)} bytes, header says {header.get('nbytes')} (truncated?)")
    if zlib.crc32(payload) != header.get("crc32"):
        raise CorruptEntry("crc32 mismatch (corrupt)")
    out, offset = [], 0
    for dtype_name, shape in layout:
        dtype = _dtype(dtype_name)
        n = dtype.itemsize * math.prod(shape)
        # bytearray: frombuffer wants a writable buffer, and the tensor must outlive `data`.
        out.append(torch.frombuffer(bytearray(payload[offset : offset + n]), dtype=dtype).reshape(shape))
        offset += n
    return out


def scan(directory: Path, fingerprint: str, layout: list[list]) -> list[bytes]:
    """The block hashes of the valid files in `directory`, least recently written first; every
    other file there (corrupt, another layout, a temporary left by a crash) is deleted, with a
    warning for the ones that claimed to be blocks."""
    held: list[tuple[float, bytes]] = []
    for path in directory.iterdir():
        if path.name.startswith(_TMP_PREFIX):
            path.unlink(missing_ok=True)
            continue
        if path.suffix != _SUFFIX:
            continue
        try:
            block_hash = bytes.fromhex(path.name.removesuffix(_SUFFIX))
            read_block(path, fingerprint, layout)
        except (CorruptEntry, ValueError, OSError) as e:
            logger.warning("KV offloading: dropping %s: %s", path, e)
            path.unlink(missing_ok=True)
            continue
        held.append((path.stat().st_mtime, block_hash))
    return [h for _, h in sorted(held)]
