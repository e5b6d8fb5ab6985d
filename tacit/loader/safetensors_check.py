"""A safetensors file's header checked against the file itself, before any tensor is read.

A header that lies (offsets past the end, a span that is not dtype size x shape, two tensors
over the same bytes) or a truncated file used to surface as a SafetensorError traceback, or
only once the model was allocated. Reading the headers costs one small read per shard, so
open_model checks every shard first and the error names the file, the tensor and the field.
"""

from __future__ import annotations

import json
import math
import struct
from numbers import Integral
from pathlib import Path
from typing import Any

# Bytes per element of every dtype the safetensors format defines.
DTYPE_BYTES: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
# The safetensors library refuses headers over 100 MB; the same bound keeps a lying length
# field from making us read a whole multi-GB shard as "header".
MAX_HEADER_BYTES = 100_000_000


def _is_count(x: Any) -> bool:
    return isinstance(x, Integral) and not isinstance(x, bool) and x >= 0


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """(header, bytes of tensor data after it), the length field checked against the file size."""
    size = path.stat().st_size
    if size < 8:
        raise ValueError(f"{path}: {size} bytes is too short for a safetensors file (it starts with an 8-byte length)")
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > min(MAX_HEADER_BYTES, size - 8):
            raise ValueError(
                f"{path}: the header length field says {length} bytes, but must be at most "
                f"{min(MAX_HEADER_BYTES, size - 8)} (the file's {size} bytes less 8, and 100 MB): "
                f"the file is truncated or not safetensors"
            )
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: the safetensors header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the safetensors header must be a JSON object, got {type(header).__name__}")
    return header, size - 8 - length


def check_safetensors_file(path: Path) -> None:
    """Every tensor's dtype, shape and data_offsets valid, inside the file, sized dtype x shape,
    and the tensors tiling the data exactly (what safetensors itself demands), so the reads that
    follow cannot fail or run past the end."""
    header, data_len = read_header(path)
    spans: list[tuple[int, int, str]] = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        where = f"{path}: tensor {name!r}"
        if not isinstance(info, dict):
            raise ValueError(f"{where}: its entry must be an object with dtype, shape and data_offsets")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"{where}: dtype={dtype!r} is invalid: must be one of {', '.join(DTYPE_BYTES)}")
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
            raise ValueError(f"{where}: shape={shape!r} is invalid: must be a list of integers >= 0")
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(_is_count(o) for o in offsets)
            and offsets[0] <= offsets[1]
        ):
            raise ValueError(f"{where}: data_offsets={offsets!r} is invalid: must be [begin, end], 0 <= begin <= end")
        begin, end = offsets
        if end > data_len:
            raise ValueError(
                f"{where}: data_offsets={offsets} end past the {data_len} bytes of data the file holds: "
                f"the file is truncated or its header is wrong"
            )
        need = math.prod(shape) * DTYPE_BYTES[dtype]
        if end - begin != need:
            raise ValueError(
                f"{where}: data_offsets={offsets} span {end - begin} bytes, but dtype {dtype} x shape "
                f"{shape} is {need} bytes"
            )
        spans.append((begin, end, name))
    spans.sort()
    covered = 0
    for begin, end, name in spans:
        if begin < covered:
            raise ValueError(f"{path}: tensor {name!r} at data_offsets=[{begin}, {end}] overlaps the tensor before it")
        if begin > covered:
            raise ValueError(f"{path}: data bytes [{covered}, {begin}) belong to no tensor: the header is wrong")
        covered = end
    if covered != data_len:
        raise ValueError(
            f"{path}: the tensors cover {covered} bytes of data, the file holds {data_len}: the header is wrong"
        )
