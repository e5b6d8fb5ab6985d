"""A GGUF file's header (metadata and tensor directory) read in one pass, and its tensors mapped.

Why not gguf.GGUFReader: it builds every metadata value out of numpy memmap slices, one small
array per string, and the default model's 49,152 vocabulary strings and 48,900 merges took
3-5 s of its 4-9 s load (cProfile: 990k memmap __array_finalize__ calls). Here the header is
parsed from the bytes with struct in ~0.1 s; tensor data stays in one read-only np.memmap of
the file, sliced per tensor when it is loaded. The layout (GGUF v2/v3, little-endian):

    magic "GGUF", u32 version, u64 tensor_count, u64 kv_count
    kv_count x (string key, u32 value type, value)        string = u64 length + UTF-8 bytes
    tensor_count x (string name, u32 n_dims, n_dims x u64 dims, u32 ggml type, u64 offset)
    padding to general.alignment (default 32), then the tensor data, offsets relative to it

Dims are ggml's order (fastest-varying first), so a [rows, cols] matrix is dims (cols, rows).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# Value types (gguf's GGUFValueType): struct formats of the fixed-size ones.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
          7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}  # fmt: skip
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")

# ggml type id -> (values per block, bytes per block), for every type a file may hold.
GGML_BLOCK_SIZES = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 36),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110),
    22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
    29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17),
}  # fmt: skip
_PLAIN_DTYPES = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32, 27: np.int64, 28: np.float64}


@dataclass
class GGUFTensorInfo:
    name: str
    dims: tuple[int, ...]  # ggml order: fastest-varying first
    ggml_type: int
    offset: int  # absolute, in the file
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy/torch order (slowest first)."""
        return tuple(reversed(self.dims))


class GGUFHeader:
    """fields: {key: value} (strings, numbers, lists); tensors: the directory, in file order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file_size = path.stat().st_size
        with open(path, "rb") as f:
            self._buf = f.read(min(self.file_size, 1 << 20))
            self._f = f
            self._pos = 0
            self._parse()
        self._buf = b""
        self._map: np.memmap | None = None

    # ---- reading the header ----
    def _need(self, n: int) -> None:
        if self._pos + n > len(self._buf):  # the header is longer than what was read: read more
            self._f.seek(0)
            size = max(len(self._buf) * 4, self._pos + n)
            self._buf = self._f.read(size)
            if self._pos + n > len(self._buf):
                raise ValueError(f"{self.path}: the GGUF header runs past the file's end ({self.file_size} bytes)")

    def _unpack(self, fmt: str) -> Any:
        n = struct.calcsize(fmt)
        self._need(n)
        (v,) = struct.unpack_from(fmt, self._buf, self._pos)
        self._pos += n
        return v

    def _string(self) -> str:
        n = self._unpack("<Q")
        self._need(n)
        s = self._buf[self._pos : self._pos + n].decode("utf-8", "replace")
        self._pos += n
        return s

    def _strings(self, count: int) -> list[str]:
        """count strings in a tight loop: the vocabulary is ~100k of them."""
        start = self._pos
        while True:
            buf, pos, out = self._buf, start, []
            unpack = _U64.unpack_from
            try:
                for _ in range(count):
                    (n,) = unpack(buf, pos)
                    pos += 8
                    out.append(buf[pos : pos + n].decode("utf-8", "replace"))
                    pos += n
            except struct.error:  # ran off the bytes read so far
                pos = len(buf) + 1
            if pos <= len(buf):
                self._pos = pos
                return out
            self._pos = start
            self._need(len(buf) - start + 1)  # reads more (or raises at the file's end)

    def _value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self._string()
        if vtype == _ARRAY:
            itype, count = self._unpack("<I"), self._unpack("<Q")
            if itype == _STRING:
                return self._strings(count)
            if itype in _NUMPY:
                size = np.dtype(_NUMPY[itype]).itemsize * count
                self._need(size)
                arr = np.frombuffer(self._buf, dtype=_NUMPY[itype], count=count, offset=self._pos)
                self._pos += size
                return arr.tolist()
            if itype == _ARRAY:
                return [self._value(_ARRAY) for _ in range(count)]
            raise ValueError(f"{self.path}: unknown GGUF array item type {itype}")
        if vtype not in _SCALARS:
            raise ValueError(f"{self.path}: unknown GGUF value type {vtype}")
        return self._unpack(_SCALARS[vtype])

    def _parse(self) -> None:
        self._need(4)
        if self._buf[:4] != b"GGUF":
            raise ValueError(f"{self.path} is not a readable GGUF file: it does not start with b'GGUF'")
        self._pos = 4
        self.version = self._unpack("<I")
        if self.version not in (2, 3):
            raise ValueError(f"{self.path}: GGUF version {self.version} is not supported (2 and 3 are)")
        n_tensors, n_kv = self._unpack("<Q"), self._unpack("<Q")
        if n_tensors > 1 << 24 or n_kv > 1 << 24:
            raise ValueError(
                f"{self.path}: GGUF header claims {n_tensors} tensors and {n_kv} fields; the file is corrupt"
            )
        self.fields: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self._string()
            self.fields[key] = self._value(self._unpack("<I"))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._unpack("<I")
            if n_dims > 8:
                raise ValueError(f"{self.path}: tensor {name!r} claims {n_dims} dimensions")
            dims = tuple(self._unpack("<Q") for _ in range(n_dims))
            infos.append((name, dims, self._unpack("<I"), self._unpack("<Q")))
        alignment = int(self.fields.get("general.alignment", 32))
        data_start = -(-self._pos // alignment) * alignment
        self.tensors = [self._tensor(name, dims, t, data_start + off) for name, dims, t, off in infos]

    def _tensor(self, name: str, dims: tuple[int, ...], ggml_type: int, offset: int) -> GGUFTensorInfo:
        if ggml_type not in GGML_BLOCK_SIZES:
            raise ValueError(f"{self.path}: tensor {name!r} has an unknown GGML type {ggml_type}")
        block, type_size = GGML_BLOCK_SIZES[ggml_type]
        n = math.prod(dims)
        if dims and dims[0] % block:
            raise ValueError(
                f"{self.path}: tensor {name!r} rows of {dims[0]} values are not whole {block}-value blocks"
            )
        nbytes = n // block * type_size
        if offset + nbytes > self.file_size:
            raise ValueError(
                f"{self.path}: tensor {name!r} data is bytes [{offset}, {offset + nbytes}), past the file's end "
                f"({self.file_size} bytes): the file is truncated or its header is wrong"
            )
        return GGUFTensorInfo(name, dims, ggml_type, offset, nbytes)

    # ---- tensor data ----
    def release_data(self) -> None:
        """Drop this object's mapping of the file once every tensor has been copied out: its
        touched pages otherwise stay resident (random:llama-1b's 668 MB Q4_K_M file held 730 MB
        of file-backed RSS beside the 986 MB of copies after load). Views still alive keep the
        mapping until they go; a later data() maps the file again."""
        self._map = None

    def data(self, t: GGUFTensorInfo) -> np.ndarray:
        """A read-only view of the tensor's bytes in the file: plain types as their dtype in
        numpy order, block types as uint8 [rows..., bytes per row]."""
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        raw = self._map[t.offset : t.offset + t.nbytes]
        if t.ggml_type in _PLAIN_DTYPES:
            return raw.view(_PLAIN_DTYPES[t.ggml_type]).reshape(t.shape)
        block, type_size = GGML_BLOCK_SIZES[t.ggml_type]
        return raw.reshape(*t.shape[:-1], t.shape[-1] // block * type_size)
