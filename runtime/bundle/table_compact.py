"""Compact embedding tables, written from a bundle's own (numpy only).

The text table 8 bits per row (symmetric, one fp32 scale per row: the 0.6B's 622 MB become 311 MB), the codec
tables fp16; the projection MLP stays fp32 (25 MB at 0.6B). Quantized precision variants
(``kztts export --weights int8|int4``) and device bundles (``kztts pack``) write them; ``kztts.bundle.embeddings``
reads either form.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from kztts.bundle.embeddings import bf16_to_f32, load_table, silu
from kztts.core.atomic import atomic_path

TABLE_DIR = "embeddings"
BLOCK_ROWS = 8192  # rows converted at a time (8192 x 2048 fp32 = 64 MB)
COMPACT_TABLES = ("text_embedding", "codec_embedding", "cp_codec_embedding")


def table_rel(name: str) -> str:
    """A table's file, relative to the bundle."""
    return f"{TABLE_DIR}/{name}.npy"


def save_table(out_dir: Path, name: str, arr: np.ndarray, dtype: str) -> dict:
    """Write ``arr`` as table ``name`` (never in place) and return its manifest entry."""
    with atomic_path(Path(out_dir) / table_rel(name)) as tmp, open(tmp, "wb") as f:
        np.save(f, arr)
    return {"file": table_rel(name), "dtype": dtype, "shape": list(arr.shape)}


def write_blocks(path: Path, dtype, shape: tuple[int, ...], blocks) -> None:
    """A .npy of ``shape`` written block by block (``blocks``: arrays in row order), never in place: a runtime may
    have the old table memory-mapped, and writing through ``open_memmap`` would count its dirty pages in RSS."""
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape}
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        for block in blocks:
            f.write(np.ascontiguousarray(block, dtype=dtype).tobytes())


def row_quantize(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 codes, fp32 scale per row) of float32 ``rows``: symmetric, ``max |row| / 127`` (1 for a zero row)."""
    peak = np.abs(rows).max(axis=1)
    scale = np.where(peak > 0, peak / np.float32(127), np.float32(1)).astype(np.float32)
    return np.clip(np.rint(rows / scale[:, None]), -127, 127).astype(np.int8), scale


def is_compact(embeddings: dict) -> bool:
    """True when the tables of a manifest's ``embeddings`` are in their compact form already."""
    text = embeddings.get("text_embedding")
    return text is None or text["dtype"] == "int8"


def compact_tables(base: Path, out_dir: Path, embeddings: dict) -> dict:
    """Write into ``out_dir`` the compact form of the TTS tables of the bundle at ``base`` (module docstring) and
    return its manifest ``embeddings`` entry; tables it does not compact keep their entries (and files)."""
    out = dict(embeddings)
    (Path(out_dir) / TABLE_DIR).mkdir(parents=True, exist_ok=True)
    spec = embeddings.get("text_embedding")
    if spec is not None and spec["dtype"] in ("bf16", "fp16"):
        table = load_table(base, "text_embedding", spec)
        rows, cols = (int(n) for n in table.shape)
        scales = np.empty(rows, np.float32)

        def codes():
            for start in range(0, rows, BLOCK_ROWS):
                block = table[start:start + BLOCK_ROWS]
                block = bf16_to_f32(block) if spec["dtype"] == "bf16" else block.astype(np.float32)
                q, scales[start:start + block.shape[0]] = row_quantize(block)
                yield q

        write_blocks(Path(out_dir) / table_rel("text_embedding.int8"), np.int8, (rows, cols), codes())
        save_table(out_dir, "text_embedding.scale", scales, "fp32")
        out["text_embedding"] = {"file": table_rel("text_embedding.int8"), "dtype": "int8", "shape": [rows, cols],
                                 "scale_file": table_rel("text_embedding.scale")}
    for name in ("codec_embedding", "cp_codec_embedding"):
        spec = embeddings.get(name)
        if spec is None or spec["dtype"] != "fp32":
            continue
        table = np.asarray(load_table(base, name, spec))
        with np.errstate(over="ignore"):
            half = table.astype(np.float16)
        if np.any(np.isinf(half) & np.isfinite(table)):
            continue  # beyond fp16: kept as it is
        out[name] = save_table(out_dir, f"{name}.fp16", half, "fp16")
    return out


