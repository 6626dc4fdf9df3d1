"""The bundle's embedding tables, memory-mapped, and the lookups the prompt and decode loop need.

numpy only. ``np.load(mmap_mode="r")`` keeps the 151936 x 2048 text table on disk:
a lookup reads only the rows it gathers.

- ``text(ids)``      T(ids) = fc2(silu(fc1(text_embedding[ids])))        f32 [n, H]
- ``codec(ids)``     C(ids) = codec_embedding[ids]                        f32 [n, H]
- ``cp_codec(g, ids)``  code-predictor embedding g (0-based: code group g+1) f32 [n, H]
- ``codec_sum(codes)``  C(c0) + sum_{g=1..15} cp_codec[g-1](c_g): the talker input of one
  frame ([16] -> [H]) or of several ([F, 16] -> [F, H])
- ``tts_bos`` / ``tts_eos`` / ``tts_pad``  T of the special text ids, f32 [H], cached

A bundle with quantized weights (``kztts export --weights int8|int4``) keeps its tables compact: the text table in
8 bits per row (``dtype`` "int8" and a ``scale_file`` of one fp32 scale per row: a row is ``int8 * scale``), the
codec tables in fp16 (``kztts.bundle.table_compact.compact_tables``). A device bundle (``kztts pack``) stores
``text_projected`` instead: T(ids) of every text id, 8 bits per row, in place of the table and the MLP.

``cp_codec_embedding`` is usually a view into the graphs' shared weights file (an entry with ``offsets``, one per
group: ``kztts.bundle.table_views``), mapped as read-only slices (``TableSlices``); an older bundle's .npy loads too.
"""
from __future__ import annotations

from functools import cached_property
from pathlib import Path

import numpy as np

from kztts.core.errors import BundleError, KzttsError

VIEW_KEY = "offsets"  # a table entry that is a view into another file (``TableSlices``)
TABLE_DTYPES = {"bf16": np.uint16, "fp16": np.float16, "fp32": np.float32, "int8": np.int8}
_PROJECTED = "text_projected"  # kztts.bundle.table_compact.project_text_table (kztts pack)
_CODEC_TABLES = ("codec_embedding", "cp_codec_embedding")
_TABLES = ("text_embedding", "text_proj_fc1_w", "text_proj_fc1_b", "text_proj_fc2_w", "text_proj_fc2_b",
           *_CODEC_TABLES)


