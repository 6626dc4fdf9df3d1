"""torch -> ONNX for the wrapper modules, checked by ONNX Runtime right after export.

Graphs whose weights reach :data:`EXTERNAL_DATA_BYTES` (protobuf cannot hold more than 2 GB) keep them
in one file beside the graph, ``<file>.data`` (``<name>.onnx.data``), at offsets aligned to
:data:`DATA_ALIGN` (whole pages for any reader that maps them; ONNX Runtime 1.32 maps them either way,
measured: sessions without weight prepacking add no anonymous memory). The TorchScript
exporter itself switches to external data past 2 GB, with one file per tensor named after the
tensor; those names (``onnx::MatMul_6490``...) are not unique across graphs (a 28-layer Qwen2's
``talker`` and ``talker_prefill`` share 18, 15 of them with different contents), so each graph is
exported into a directory of its own and its tensors are gathered into its ``.data`` file
(:func:`gather_external_data`, streamed: the weights are never held in memory).
"""
from __future__ import annotations

import logging
import os
import tempfile
import warnings
from pathlib import Path

import torch

from kztts.bundle.onnx_wire import DATA_ALIGN, copy_bytes, tensor_alignment

log = logging.getLogger(__name__)

OPSET = 17
EXTERNAL_DATA_BYTES = 2 ** 31  # tests lower it to send tiny graphs down the > 2 GB path


def data_file(path: Path) -> Path:
    """The external-data file of graph ``path`` (it exists only for graphs written with external data)."""
    return path.with_name(path.name + ".data")


def has_external_data(model) -> bool:
    """Whether a graph (a path or a ModelProto loaded without its external data) keeps tensors outside
    its ``.onnx`` file."""
    import onnx
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    return any(uses_external_data(t) for t in _get_all_tensors(model))


def gather_external_data(src: Path, dst: Path, consume: bool = False) -> Path:
    """Write graph ``src`` as ``dst`` with every tensor of at least 1 KiB (inline or in external files
    beside ``src``) in ``dst``'s ``.data`` file, aligned to ``DATA_ALIGN``. Tensors are copied one at a time
    (files streamed), never the whole model. ``consume``: delete each of ``src``'s external files once its
    tensors are copied (the disk then holds one copy of the weights, not two). ``dst`` must not be ``src``."""
    import onnx
    from onnx import TensorProto
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    if Path(src).resolve() == Path(dst).resolve():
        raise ValueError(f"gather_external_data: {src} onto itself")
    model = onnx.load(str(src), load_external_data=False)
    data = data_file(dst)
    users: dict[str, int] = {}  # external file -> tensors still to copy from it
    for t in _get_all_tensors(model):
        if uses_external_data(t):
            loc = next(e.value for e in t.external_data if e.key == "location")
            users[loc] = users.get(loc, 0) + 1
    offset = 0

    def place(t, length: int) -> None:  # pad to the next aligned offset; point t's record there
        nonlocal offset
        pad = -offset % DATA_ALIGN
        out.write(b"\0" * pad)
        offset += pad
        del t.external_data[:]
        for key, value in (("location", data.name), ("offset", offset), ("length", length)):
            t.external_data.add(key=key, value=str(value))
        t.data_location = TensorProto.EXTERNAL
        offset += length

    with open(data, "wb") as out:
        for t in _get_all_tensors(model):  # external already (torch: one file per tensor)
            if not uses_external_data(t):
                continue
            info = {e.key: e.value for e in t.external_data}
            with open(Path(src).parent / info["location"], "rb") as f:
                start = int(info.get("offset", 0) or 0)
                length = int(info["length"]) if info.get("length") else os.fstat(f.fileno()).st_size - start
                f.seek(start)
                place(t, length)
                copy_bytes(f, out, length)
            users[info["location"]] -= 1
            if consume and not users[info["location"]]:
                (Path(src).parent / info["location"]).unlink()
        for t in model.graph.initializer:  # inline weights (onnx's own default: initializers of >= 1 KiB)
            if t.HasField("raw_data") and len(t.raw_data) >= 1024:
                raw = t.raw_data
                t.ClearField("raw_data")
                place(t, len(raw))
                out.write(raw)
    onnx.save_model(model, str(dst))
    return dst