PROJECTED = "text_projected"  # T(ids) for every text id, 8 bits per row: a device bundle's text table
# its worst row's cosine to the fp32 projection of the exported table, over the whole vocabulary (kztts pack refuses
# a table under it): good builds 0.999915 (0.6B shape) and 0.999938 (tiny), so 1 - cos is 12x under the bound's;
# bad builds caught: one scale for the whole table 0.998204, 4-bit rows 0.979699 (tiny;
# tests/bundle/test_table_compact.py). kztts.eval.acceptance.BOUNDS["packed-tables"] is this bound.
PROJECTED_COS_MIN = 0.999
PROJECTION_TABLES = ("text_embedding", "text_proj_fc1_w", "text_proj_fc1_b", "text_proj_fc2_w", "text_proj_fc2_b")


def project_text_table(base: Path, out_dir: Path, embeddings: dict) -> tuple[dict, dict]:
    """The text projection applied once to every row of the text table of the bundle at ``base`` and stored 8 bits
    per row (``text_projected``, [vocab, H]): what the prompt reads in place of the table and the projection MLP.
    At 0.6B it is half the compact text table (H 1024 against 2048 columns) and the MLP's 25 MB go. Returns the
    manifest ``embeddings`` without the table and the MLP but with ``text_projected``, and how far its rows are
    from the fp32 projection of the exported table: ``{"rows", "cos_min", "max_abs"}``."""
    spec = embeddings["text_embedding"]
    table = load_table(base, "text_embedding", spec)
    if spec["dtype"] not in ("bf16", "fp16"):
        raise ValueError(f"{base}: the text table is {spec['dtype']}; project the exported (16-bit) one")
    w = {n: np.asarray(load_table(base, n, embeddings[n]), dtype=np.float32) for n in PROJECTION_TABLES[1:]}
    fc1_wt, fc2_wt = np.ascontiguousarray(w["text_proj_fc1_w"].T), np.ascontiguousarray(w["text_proj_fc2_w"].T)
    rows, hidden = int(table.shape[0]), int(fc2_wt.shape[1])
    scales = np.empty(rows, np.float32)
    worst = {"cos_min": 1.0, "max_abs": 0.0}

    def codes():
        for start in range(0, rows, BLOCK_ROWS):
            block = table[start:start + BLOCK_ROWS]
            x = bf16_to_f32(block) if spec["dtype"] == "bf16" else block.astype(np.float32)
            t = silu(x @ fc1_wt + w["text_proj_fc1_b"]) @ fc2_wt + w["text_proj_fc2_b"]
            q, s = row_quantize(t)
            scales[start:start + t.shape[0]] = s
            back = q.astype(np.float32) * s[:, None]
            num = np.einsum("ij,ij->i", back, t)
            den = np.linalg.norm(back, axis=1) * np.linalg.norm(t, axis=1)
            cos = np.where(den > 0, num / np.maximum(den, np.float32(1e-30)), 1.0)
            worst["cos_min"] = min(worst["cos_min"], float(cos.min()))
            worst["max_abs"] = max(worst["max_abs"], float(np.abs(back - t).max()))
            yield q

    (Path(out_dir) / TABLE_DIR).mkdir(parents=True, exist_ok=True)
    write_blocks(Path(out_dir) / table_rel(f"{PROJECTED}.int8"), np.int8, (rows, hidden), codes())
    save_table(out_dir, f"{PROJECTED}.scale", scales, "fp32")
    out = {n: s for n, s in embeddings.items() if n not in PROJECTION_TABLES}
    out[PROJECTED] = {"file": table_rel(f"{PROJECTED}.int8"), "dtype": "int8", "shape": [rows, hidden],
                      "scale_file": table_rel(f"{PROJECTED}.scale")}
    return out, {"rows": rows, "cos_min": worst["cos_min"], "max_abs": worst["max_abs"]}
