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

log = logging.getLogger(__name__)

OPSET = 17
EXTERNAL_DATA_BYTES = 2 ** 31  # tests lower it to send tiny graphs down the > 2 GB path
DATA_ALIGN = 1 << 16  # 64 KiB: a page multiple on every OS (Windows' allocation granularity)


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
                _copy(f, out, length)
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


def _copy(src, dst, length: int, block: int = 64 << 20) -> None:
    left = length
    while left:
        chunk = src.read(min(block, left))
        if not chunk:
            raise OSError(f"external data ends {left} bytes early")
        dst.write(chunk)
        left -= len(chunk)


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