def export_onnx(module: torch.nn.Module, example_inputs: tuple, path: Path, input_names: list[str],
                output_names: list[str], dynamic_axes: dict[str, dict[int, str]] | None = None) -> Path:
    """Export with the TorchScript exporter.

    The wrappers are plain tensor code over the reference weights, which this
    exporter turns into compact graphs without transformers' mask machinery; the
    dynamo exporter cannot take ``dynamic_axes`` for variadic KV inputs.
    Graphs whose weights reach ``EXTERNAL_DATA_BYTES`` (all graphs over 2 GB) are written with
    their weights in ``<file>.data`` (module docstring).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data_file(path).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{path.stem}.", dir=path.parent) as tmp:
        raw = Path(tmp) / path.name  # a directory of its own: torch names external files after tensors
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TorchScript-exporter deprecation and tracer notes
            torch.onnx.export(module, example_inputs, str(raw), input_names=input_names,
                              output_names=output_names, dynamic_axes=dynamic_axes or {},
                              opset_version=OPSET, do_constant_folding=True, dynamo=False)
        files = list(Path(tmp).iterdir())  # more than the graph: torch wrote its tensors beside it
        size = sum(f.stat().st_size for f in files)
        if size >= EXTERNAL_DATA_BYTES or len(files) > 1:
            gather_external_data(raw, path, consume=True)
            log.info("exported %s (%.1f MB, weights in %s)", path.name, size / 1e6, data_file(path).name)
            return path
        os.replace(raw, path)
    log.info("exported %s (%.1f MB)", path.name, path.stat().st_size / 1e6)
    return path


def _external_records(model, location: str) -> dict[str, tuple[int, int]]:
    """{tensor name: (offset, length)} of the tensors of ``model`` (lazy) stored in ``location``."""
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    out = {}
    for t in _get_all_tensors(model):
        if uses_external_data(t):
            info = {e.key: e.value for e in t.external_data}
            if info.get("location") == location:
                out[t.name] = (int(info.get("offset", 0) or 0), int(info["length"]))
    return out


def _same_bytes(a, a_at: int, b, b_at: int, length: int, block: int = 16 << 20) -> bool:
    a.seek(a_at)
    b.seek(b_at)
    while length:
        n = min(block, length)
        if a.read(n) != b.read(n):
            return False
        length -= n
    return True


def share_external_data(base: Path, other: Path) -> bool:
    """Point graph ``other`` at ``base``'s ``.data`` file and delete its own when every tensor of ``other``'s
    ``.data`` has a tensor of the same name and the same bytes there (the static Talker graphs of one model:
    the prefill and decode graphs hold the same weights; compared byte for byte, streamed). Returns whether
    it did; nothing changes otherwise."""
    import onnx

    base, other = Path(base), Path(other)
    base_data, other_data = data_file(base), data_file(other)
    if not (base_data.is_file() and other_data.is_file()):
        return False
    theirs = _external_records(onnx.load(str(base), load_external_data=False), base_data.name)
    model = onnx.load(str(other), load_external_data=False)
    ours = _external_records(model, other_data.name)
    if not ours or any(n not in theirs or theirs[n][1] != ln for n, (_, ln) in ours.items()):
        return False
    with open(base_data, "rb") as a, open(other_data, "rb") as b:
        if not all(_same_bytes(a, theirs[n][0], b, at, ln) for n, (at, ln) in ours.items()):
            return False
    from onnx.external_data_helper import _get_all_tensors

    for t in _get_all_tensors(model):
        if t.name in ours:
            del t.external_data[:]
            for key, value in (("location", base_data.name), ("offset", theirs[t.name][0]),
                               ("length", theirs[t.name][1])):
                t.external_data.add(key=key, value=str(value))
    onnx.save_model(model, str(other))
    other_data.unlink()
    return True


# ---------------------------------------------------------------- one copy of each weight per bundle
SHARED_WEIGHTS = "weights.data"  # beside the CPU graphs: every tensor of theirs from SHARED_MIN_BYTES on, each once
SHARED_MIN_BYTES = 1024  # smaller tensors (shapes, norms' eps) stay in their graph: constant folding reads them
SHARED_CONCAT = "kztts_shared_concat"  # the Concat nodes that rebuild a fused weight from the shared parts


def _tensor_bytes(t, where: Path) -> bytes:
    """A tensor's bytes as stored (raw, or read from its external file beside the graph ``where``)."""
    from onnx import numpy_helper
    from onnx.external_data_helper import uses_external_data

    if uses_external_data(t):
        info = {e.key: e.value for e in t.external_data}
        with open(where / info["location"], "rb") as f:
            f.seek(int(info.get("offset", 0) or 0))
            data = f.read(int(info["length"])) if info.get("length") else f.read()
            if info.get("length") and len(data) != int(info["length"]):
                raise OSError(f"{where / info['location']}: ends {int(info['length']) - len(data)} bytes early")
            return data
    if t.HasField("raw_data"):
        return t.raw_data
    return numpy_helper.to_array(t).tobytes()


