"""The constant tensors of an ONNX file, read from its protobuf wire format.

The ``onnx`` package is an export extra, not a runtime dependency, and ONNX Runtime does not
expose a model's initializers; this reader walks the file's protobuf fields (memory-mapped, the
tensor payloads are skipped, not copied) and lists every initializer and every ``Constant``
node's tensor, in the main graph and in subgraphs (``If`` branches), with its type, shape, byte
count and a digest of its data (so that two graphs holding the same weights can be recognised),
and every node's name, op type, inputs and outputs (so that a weight's uses can be counted).
"""
from __future__ import annotations

import hashlib
import mmap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kztts.core.errors import BundleError

# TensorProto.DataType -> (name, bits per element)
DTYPES: dict[int, tuple[str, int]] = {
    1: ("float32", 32), 2: ("uint8", 8), 3: ("int8", 8), 4: ("uint16", 16), 5: ("int16", 16), 6: ("int32", 32),
    7: ("int64", 64), 9: ("bool", 8), 10: ("float16", 16), 11: ("float64", 64), 12: ("uint32", 32),
    13: ("uint64", 64), 16: ("bfloat16", 16), 17: ("float8e4m3fn", 8), 18: ("float8e4m3fnuz", 8),
    19: ("float8e5m2", 8), 20: ("float8e5m2fnuz", 8), 21: ("uint4", 4), 22: ("int4", 4),
}

# field numbers of onnx.proto3 (ModelProto.graph, GraphProto.node/initializer, NodeProto.op_type/attribute,
# AttributeProto.t/g/tensors/graphs, TensorProto.dims/data_type/name/raw_data/external_data/data_location)
_MODEL_GRAPH = 7
_GRAPH_NODE, _GRAPH_INIT, _GRAPH_OUTPUT = 1, 5, 12
_NODE_IN, _NODE_OUT, _NODE_NAME, _NODE_OP, _NODE_ATTR = 1, 2, 3, 4, 5
_ATTR_T, _ATTR_G, _ATTR_TENSORS, _ATTR_GRAPHS = 5, 6, 10, 11
_T_DIMS, _T_TYPE, _T_NAME, _T_RAW, _T_EXTERNAL, _T_LOCATION = 1, 2, 8, 9, 13, 14
_T_TYPED_DATA = (4, 5, 6, 7, 10, 11)  # float_data, int32_data, string_data, int64_data, double_data, uint64_data


@dataclass(frozen=True)
class ConstTensor:
    """One constant tensor of a graph: an initializer or a ``Constant`` node's value."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int  # elements x element size (what the graph holds, not the file's encoding)
    digest: str  # of the tensor's data as stored (``read_graph(probe=True)``: of a few bytes of it, see ``probe``)
    # where the data lies: (file, offset, length) of its bytes, or None (typed fields, no data)
    source: tuple[str, int, int] | None = None

    @property
    def elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class Node:
    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    subgraph: bool  # inside an If/Loop body (runs when its branch does)
    ints: dict = field(default_factory=dict)  # its integer attributes (MatMulNBits' K and N)


@dataclass(frozen=True)
class OnnxGraph:
    """What ``read_graph`` finds in a file: its constants and its nodes (subgraphs included)."""

    tensors: list[ConstTensor]
    nodes: list[Node]


def _varint(buf, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _fields(buf, start: int, end: int):
    """(field number, wire type, value) of one message: an int for varints, a (start, end) span otherwise."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield field, wire, value
        elif wire == 2:
            n, pos = _varint(buf, pos)
            yield field, wire, (pos, pos + n)
            pos += n
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            yield field, wire, (pos, pos + n)
            pos += n
        else:
            raise ValueError(f"unsupported protobuf wire type {wire} at byte {pos}")


def _packed_varints(buf, span: tuple[int, int]) -> list[int]:
    out, pos = [], span[0]
    while pos < span[1]:
        v, pos = _varint(buf, pos)
        out.append(v)
    return out


