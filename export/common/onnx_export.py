"""torch -> ONNX for the wrapper modules, their weights streamed to disk.

Every graph keeps its tensors of at least 1 KiB in one file beside it, ``<file>.data`` (``<name>.onnx.data``), at
aligned offsets (``kztts.bundle.onnx_wire.tensor_alignment``: whole blocks for the big weights, which any reader may
map; ONNX Runtime 1.32 maps them either way, measured: sessions without weight prepacking add no anonymous memory).
The exporter writes the graph without its weights (``export_params=False``) and :func:`export_onnx` writes them
itself, one tensor at a time, from the exporter's own parameters (weights and folded constants). The exporter left
alone holds a graph's weights two or three times over in memory (its ModelProto and the serialised bytes, under
2 GB; a transposed copy of every ``Linear`` weight from its constant folding, at any size): the 0.6B Talker's export
took 6.4 GB of anonymous memory for 1.8 GB of weights. Graphs whose weights reach :data:`EXTERNAL_DATA_BYTES`
(protobuf cannot hold more than 2 GB) are never loaded whole later either (``kztts.export.htp.qdq``).
"""
from __future__ import annotations

import contextlib
import logging
import os
import types
import warnings
from pathlib import Path

import torch

from kztts.bundle.onnx_wire import tensor_alignment

log = logging.getLogger(__name__)

OPSET = 17
EXTERNAL_DATA_BYTES = 2 ** 31  # tests lower it to send tiny graphs down the > 2 GB path


def data_file(path: Path) -> Path:
    """The external-data file of graph ``path`` (it exists only for graphs written with external data)."""
    return path.with_name(path.name + ".data")


def weight_bytes(model) -> int:
    """Bytes of the tensors of a graph (a ModelProto loaded without its external data), inline or external."""
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    total = 0
    for t in _get_all_tensors(model):
        if uses_external_data(t):
            total += int(next((e.value for e in t.external_data if e.key == "length"), 0) or 0)
        else:
            total += len(t.raw_data) if t.HasField("raw_data") else t.ByteSize()
    return total


def past_protobuf_limit(model) -> bool:
    """Whether a graph's tensors (:func:`weight_bytes`) reach :data:`EXTERNAL_DATA_BYTES`: such a graph is never
    loaded whole (protobuf cannot hold it), and everything that rewrites it works on it lazily."""
    return weight_bytes(model) >= EXTERNAL_DATA_BYTES


def export_onnx(module: torch.nn.Module, example_inputs: tuple, path: Path, input_names: list[str],
                output_names: list[str], dynamic_axes: dict[str, dict[int, str]] | None = None) -> Path:
    """Export with the TorchScript exporter, the weights streamed into ``<file>.data`` (module docstring).

    The wrappers are plain tensor code over the reference weights, which this
    exporter turns into compact graphs without transformers' mask machinery; the
    dynamo exporter cannot take ``dynamic_axes`` for variadic KV inputs.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data_file(path).unlink(missing_ok=True)
    structure = path.with_name(f".{path.name}.structure")
    release_pages()  # what the tables or the wrapper's construction read, before the trace reads its own
    with torch.no_grad(), warnings.catch_warnings(), _linear_as_matmul(module), _exported_params() as box:
        warnings.simplefilter("ignore")  # TorchScript-exporter deprecation and tracer notes
        torch.onnx.export(module, example_inputs, str(structure), input_names=input_names,
                          output_names=output_names, dynamic_axes=dynamic_axes or {},
                          opset_version=OPSET, do_constant_folding=True, dynamo=False, export_params=False)
    try:
        size = _write_weights(structure, path, box.pop("params"))
    finally:
        structure.unlink(missing_ok=True)
        release_pages()
    log.info("exported %s (%.1f MB of weights in %s)", path.name, size / 1e6, data_file(path).name)
    return path


_MADV_PAGEOUT = 21  # Linux 5.4+: reclaim the range's pages; file pages are dropped, nothing is lost


def release_pages() -> int:
    """Hand the pages of the mapped checkpoint files (``*.safetensors``) back to the kernel, on Linux: the reference
    model's weights are those files' pages (transformers maps safetensors), and every page a trace, a table or a
    write read stays resident until the process ends, so an export's memory grew to the whole model's bytes however
    little each graph read. Clean file pages are dropped (read again from the page cache or the disk when next
    touched); other pages stay (no swap). Returns the bytes advised; 0 where ``madvise`` or /proc is missing."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return 0
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            spans = [line.split()[0] for line in f if line.rstrip().endswith(".safetensors")]
    except OSError:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    total = 0
    for span in spans:
        start, end = (int(x, 16) for x in span.split("-"))
        if libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_PAGEOUT) == 0:
            total += end - start
    return total


