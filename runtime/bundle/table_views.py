"""Embedding tables stored as views into the graphs' shared weights file, not as a second copy (numpy only).

The Code Predictor's 15 codec embeddings are both a host table (the next frame's input sums them) and the
in-graph embeddings of its graphs, which ``kztts.export.common.onnx_export.share_weights`` stores once in
``graphs/weights.data``. When every group of the table is found there, byte for byte, its manifest entry becomes
``{"file": "graphs/weights.data", "dtype", "shape", "offsets": [one per group]}`` and the .npy goes
(``kztts.bundle.embeddings.TableSlices`` reads it): 7.9 MB of 32.6 MB on the tiny 0.6B-layout model, 126 MB at 0.6B.
Matched by bytes, not names: whatever graph holds the weight, wherever the sharing put it.

A bundle whose weights file is rewritten (a precision variant, a pack) re-points the view at the new file, or
writes the table out as a .npy when the new file does not hold it: a view never points at another layout's offsets.
"""
from __future__ import annotations

import hashlib
import mmap
from pathlib import Path

import numpy as np

from kztts.bundle.embeddings import TABLE_DTYPES, VIEW_KEY, load_table
from kztts.bundle.onnx_wire import read_graph
from kztts.bundle.table_compact import TABLE_DIR, save_table

VIEW_TABLES = ("cp_codec_embedding",)  # tables the graphs hold as weights too, each group one tensor


def is_view(spec: dict) -> bool:
    """True when a manifest table entry is a view into another file (not a .npy of its own)."""
    return VIEW_KEY in spec


def find_groups(bundle_dir: Path, weights: dict, table) -> list[int] | None:
    """The offsets in the shared weights file (the manifest's ``weights`` entry) of each group ``table[i]``'s bytes,
    where one of the graphs beside it reads a tensor of exactly those bytes; None unless every group is there."""
    bundle_dir = Path(bundle_dir)
    data = (bundle_dir / weights["file"]).resolve()
    groups = [np.ascontiguousarray(table[i]) for i in range(len(table))]
    length = groups[0].nbytes
    candidates = set()
    for graph in sorted(data.parent.glob("*.onnx")):  # every graph beside the file may read from it
        for t in read_graph(graph, probe=True).tensors:
            if t.source is not None and t.source[2] == length and Path(t.source[0]) == data:
                candidates.add(int(t.source[1]))
    if not candidates or not data.is_file():
        return None
    at = {}
    with open(data, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        for offset in sorted(candidates):
            if offset + length <= len(buf):
                at.setdefault(hashlib.blake2b(buf[offset:offset + length], digest_size=20).digest(), offset)
    offsets = [at.get(hashlib.blake2b(g.tobytes(), digest_size=20).digest()) for g in groups]
    return None if any(o is None for o in offsets) else offsets


def view_tables(bundle_dir: Path, embeddings: dict, weights: dict | None, source: Path | None = None) -> dict:
    """The manifest ``embeddings`` of the bundle at ``bundle_dir`` with each of ``VIEW_TABLES`` that its shared
    weights file (``weights``) holds turned into a view there, and its .npy in ``bundle_dir`` removed; a view
    whose groups the file does not hold (any more) is written out as a .npy. ``source``: the bundle the entries
    were read from, when not ``bundle_dir`` (a variant's base: its entries point into the base's files)."""
    bundle_dir = Path(bundle_dir)
    source = Path(source) if source is not None else bundle_dir
    out = dict(embeddings)
    for name in VIEW_TABLES:
        spec = embeddings.get(name)
        if spec is None or spec["dtype"] != "fp32":
            continue  # compact (fp16) tables are not what the graphs hold
        table = load_table(source, name, spec)
        offsets = find_groups(bundle_dir, weights, table) if weights else None
        if offsets is not None:
            out[name] = {"file": weights["file"], "dtype": spec["dtype"], "shape": list(spec["shape"]),
                         VIEW_KEY: offsets}
            if not is_view(spec) and Path(spec["file"]).parent.as_posix() == TABLE_DIR:
                (bundle_dir / spec["file"]).unlink(missing_ok=True)  # a variant's is a hard link: the base keeps it
        elif is_view(spec):
            out[name] = _write_out(bundle_dir, name, table, spec)
    return out


def moved_views(source: Path, out_dir: Path, embeddings: dict, rel: str, where: dict[tuple[int, int], int]) -> dict:
    """``embeddings`` (entries of the bundle at ``source``) for ``out_dir``, whose shared file ``rel`` holds some
    ranges of the source's at new offsets (``where``: (old offset, length) -> new offset, ``kztts.plan.pack``): a
    view into ``rel`` whose ranges all moved is pointed at them, any other view written out as a .npy."""
    out = dict(embeddings)
    for name, spec in embeddings.items():
        if not is_view(spec):
            continue
        length = view_length(spec)
        if spec["file"] == rel and all((int(o), length) in where for o in spec[VIEW_KEY]):
            out[name] = {**spec, VIEW_KEY: [where[(int(o), length)] for o in spec[VIEW_KEY]]}
        else:
            out[name] = _write_out(out_dir, name, load_table(source, name, spec), spec)
    return out


def view_length(spec: dict) -> int:
    """Bytes of one group of a view entry."""
    return int(np.prod(spec["shape"][1:])) * np.dtype(TABLE_DTYPES[spec["dtype"]]).itemsize


def _write_out(out_dir: Path, name: str, table, spec: dict) -> dict:
    """A view's table as a .npy of its own in ``out_dir``; its manifest entry."""
    (Path(out_dir) / TABLE_DIR).mkdir(parents=True, exist_ok=True)
    return save_table(out_dir, name, np.asarray(table), spec["dtype"])
