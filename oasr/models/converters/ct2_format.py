"""Reader for CTranslate2's ``model.bin`` (binary version 6), without depending on CTranslate2.

Layout, little-endian: u32 version, string spec name, u32 spec revision, u32 variable count, then per variable
a string name, u8 rank, rank x u32 dims, u8 dtype, u32 byte count and the raw bytes; then u32 alias count and
(alias, target) string pairs. Strings are a u16 length followed by that many bytes ending in NUL.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from oasr.errors import CheckpointError

SUPPORTED_VERSION = 6

# CTranslate2's DataType enum.
_DTYPES: dict[int, np.dtype] = {
    0: np.dtype("<f4"),
    1: np.dtype("i1"),
    2: np.dtype("<i2"),
    3: np.dtype("<i4"),
    4: np.dtype("<f2"),
}
_BFLOAT16 = 5


@dataclass(frozen=True)
class Ct2Model:
    spec: str
    revision: int
    variables: dict[str, np.ndarray]


class _Cursor:
    def __init__(self, data: memoryview, origin: str) -> None:
        self.data = data
        self.pos = 0
        self.origin = origin

    def take(self, size: int) -> memoryview:
        if self.pos + size > len(self.data):
            raise CheckpointError(f"{self.origin}: truncated CTranslate2 model (needed {size} bytes at {self.pos})")
        chunk = self.data[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def unpack(self, fmt: str) -> int:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt)))[0]

    def string(self) -> str:
        return bytes(self.take(self.unpack("H"))).rstrip(b"\0").decode("utf-8")


def _array(raw: memoryview, dtype_id: int, dims: list[int], origin: str, name: str) -> np.ndarray:
    if dtype_id == _BFLOAT16:
        halves = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return halves.view(np.float32).reshape(dims)
    if dtype_id not in _DTYPES:
        raise CheckpointError(f"{origin}: variable {name} has unsupported CTranslate2 dtype {dtype_id}")
    return np.frombuffer(raw, dtype=_DTYPES[dtype_id]).reshape(dims)


def read_ct2_model(files: list[Path]) -> Ct2Model:
    """Parses a model.bin given whole or as ordered parts that concatenate into it."""
    origin = str(files[0]) if len(files) == 1 else f"{files[0]} (+{len(files) - 1} parts)"
    blob = files[0].read_bytes() if len(files) == 1 else b"".join(p.read_bytes() for p in files)
    cur = _Cursor(memoryview(blob), origin)
    version = cur.unpack("I")
    if version != SUPPORTED_VERSION:
        raise CheckpointError(f"{origin}: CTranslate2 binary version {version}, only {SUPPORTED_VERSION} is supported")
    spec = cur.string()
    revision = cur.unpack("I")
    variables: dict[str, np.ndarray] = {}
    for _ in range(cur.unpack("I")):
        name = cur.string()
        dims = [cur.unpack("I") for _ in range(cur.unpack("B"))]
        dtype_id = cur.unpack("B")
        raw = cur.take(cur.unpack("I"))
        variables[name] = _array(raw, dtype_id, dims, origin, name)
    for _ in range(cur.unpack("I")):
        alias, target = cur.string(), cur.string()
        variables[alias] = variables[target]
    return Ct2Model(spec=spec, revision=revision, variables=variables)