def _graphs_of(graph):
    """``graph`` and every subgraph under it (``If`` branches: ``cp_step``'s heads)."""
    yield graph
    for node in graph.node:
        for a in node.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                yield from _graphs_of(g)


class _SharedFile:
    """The shared weights file being written: each distinct tensor once, found again by its digest, and by its
    leading row (or column block) when a fused tensor is the concatenation of tensors written before."""

    def __init__(self, path: Path):
        import hashlib

        self._hash = hashlib.sha256
        self.path = path
        self.out = open(path, "wb")
        self.offset = 0
        self.by_digest: dict[bytes, tuple[int, int]] = {}
        self.rows: dict[tuple, dict[bytes, list[tuple[int, tuple]]]] = {}  # axis-0 parts
        self.cols: dict[tuple, dict[bytes, list[tuple[int, tuple]]]] = {}  # last-axis parts of 2-D tensors

    def put(self, data: bytes, dtype: int, dims: tuple) -> tuple[int, int]:
        """(offset, length) of ``data`` in the file, written unless it is there already."""
        digest = self._hash(data).digest()
        found = self.by_digest.get(digest)
        if found is not None:
            return found
        pad = -self.offset % tensor_alignment(len(data))
        self.out.write(b"\0" * pad)
        self.offset += pad
        where = (self.offset, len(data))
        self.out.write(data)
        self.offset += len(data)
        self.by_digest[digest] = where
        if dims:
            row = len(data) // dims[0] if dims[0] else 0
            if row:
                key = (dtype, dims[1:], len(data))
                self.rows.setdefault(key, {}).setdefault(self._hash(data[:row]).digest(), []).append((where[0], dims))
            if len(dims) == 2 and dims[1]:
                key = (dtype, dims[0], dims[1])
                self.cols.setdefault(key, {}).setdefault(self._hash(data[:row]).digest(), []).append((where[0], dims))
        return where

    def read(self, offset: int, length: int) -> bytes:
        self.out.flush()
        with open(self.path, "rb") as f:
            f.seek(offset)
            return f.read(length)

    def parts(self, data: bytes, dtype: int, dims: tuple, itemsize: int) -> tuple[int, list] | None:
        """(axis, [(offset, dims) of each part]) when ``data`` is two or more tensors of the file concatenated along
        its first axis (a fused MatMulNBits weight, its scales) or the last axis of a 2-D tensor (a fused fp32
        MatMul weight [K, N]), else None. Each part is checked byte for byte."""
        if not dims or not dims[0]:
            return None
        import numpy as np

        row = len(data) // dims[0]
        lengths = sorted((k[2] for k in self.rows if k[:2] == (dtype, dims[1:])), reverse=True)
        found, at = [], 0
        while at < len(data) and row:
            for length in lengths:
                if at + length > len(data):
                    continue
                for offset, pdims in self.rows[(dtype, dims[1:], length)].get(self._hash(data[at:at + row]).digest(), []):
                    if self.read(offset, length) == data[at:at + length]:
                        found.append((offset, pdims))
                        at += length
                        break
                else:
                    continue
                break
            else:
                break
        if at == len(data) and len(found) > 1:
            return 0, found
        if len(dims) != 2:
            return None
        k, n = dims
        w = np.frombuffer(data, dtype=np.uint8).reshape(k, n * itemsize)
        widths = sorted((key[2] for key in self.cols if key[:2] == (dtype, k)), reverse=True)
        found, col = [], 0
        while col < n:
            for width in widths:
                if col + width > n:
                    continue
                block = w[:, col * itemsize:(col + width) * itemsize]
                for offset, pdims in self.cols[(dtype, k, width)].get(self._hash(block[0].tobytes()).digest(), []):
                    if self.read(offset, k * width * itemsize) == block.tobytes():
                        found.append((offset, pdims))
                        col += width
                        break
                else:
                    continue
                break
            else:
                return None
        return (1, found) if len(found) > 1 else None

    def close(self) -> int:
        self.out.close()
        return self.offset