def bf16_to_f32(u: np.ndarray) -> np.ndarray:
    """float32 values of bf16 bit patterns (uint16): exact."""
    return (np.asarray(u, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-x) -> inf for very negative x gives x/inf = -0
        return x / (np.float32(1.0) + np.exp(-x))


def load_table(bundle_dir: Path, name: str, spec: dict) -> "np.ndarray | TableSlices":
    """One table of the manifest, memory-mapped and checked against its spec: a .npy, or a view into the graphs'
    shared weights file (``offsets``: ``TableSlices``)."""
    try:
        f = Path(bundle_dir) / spec["file"]
        dtype, shape = spec["dtype"], list(spec["shape"])
        offsets = [int(o) for o in spec[VIEW_KEY]] if VIEW_KEY in spec else None
    except (KeyError, TypeError, ValueError) as exc:
        raise BundleError(f"{bundle_dir}/kztts.json: embeddings entry {name!r} is malformed "
                          f"(missing {exc}); re-export the bundle") from exc
    if offsets is not None:
        return _load_view(f, name, dtype, shape, offsets)
    if not f.is_file():
        raise BundleError(f"{f}: embedding table {name!r} is missing; re-export the bundle")
    try:
        arr = np.load(f, mmap_mode="r")
    except (ValueError, OSError, EOFError) as exc:
        raise BundleError(f"{f}: unreadable embedding table ({exc}); re-export the bundle") from exc
    want = TABLE_DTYPES.get(dtype)
    if want is None or arr.dtype != want or list(arr.shape) != shape:
        raise BundleError(f"{f}: table is {arr.dtype}{list(arr.shape)}, the manifest says "
                          f"{dtype}{shape}; re-export the bundle")
    return arr


class TableSlices:
    """A table stored as ``shape[0]`` slices at offsets of one file (the graphs' shared weights file, which holds the
    Code Predictor's codec embeddings as its graphs' weights): each slice a read-only ``np.memmap``, the table never
    copied into memory. ``table[i]`` is slice i, as of the stacked array; ``np.asarray(table)`` stacks them (a copy:
    the compact tables and a pack's materialised table)."""

    def __init__(self, parts: list[np.memmap]):
        self.parts = tuple(parts)
        self.dtype = self.parts[0].dtype
        self.shape = (len(self.parts), *self.parts[0].shape)
        self.ndim = len(self.shape)

    def __len__(self) -> int:
        return len(self.parts)

    def __getitem__(self, index):
        if isinstance(index, (int, np.integer)):
            return self.parts[index]
        return np.asarray(self)[index]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = np.stack(self.parts)
        return out if dtype is None else out.astype(dtype, copy=False)


def _load_view(f: Path, name: str, dtype: str, shape: list[int], offsets: list[int]) -> TableSlices:
    want = TABLE_DTYPES.get(dtype)
    if want is None or len(shape) < 2 or len(offsets) != shape[0] or shape[0] < 1:
        raise BundleError(f"{f}: embedding table {name!r} is {dtype}{shape} at {len(offsets)} offsets in this file; "
                          "the manifest entry is malformed; re-export the bundle")
    if not f.is_file():
        raise BundleError(f"{f}: the shared weights file holding embedding table {name!r} is missing; "
                          "re-export the bundle")
    part = tuple(shape[1:])
    length = int(np.prod(part)) * np.dtype(want).itemsize
    size = f.stat().st_size
    end = max(offsets) + length
    if min(offsets) < 0 or end > size:
        raise BundleError(f"{f}: {size} bytes, embedding table {name!r} reads up to byte {end}: the shared weights "
                          "file is truncated or from another export; re-export the bundle")
    return TableSlices([np.memmap(f, dtype=want, mode="r", offset=o, shape=part) for o in offsets])


def load_row_scales(bundle_dir: Path, name: str, spec: dict) -> np.ndarray | None:
    """The per-row fp32 scales of an int8 table (its ``scale_file``), None for a float table."""
    if spec.get("dtype") != "int8":
        return None
    rows = int(spec["shape"][0])
    scales = load_table(bundle_dir, f"{name} scales", {"file": spec.get("scale_file", ""), "dtype": "fp32",
                                                       "shape": [rows]}) if spec.get("scale_file") else None
    if scales is None:
        raise BundleError(f"{bundle_dir}/kztts.json: int8 table {name!r} has no scale_file; re-export the bundle")
    return scales


class EmbeddingTables:
    """Embedding tables of a bundle. Opening maps the files; nothing big is read."""

    def __init__(self, bundle_dir: str | Path, embeddings: dict, special_ids: dict):
        self.bundle_dir = Path(bundle_dir)
        # a device bundle stores T(ids) itself (text_projected) in place of the text table and its MLP
        projected = _PROJECTED in embeddings
        names = (_PROJECTED, *_CODEC_TABLES) if projected else _TABLES
        missing = [n for n in names if n not in embeddings]
        if missing:
            raise BundleError(f"{self.bundle_dir}/kztts.json: embeddings lack {missing}; re-export the bundle")
        self.specs = {n: dict(embeddings[n]) for n in names}
        t = {n: load_table(self.bundle_dir, n, self.specs[n]) for n in names}
        self.codec_table = t["codec_embedding"]
        self.cp_codec_table = t["cp_codec_embedding"]
        self.codec_vocab, self.hidden = (int(s) for s in self.codec_table.shape)
        self.num_cp_groups, self.cp_vocab = int(self.cp_codec_table.shape[0]), int(self.cp_codec_table.shape[1])
        shapes_ok = self.cp_codec_table.shape[2] == self.hidden
        self.projected = None
        if projected:
            self.projected = t[_PROJECTED]
            self.projected_scales = load_row_scales(self.bundle_dir, _PROJECTED, self.specs[_PROJECTED])
            if self.projected_scales is None:
                raise BundleError(f"{self.bundle_dir}/kztts.json: {_PROJECTED} should be int8 rows with a "
                                  "scale_file")
            self.text_vocab = int(self.projected.shape[0])
            shapes_ok = shapes_ok and self.projected.shape[1] == self.hidden
        else:
            self.text_dtype = self.specs["text_embedding"]["dtype"]
            if self.text_dtype not in ("bf16", "fp16", "int8"):
                raise BundleError(f"{self.bundle_dir / self.specs['text_embedding']['file']}: text_embedding "
                                  f"dtype {self.text_dtype!r}; expected 'bf16', 'fp16' or 'int8'")
            self.text_table = t["text_embedding"]  # np.memmap, never read whole
            self.text_scales = load_row_scales(self.bundle_dir, "text_embedding", self.specs["text_embedding"])
            # small tables: read once, fp32, pre-transposed for x @ W^T
            self.fc1_wt = np.ascontiguousarray(np.asarray(t["text_proj_fc1_w"], dtype=np.float32).T)
            self.fc1_b = np.asarray(t["text_proj_fc1_b"], dtype=np.float32)
            self.fc2_wt = np.ascontiguousarray(np.asarray(t["text_proj_fc2_w"], dtype=np.float32).T)
            self.fc2_b = np.asarray(t["text_proj_fc2_b"], dtype=np.float32)
            self.text_vocab, self.text_hidden = (int(s) for s in self.text_table.shape)
            shapes_ok = (shapes_ok and self.fc1_wt.shape[0] == self.text_hidden
                         and self.fc1_b.shape == (self.fc1_wt.shape[1],)
                         and self.fc2_wt.shape == (self.fc1_wt.shape[1], self.hidden)
                         and self.fc2_b.shape == (self.hidden,))
        if not shapes_ok:
            raise BundleError(f"{self.bundle_dir}/kztts.json: embedding table shapes do not fit together "
                              f"({ {n: self.specs[n]['shape'] for n in names} }); re-export the bundle")
        try:
            self._special = {k: int(special_ids[k]) for k in ("tts_bos", "tts_eos", "tts_pad")}
        except KeyError as exc:
            raise BundleError(f"{self.bundle_dir}/kztts.json: special_ids lacks {exc}") from exc

    @classmethod
    def from_bundle(cls, bundle) -> "EmbeddingTables":
        """From an opened ``kztts.bundle.bundle.Bundle``."""
        return cls(bundle.path, bundle.manifest.embeddings, bundle.manifest.special_ids)

    # ------------------------------------------------------------------ lookups
    @staticmethod
    def _ids(ids, vocab: int, what: str) -> np.ndarray:
        a = np.asarray(ids)
        if a.dtype.kind not in "iu":
            raise KzttsError(f"{what} ids must be integers, got {a.dtype}")
        a = a.astype(np.int64).reshape(-1)
        if a.size and (a.min() < 0 or a.max() >= vocab):
            bad = a[(a < 0) | (a >= vocab)][0]
            raise KzttsError(f"{what} id {int(bad)} is outside the table (0..{vocab - 1})")
        return a

    def text_rows(self, ids) -> np.ndarray:
        """Raw text embedding rows (before the projection), f32 [n, text_hidden]."""
        idx = self._ids(ids, self.text_vocab, "text")
        rows = self.text_table[idx]
        if self.text_dtype == "int8":
            return rows.astype(np.float32) * self.text_scales[idx][:, None]
        return bf16_to_f32(rows) if self.text_dtype == "bf16" else rows.astype(np.float32)

    def project(self, x: np.ndarray) -> np.ndarray:
        """The text projection fc2(silu(fc1(x))), float32, each row the same whatever rows come with it.

        BLAS computes a one-row product with another kernel (gemv) than a product of several rows (gemm),
        and the two round differently; a row of a gemm does not depend on the others. So a single row is
        computed as a two-row product: a text whose tokens arrive one by one
        (``kztts.tts.text.track``) then gets the very rows of the whole text projected at once."""
        x = np.asarray(x, dtype=np.float32)
        one = x.ndim == 2 and x.shape[0] == 1
        if one:
            x = np.concatenate([x, x])
        h = x @ self.fc1_wt + self.fc1_b
        out = silu(h) @ self.fc2_wt + self.fc2_b
        return out[:1] if one else out

    def text(self, ids) -> np.ndarray:
        """T(ids): projected text embeddings, f32 [n, H]."""
        if self.projected is not None:
            idx = self._ids(ids, self.text_vocab, "text")
            return self.projected[idx].astype(np.float32) * self.projected_scales[idx][:, None]
        return self.project(self.text_rows(ids)).astype(np.float32, copy=False)

    def codec(self, ids) -> np.ndarray:
        """C(ids): talker codec embeddings, f32 [n, H]."""
        return np.asarray(self.codec_table[self._ids(ids, self.codec_vocab, "codec")], dtype=np.float32)

    def cp_codec(self, group_index: int, ids) -> np.ndarray:
        """Code-predictor codec embedding ``group_index`` (0..14, used for code group g = index + 1)."""
        if not 0 <= int(group_index) < self.num_cp_groups:
            raise KzttsError(f"code-predictor embedding index {group_index} outside 0..{self.num_cp_groups - 1}")
        table = self.cp_codec_table[int(group_index)]
        return np.asarray(table[self._ids(ids, self.cp_vocab, "code-predictor codec")], dtype=np.float32)

    def codec_sum(self, codes) -> np.ndarray:
        """Talker input of a frame: C(c0) + sum_{g=1..15} cp_codec[g-1](c_g).

        ``codes`` [16] -> f32 [H]; [F, 16] -> f32 [F, H]."""
        c = np.asarray(codes)
        single = c.ndim == 1
        c = c.reshape(1, -1) if single else c
        n_groups = self.num_cp_groups + 1
        if c.ndim != 2 or c.shape[1] != n_groups:
            raise KzttsError(f"a frame has {n_groups} codes; got codes of shape {np.asarray(codes).shape}")
        e = self.codec(c[:, 0])
        for g in range(1, n_groups):
            e = e + self.cp_codec(g - 1, c[:, g])
        return e[0] if single else e

    @cached_property
    def tts_bos(self) -> np.ndarray:
        return self.text([self._special["tts_bos"]])[0]

    @cached_property
    def tts_eos(self) -> np.ndarray:
        return self.text([self._special["tts_eos"]])[0]

    @cached_property
    def tts_pad(self) -> np.ndarray:
        return self.text([self._special["tts_pad"]])[0]
