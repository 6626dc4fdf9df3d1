"""The metadata of a GGUF file (v2/v3), read straight from its header without the ``gguf`` package.

``gguf.GGUFReader`` maps every tensor and turns each of the ~150k vocabulary strings into a numpy
view: about 30 s for the 1.5B checkpoint on a busy machine. A check that only needs the architecture,
the tensor count and a few numbers reads the key/value section here in about a second.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from kztts.core.errors import KzttsError

MAGIC = b"GGUF"
# GGUF value types -> struct format (8 = string, 9 = array are handled apart)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass
class GGUFMeta:
    """``version``, ``tensor_count`` and the key/value pairs (arrays as lists)."""

    version: int
    tensor_count: int
    values: dict = field(default_factory=dict)


class _Reader:
    def __init__(self, data: bytes, path: Path):
        self.data, self.pos, self.path = data, 0, path

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise KzttsError(f"{self.path}: the GGUF header ends early; the file is truncated or not a GGUF file")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def scalar(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.scalar("<Q")).decode("utf-8", errors="replace")

    def value(self, vtype: int):
        if vtype == _STRING:
            return self.string()
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype != _ARRAY:
            raise KzttsError(f"{self.path}: unknown GGUF value type {vtype}; the file is damaged or too new")
        etype, count = self.scalar("<I"), self.scalar("<Q")
        if etype in _SCALARS:  # one unpack for the whole array (token types: 150k numbers)
            fmt = "<" + str(count) + _SCALARS[etype][1]
            return list(self.scalars(fmt)) if count else []
        return [self.value(etype) for _ in range(count)]

    def scalars(self, fmt: str) -> tuple:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))


def read_gguf_meta(path: str | Path) -> GGUFMeta:
    """The header of the GGUF file ``path``: version, tensor count, every key/value pair."""
    path = Path(path)
    with path.open("rb") as f:
        head = f.read(24)
        if head[:4] != MAGIC:
            raise KzttsError(f"{path}: not a GGUF file (no GGUF magic); give a .gguf file or a Hugging Face "
                             "checkpoint directory")
        if len(head) < 24:
            raise KzttsError(f"{path}: the GGUF header ends early; the file is truncated")
        version, tensors, kv_count = struct.unpack("<IQQ", head[4:24])
        if version < 2:
            raise KzttsError(f"{path}: GGUF version {version} is too old (2 or 3 are read); convert it again")
        # the key/value section precedes the tensor infos and data; 64 MiB covers any vocabulary
        r = _Reader(head + f.read(64 << 20), path)
    r.pos = 24
    meta = GGUFMeta(version=version, tensor_count=tensors)
    for _ in range(kv_count):
        key = r.string()
        meta.values[key] = r.value(r.scalar("<I"))
    return meta


def gguf_layer_count(path: str | Path) -> int:
    """The number of decoder layers of a GGUF file (``<architecture>.block_count``), from its header alone."""
    values = read_gguf_meta(path).values
    key = f"{values.get('general.architecture')}.block_count"
    if key not in values:
        raise KzttsError(f"{path}: the GGUF header has no {key}; not a causal LM kztts exports")
    return int(values[key])


__all__ = ["GGUFMeta", "gguf_layer_count", "read_gguf_meta"]