def share_weights(graphs: list[tuple[Path, Path]], data: Path, consume: bool = False) -> int:
    """Write graphs ``(source, destination)`` with every tensor of at least ``SHARED_MIN_BYTES`` in the one file
    ``data`` (beside the destinations), each distinct tensor once: the Talker's plain, fused and batched graphs, the
    Code Predictor's step and frame graphs, the whole and streaming decoder hold the same weights. A fused weight
    (q|k|v, gate|up: the fused-attention graphs; their MatMulNBits blocks in a quantized variant) that is the
    concatenation of weights already in the file becomes a ``Concat`` of those (``SHARED_CONCAT``), which ONNX
    Runtime folds when it opens the graph. Sources are read before anything is replaced (a source may be its
    destination, or read its tensors from ``data`` itself); each destination is replaced atomically (never written
    through a hard link). ``consume``: delete a graph's own data file as soon as its tensors are in ``data`` (an
    export's staging folder, discarded on failure: its disk then never holds both layouts of the big graphs).
    Returns the bytes of ``data``."""
    import onnx

    data = Path(data)
    tmp = data.with_name(data.name + ".tmp")
    shared = _SharedFile(tmp)
    models, old = [], set()
    try:
        for src, dst in graphs:
            model = onnx.load(str(src), load_external_data=False)
            own = {src.parent / e.value for t in _all_tensors(model) for e in t.external_data if e.key == "location"}
            old |= own
            for g in _graphs_of(model.graph):
                concats, keep = [], []
                for t in g.initializer:
                    _share(t, src.parent, data.name, shared, concats, keep)
                if concats:
                    del g.initializer[:]
                    g.initializer.extend(keep)
                    nodes = concats + list(g.node)
                    del g.node[:]
                    g.node.extend(nodes)
                for node in g.node:
                    for a in node.attribute:
                        if a.HasField("t"):
                            _share(a.t, src.parent, data.name, shared, None, None)
            models.append((model, dst))
            if consume:
                for f in own:
                    if f.resolve() != data.resolve() and f.parent.resolve() == data.parent.resolve():
                        f.unlink(missing_ok=True)
        size = shared.close()
        os.replace(tmp, data)
    except BaseException:
        shared.out.close()
        tmp.unlink(missing_ok=True)
        raise
    for model, dst in models:
        part = dst.with_name(dst.name + ".tmp")
        onnx.save_model(model, str(part))
        os.replace(part, dst)
    for f in old:  # the graphs' own data files, now in ``data``
        if f.resolve() != data.resolve() and f.parent.resolve() == data.parent.resolve():
            f.unlink(missing_ok=True)
    return size


