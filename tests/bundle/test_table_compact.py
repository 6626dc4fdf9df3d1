"""``kztts.bundle.table_compact``: the compact tables a quantized variant and a device bundle keep, read back by the
runtime's table loader within half a step of each row's scale."""
from __future__ import annotations

import numpy as np

from kztts.bundle.embeddings import bf16_to_f32, load_row_scales, load_table
from kztts.bundle.manifest import read_manifest
from kztts.bundle.table_compact import compact_tables, is_compact, row_quantize


def test_row_quantize_is_within_half_a_step():
    rows = np.random.default_rng(0).normal(size=(64, 48)).astype(np.float32)
    rows[3] = 0
    codes, scale = row_quantize(rows)
    assert codes.dtype == np.int8 and scale[3] == 1 and not codes[3].any()
    assert np.all(np.abs(codes * scale[:, None] - rows) <= scale[:, None] / 2 + 1e-7)


def test_compact_tables_of_a_bundle(tiny_bundle_dir, tmp_path):
    tables = read_manifest(tiny_bundle_dir).embeddings
    assert not is_compact(tables)
    out = compact_tables(tiny_bundle_dir, tmp_path, tables)
    assert is_compact(out) and out["codec_embedding"]["dtype"] == "fp16"
    assert out["text_proj_fc1_w"] == tables["text_proj_fc1_w"]  # the projection stays as it is
    full = bf16_to_f32(np.asarray(load_table(tiny_bundle_dir, "text_embedding", tables["text_embedding"])))
    scale = load_row_scales(tmp_path, "text_embedding", out["text_embedding"])
    back = np.asarray(load_table(tmp_path, "text_embedding", out["text_embedding"]), np.float32) * scale[:, None]
    assert np.all(np.abs(back - full) <= scale[:, None] / 2 + 1e-6)