def _matmul_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if x.dim() <= 2:  # Gemm(transB=1) reads the weight as it is: nothing to fold
        return torch.nn.functional.linear(x, self.weight, self.bias)
    y = torch.matmul(x, self.weight_t)
    return y if self.bias is None else y + self.bias


@contextlib.contextmanager
def _linear_as_matmul(module: torch.nn.Module):
    """Trace every ``nn.Linear`` of ``module`` on 3-D inputs as ``MatMul`` over a transposed view of its weight,
    a parameter of its own: the graph is the one the exporter writes for ``Linear`` (``MatMul`` with a
    transposed weight, then ``Add`` of the bias), but the exporter's constant folding no longer makes a
    transposed copy of every weight in memory (at 1.7B, 5.5 GB beside the model). Restored on exit."""
    patched = []
    for m in module.modules():
        if isinstance(m, torch.nn.Linear) and "weight_t" not in m._parameters:
            m.register_parameter("weight_t", torch.nn.Parameter(m.weight.detach().t(), requires_grad=False))
            m.forward = types.MethodType(_matmul_forward, m)
            patched.append(m)
    try:
        yield
    finally:
        for m in patched:
            del m._parameters["weight_t"]
            del m.forward


@contextlib.contextmanager
def _exported_params():
    """The exporter's own parameters (weights and folded constants, by graph input name) of the export inside:
    ``box["params"]``. Exported with ``export_params=False``, a graph takes them as inputs, and the exporter
    never serialises them into its in-memory ModelProto (two copies of every weight of a graph under 2 GB)."""
    from torch.onnx._internal.torchscript_exporter import utils as exporter

    model_to_graph = exporter._model_to_graph
    box: dict = {}

    def keep(*args, **kwargs):
        graph, params, out = model_to_graph(*args, **kwargs)
        box["params"] = params
        return graph, params, out

    exporter._model_to_graph = keep
    try:
        yield box
    finally:
        exporter._model_to_graph = model_to_graph


_ONNX_TYPES = {torch.float32: 1, torch.uint8: 2, torch.int8: 3, torch.int16: 5, torch.int32: 6, torch.int64: 7,
               torch.bool: 9, torch.float16: 10, torch.float64: 11, torch.bfloat16: 16}


def _write_weights(structure: Path, path: Path, params: dict[str, torch.Tensor]) -> int:
    """Graph ``structure`` (its weights as inputs) written as ``path`` with them as initializers: each of
    at least ``SHARED_MIN_BYTES`` in ``path``'s ``.data`` file at an aligned offset, streamed one tensor at a time;
    the smaller ones inline. Returns the bytes of the data file."""
    import onnx
    from onnx import TensorProto

    model = onnx.load(str(structure))
    names = {i.name for i in model.graph.input} & set(params)
    data, offset = data_file(path), 0
    with open(data, "wb") as out:
        for name in [i.name for i in model.graph.input if i.name in names]:
            t = params[name].detach().contiguous()
            raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
            tensor = TensorProto(name=name, data_type=_ONNX_TYPES[t.dtype], dims=list(t.shape))
            if len(raw) >= SHARED_MIN_BYTES:
                pad = -offset % tensor_alignment(len(raw))
                out.write(b"\0" * pad)
                offset += pad
                out.write(raw)
                _point(tensor, data.name, offset, len(raw))
                offset += len(raw)
            else:
                tensor.raw_data = raw
            model.graph.initializer.append(tensor)
            del t, raw
    inputs = [i for i in model.graph.input if i.name not in names]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    onnx.save_model(model, str(path))
    if not offset:
        data.unlink()
    return offset


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