def _all_tensors(model):
    from onnx.external_data_helper import _get_all_tensors

    return list(_get_all_tensors(model))


def _share(t, where: Path, location: str, shared: _SharedFile, concats: list | None, keep: list | None) -> None:
    """Point tensor ``t`` at ``shared`` (appending a Concat node to ``concats`` when it is a concatenation of
    shared tensors); ``keep`` collects the initializers the graph keeps."""
    from onnx import TensorProto, helper
    from onnx.external_data_helper import uses_external_data

    if t.data_type == TensorProto.STRING or not (
            uses_external_data(t) or _count(t.dims) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
            >= SHARED_MIN_BYTES):
        if keep is not None:
            keep.append(t)
        return
    raw = _tensor_bytes(t, where)
    dims = tuple(int(d) for d in t.dims)
    split = None
    if concats is not None and _digest_unknown(shared, raw) and t.data_type not in _SUB_BYTE:
        split = shared.parts(raw, t.data_type, dims, helper.tensor_dtype_to_np_dtype(t.data_type).itemsize)
    if split is None:
        _point(t, location, *shared.put(raw, t.data_type, dims))
        if keep is not None:
            keep.append(t)
        return
    axis, parts = split
    names = []
    for i, (offset, pdims) in enumerate(parts):
        part = TensorProto(name=f"{t.name}/{SHARED_CONCAT}_{i}", data_type=t.data_type, dims=list(pdims))
        _point(part, location, offset, len(raw) // _count(dims) * _count(pdims))
        keep.append(part)
        names.append(part.name)
    concats.append(helper.make_node("Concat", names, [t.name], name=f"{SHARED_CONCAT}/{t.name}", axis=axis))


_SUB_BYTE = (21, 22)  # TensorProto.UINT4, INT4: two per byte, never split into parts (a QDQ graph's int4 codes)


def _count(dims) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def _digest_unknown(shared: _SharedFile, raw: bytes) -> bool:
    return shared._hash(raw).digest() not in shared.by_digest


def _point(t, location: str, offset: int, length: int) -> None:
    from onnx import TensorProto

    t.ClearField("raw_data")
    for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
        t.ClearField(field)
    del t.external_data[:]
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        t.external_data.add(key=key, value=str(value))
    t.data_location = TensorProto.EXTERNAL


def unshare_weights(model) -> int:
    """Turn the Concats ``share_weights`` wrote (``SHARED_CONCAT``) back into the fused initializers they rebuild,
    in ``model`` loaded with its data: what a rewrite that reads constant weights (the MatMulNBits quantizer) needs.
    Returns the number of weights rebuilt."""
    import numpy as np
    from onnx import numpy_helper

    count = 0
    for g in list(_graphs_of(model.graph)):
        inits = {t.name: t for t in g.initializer}
        ours = [n for n in g.node if n.op_type == "Concat" and n.name.startswith(SHARED_CONCAT + "/")
                and all(i in inits for i in n.input)]
        if not ours:
            continue
        used = set()
        fused = []
        for n in ours:
            axis = next(a.i for a in n.attribute if a.name == "axis")
            fused.append(numpy_helper.from_array(
                np.concatenate([numpy_helper.to_array(inits[i]) for i in n.input], axis=axis), n.output[0]))
            used.update(n.input)
        others = [n for n in g.node if n not in ours]
        del g.node[:]
        g.node.extend(others)
        still = {i for n in others for i in n.input}
        keep = [t for t in g.initializer if t.name not in used or t.name in still]
        del g.initializer[:]
        g.initializer.extend(keep + fused)
        count += len(fused)
    return count