class _Reader:
    def __init__(self, path: Path, buf, wanted: set[str] | None = None, probe: bool = False) -> None:
        self.path, self.buf, self.probe = path, buf, probe
        self.tensors: list[ConstTensor] = []
        self.nodes: list[Node] = []
        self.depth = 0
        self.wanted = wanted or set()  # initializers whose values ``tensor_arrays`` decodes
        self.arrays: dict[str, np.ndarray] = {}

    def text(self, span: tuple[int, int]) -> str:
        return bytes(self.buf[span[0]:span[1]]).decode("utf-8", "replace")

    def graph(self, span: tuple[int, int]) -> None:
        for field, wire, v in _fields(self.buf, *span):
            if field == _GRAPH_INIT and wire == 2:
                self.tensor(v, "")
            elif field == _GRAPH_NODE and wire == 2:
                self.node(v)

    def node(self, span: tuple[int, int]) -> None:
        op, name, attrs, ins, outs = "", "", [], [], []
        for field, wire, v in _fields(self.buf, *span):
            if wire != 2:
                continue
            if field == _NODE_OP:
                op = self.text(v)
            elif field == _NODE_NAME:
                name = self.text(v)
            elif field == _NODE_IN:
                ins.append(self.text(v))
            elif field == _NODE_OUT:
                outs.append(self.text(v))
            elif field == _NODE_ATTR:
                attrs.append(v)
        ints = {}
        for a in attrs:
            aname, value = "", None
            for field_, wire, v in _fields(self.buf, *a):
                if field_ == 1 and wire == 2:
                    aname = self.text(v)
                elif field_ == 3 and wire == 0:
                    value = v
            if aname and value is not None:
                ints[aname] = value
        self.nodes.append(Node(name, op, tuple(ins), tuple(outs), self.depth > 0, ints))
        for a in attrs:
            for field, wire, v in _fields(self.buf, *a):
                if field in (_ATTR_T, _ATTR_TENSORS) and wire == 2 and op == "Constant":
                    self.tensor(v, outs[0] if outs else "")  # named by the value it defines
                elif field in (_ATTR_G, _ATTR_GRAPHS) and wire == 2:
                    self.depth += 1
                    self.graph(v)
                    self.depth -= 1

    def tensor(self, span: tuple[int, int], output: str) -> None:
        dims: list[int] = []
        dtype, name, data, external, location = 0, "", None, {}, 0
        typed: list[tuple[int, int]] = []
        for field, wire, v in _fields(self.buf, *span):
            if field == _T_DIMS:
                dims.extend(_packed_varints(self.buf, v) if wire == 2 else [v])
            elif field == _T_TYPE:
                dtype = v
            elif field == _T_NAME:
                name = self.text(v)
            elif field == _T_RAW:
                data = v
            elif field == _T_EXTERNAL:
                kv = {f: self.text(s) for f, _, s in _fields(self.buf, *v)}
                external[kv.get(1, "")] = kv.get(2, "")
            elif field == _T_LOCATION:
                location = v
            elif field in _T_TYPED_DATA and wire == 2:
                typed.append(v)
        if dtype not in DTYPES:
            raise BundleError(f"{self.path}: tensor {name!r} has ONNX data type {dtype}, which kztts cannot size")
        kind, bits = DTYPES[dtype]
        elements = 1
        for d in dims:
            elements *= d
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{kind}{tuple(dims)}".encode())
        source = None
        if location == 1 or external:
            f = self.path.parent / external.get("location", "")
            offset, length = int(external.get("offset", 0) or 0), external.get("length")
            if length is None or not self.probe:
                self._hash_external(h, external, name)
            if length is not None:
                source = (str(f.resolve()), offset, int(length))
        elif data is not None:
            source = (str(self.path.resolve()), data[0], data[1] - data[0])
            if not self.probe:
                h.update(self.buf[data[0]:data[1]])
        else:
            for s in typed:
                h.update(self.buf[s[0]:s[1]])
        digest = h.hexdigest()
        if self.probe and source is not None:
            digest = "probe:" + _probe(f"{kind}{tuple(dims)}", source)
        self.tensors.append(ConstTensor(output or name, kind, tuple(dims), (elements * bits + 7) // 8, digest, source))
        if (output or name) in self.wanted:
            self.arrays[output or name] = self._array(kind, dims, data, external, location, typed, name)

    def _array(self, kind: str, dims: list[int], data, external: dict[str, str], location: int, typed, name: str):
        if kind not in _NUMPY:
            raise BundleError(f"{self.path}: tensor {name!r} is {kind}, which kztts does not read as an array")
        dt = np.dtype(_NUMPY[kind])
        if location == 1 or external:
            f = self.path.parent / external.get("location", "")
            offset = int(external.get("offset", 0) or 0)
            count = int(np.prod(dims, dtype=np.int64))
            try:
                a = np.fromfile(f, dtype=dt.newbyteorder("<"), count=count, offset=offset)
            except OSError as exc:
                raise BundleError(f"{self.path}: external data of tensor {name!r} unreadable ({exc})") from exc
        elif data is not None:
            a = np.frombuffer(bytes(self.buf[data[0]:data[1]]), dtype=dt.newbyteorder("<"))
        elif kind == "float32" and typed:  # float_data: packed little-endian floats
            a = np.concatenate([np.frombuffer(bytes(self.buf[s[0]:s[1]]), dtype="<f4") for s in typed])
        else:
            raise BundleError(f"{self.path}: tensor {name!r} stores its values in a form kztts does not read")
        return a.astype(dt).reshape(dims)

    def _hash_external(self, h, external: dict[str, str], name: str) -> None:
        f = self.path.parent / external.get("location", "")
        offset, length = int(external.get("offset", 0) or 0), external.get("length")
        try:
            with open(f, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
                end = offset + int(length) if length else len(m)
                h.update(m[offset:end])
        except OSError as exc:
            raise BundleError(f"{self.path}: external data of tensor {name!r} unreadable ({exc}); "
                              "re-export the bundle") from exc


_NUMPY = {"float32": "float32", "float16": "float16", "float64": "float64", "int8": "int8", "uint8": "uint8",
          "int16": "int16", "uint16": "uint16", "int32": "int32", "int64": "int64"}


def tensor_arrays(path: str | Path, names) -> dict[str, np.ndarray]:
    """The values of the initializers ``names`` of the ONNX file ``path`` (inline or external data), as numpy
    arrays; names the file does not hold are left out."""
    path = Path(path)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        r = _Reader(path, buf, set(names))
        for field, wire, v in _fields(buf, 0, len(buf)):
            if field == _MODEL_GRAPH and wire == 2:
                r.graph(v)
        return r.arrays


def _key(field: int, wire: int) -> bytes:
    return _encode_varint(field << 3 | wire)


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def with_outputs(path: str | Path, names) -> bytes:
    """The ONNX file ``path`` as bytes that also return the intermediate tensors ``names`` as graph outputs
    (untyped: ONNX Runtime infers them), edited at the protobuf level: the runtime reads a graph's activations
    without the ``onnx`` package. A graph with external data needs its folder given to the session
    (``session.model_external_initializers_file_folder_path``)."""
    extra = b""
    for n in names:
        vi = _key(1, 2) + _encode_varint(len(n.encode())) + n.encode()  # ValueInfoProto.name
        extra += _key(_GRAPH_OUTPUT, 2) + _encode_varint(len(vi)) + vi
    buf = Path(path).read_bytes()
    out, last = bytearray(), 0
    for field, wire, v in _fields(buf, 0, len(buf)):
        if field == _MODEL_GRAPH and wire == 2:
            start, end = v
            key_start = start - len(_encode_varint(end - start)) - len(_key(_MODEL_GRAPH, 2))
            out += buf[last:key_start] + _key(_MODEL_GRAPH, 2) + _encode_varint(end - start + len(extra))
            out += buf[start:end] + extra
            last = end
    out += buf[last:]
    return bytes(out)


_PROBE = 64  # bytes read at the start, the middle and the end of a tensor's data for its probe


def _probe(head: str, source: tuple[str, int, int]) -> str:
    """A digest of a tensor's type, shape, length and a few of its bytes: different probes, different data (equal
    ones say nothing: ``full_digest`` then)."""
    f, offset, length = source
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{head}{length}".encode())
    with open(f, "rb") as fh:
        for at in sorted({0, max(0, length // 2 - _PROBE // 2), max(0, length - _PROBE)}):
            fh.seek(offset + at)
            h.update(fh.read(min(_PROBE, length - at)))
    return h.hexdigest()


def full_digest(t: ConstTensor) -> str:
    """``t.digest`` as ``read_graph`` computes it without ``probe``: of the type, the shape and all the data."""
    if not t.digest.startswith("probe:"):
        return t.digest
    f, offset, length = t.source
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    try:
        with open(f, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
            h.update(m[offset:offset + length])
    except OSError as exc:
        raise BundleError(f"{f}: data of tensor {t.name!r} unreadable ({exc}); re-export the bundle") from exc
    return h.hexdigest()


def read_graph(path: str | Path, probe: bool = False) -> OnnxGraph:
    """Every constant tensor of the ONNX file ``path`` (initializers and ``Constant`` values, the latter
    named by their output; subgraphs included) and every node. ``probe``: each tensor's digest from a few bytes
    of its data (``_probe``), not all of it; ``full_digest`` reads the rest when two probes agree."""
    path = Path(path)
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            r = _Reader(path, buf, probe=probe)
            found = False
            for field, wire, v in _fields(buf, 0, len(buf)):
                if field == _MODEL_GRAPH and wire == 2:
                    r.graph(v)
                    found = True
            if not found:
                raise BundleError(f"{path}: no graph in this ONNX file; re-export the bundle")
            return OnnxGraph(r.tensors, r.nodes)
    except (ValueError, IndexError) as exc:
        raise BundleError(f"{path}: not a readable ONNX file ({exc}); re-export the bundle") from exc


def _spans(buf, start: int, end: int):
    """``_fields`` with each field's own byte range (key included): (field, wire, value, field start, field end)."""
    pos = start
    while pos < end:
        first = pos
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = (pos, pos + n), pos + n
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            value, pos = (pos, pos + n), pos + n
        else:
            raise ValueError(f"unsupported protobuf wire type {wire} at byte {pos}")
        yield field, wire, value, first, pos


_SHAPE_VALUE_TYPES = (6, 7)  # int32, int64: the initializers a shape computation may read


def _len_field(field: int, payload: bytes) -> bytes:
    return _key(field, 2) + _encode_varint(len(payload)) + payload


def without_weight_data(path: str | Path, keep: int = 1024) -> bytes:
    """The ONNX file ``path`` as bytes whose main-graph initializers of more than ``keep`` bytes (other than int32 /
    int64 ones, which a shape computation may read) have no data (their type and shape only). Shapes can be inferred from it without reading a weight (a graph of a few GB stored in
    one file becomes a few MB)."""
    path = Path(path)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        out, last = bytearray(), 0
        for field, wire, v, first, end in _spans(buf, 0, len(buf)):
            if field != _MODEL_GRAPH or wire != 2:
                continue
            graph = bytearray()
            for gf, gw, gv, gfirst, gend in _spans(buf, *v):
                if gf != _GRAPH_INIT or gw != 2:
                    graph += buf[gfirst:gend]
                    continue
                kept, raw, dtype = bytearray(), None, 0
                for tf, tw, tv, tfirst, tend in _spans(buf, *gv):
                    if tf == _T_RAW and tw == 2:
                        raw = tv
                        continue
                    if tf == _T_TYPE and tw == 0:
                        dtype = tv
                    kept += buf[tfirst:tend]
                if raw is None or raw[1] - raw[0] <= keep or dtype in _SHAPE_VALUE_TYPES:
                    graph += buf[gfirst:gend]
                    continue
                graph += _len_field(_GRAPH_INIT, bytes(kept))
            out += buf[last:first] + _len_field(_MODEL_GRAPH, bytes(graph))
            last = end
        out += buf[last:]
        return bytes(out)


# ------------------------------------------------------------------ external-data files
DATA_ALIGN = 1 << 16  # 64 KiB: a page multiple on every OS (Windows' allocation granularity)


def tensor_alignment(length: int) -> int:
    """Alignment of a tensor of ``length`` bytes in a shared weights file: whole 64 KiB blocks for the big weights
    (any reader may map them), pages for the middle ones, 64 bytes for the small (a tiny model's thousand norms would
    double in 64 KiB). The export writes the file so, and a device bundle's copy of it (``kztts pack``) keeps it."""
    return DATA_ALIGN if length >= 1 << 20 else 4096 if length >= 1 << 16 else 64


def copy_bytes(src, dst, length: int, block: int = 64 << 20) -> None:
    """Copy ``length`` bytes from the binary file ``src``'s position to ``dst``, a block at a time; ``OSError`` when
    ``src`` ends first."""
    left = length
    while left:
        chunk = src.read(min(block, left))
        if not chunk:
            raise OSError(f"external data ends {left} bytes early")
        dst.write(chunk)
        left -= len(chunk)


_MOVED_KEYS = ("location", "offset", "length")


def relocated(path: str | Path, move) -> bytes:
    """The ONNX file ``path`` as bytes with its external-data records rewritten: ``move(location, offset, length)``
    gives a tensor's new ``(location, offset)``, or None to keep it. Every tensor is visited (initializers,
    ``Constant`` values and other tensor attributes, subgraphs); only the messages on the way to a changed record
    are re-encoded (``kztts pack`` writes a device bundle's weights file this way, without the ``onnx`` package)."""
    path = Path(path)
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            out, last = bytearray(), 0
            for field, wire, v, first, end in _spans(buf, 0, len(buf)):
                if field == _MODEL_GRAPH and wire == 2:
                    graph = _moved_graph(buf, v, move)
                    if graph is not None:
                        out += buf[last:first] + _len_field(_MODEL_GRAPH, graph)
                        last = end
            out += buf[last:]
            return bytes(out)
    except (ValueError, IndexError) as exc:
        raise BundleError(f"{path}: not a readable ONNX file ({exc}); re-export the bundle") from exc


def _moved(buf, span: tuple[int, int], move, children: dict) -> bytes | None:
    """A message re-encoded with the fields ``children`` names ({field: rewrite}) rewritten; None: unchanged."""
    out, changed = bytearray(), False
    for field, wire, v, first, end in _spans(buf, *span):
        rewrite = children.get(field) if wire == 2 else None
        new = rewrite(buf, v, move) if rewrite is not None else None
        if new is None:
            out += buf[first:end]
        else:
            out += _len_field(field, new)
            changed = True
    return bytes(out) if changed else None


def _moved_tensor(buf, span: tuple[int, int], move) -> bytes | None:
    external, kept = {}, bytearray()
    for field, wire, v, first, end in _spans(buf, *span):
        if field == _T_EXTERNAL and wire == 2:
            kv = {f: bytes(buf[s[0]:s[1]]).decode() for f, _, s in _fields(buf, *v)}
            external[kv.get(1, "")] = kv.get(2, "")
            if kv.get(1, "") in _MOVED_KEYS:
                continue
        kept += buf[first:end]
    if "location" not in external:
        return None
    length = int(external["length"]) if external.get("length") else None
    to = move(external["location"], int(external.get("offset", 0) or 0), length)
    if to is None:
        return None
    entries = {"location": to[0], "offset": str(to[1]), **({"length": str(length)} if length is not None else {})}
    for key, value in entries.items():
        kept += _len_field(_T_EXTERNAL, _len_field(1, key.encode()) + _len_field(2, value.encode()))
    return bytes(kept)


def _moved_attr(buf, span, move):
    return _moved(buf, span, move, {_ATTR_T: _moved_tensor, _ATTR_TENSORS: _moved_tensor, _ATTR_G: _moved_graph,
                                    _ATTR_GRAPHS: _moved_graph})


def _moved_node(buf, span, move):
    return _moved(buf, span, move, {_NODE_ATTR: _moved_attr})


def _moved_graph(buf, span, move):
    return _moved(buf, span, move, {_GRAPH_INIT: _moved_tensor, _GRAPH_NODE: _moved_node})


def graph_read_bytes(path: str | Path) -> int:
    """The bytes a graph holds: its file and the tensors it reads from other files (its own data file, or its part
    of a bundle's shared weights file), each tensor once; read from the protobuf, no weight loaded."""
    path = Path(path)
    own = path.resolve()
    external = {t.source for t in read_graph(path, probe=True).tensors if t.source and Path(t.source[0]) != own}
    return path.stat().st_size + sum(length for _, _, length in external)
