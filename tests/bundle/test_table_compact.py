"""``kztts.bundle.table_compact``: the compact tables a quantized variant and a device bundle keep, read back by the
runtime's table loader within half a step of each row's scale."""
from __future__ import annotations

import numpy as np
import pytest

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


def test_the_projected_text_table_is_what_the_prompt_reads(tiny_bundle_dir, tmp_path):
    """``text_projected``: T(id) of every text id stored 8 bits per row; the runtime's lookups read it in place of the
    table and the MLP, within half a step of each row's scale of the fp32 projection."""
    from kztts.bundle.embeddings import EmbeddingTables
    from kztts.bundle.table_compact import PROJECTED, project_text_table

    m = read_manifest(tiny_bundle_dir)
    out, check = project_text_table(tiny_bundle_dir, tmp_path, m.embeddings)
    assert PROJECTED in out and "text_embedding" not in out and "text_proj_fc1_w" not in out
    assert check["rows"] == m.embeddings["text_embedding"]["shape"][0] and check["cos_min"] > 0.9999
    exact = EmbeddingTables(tiny_bundle_dir, m.embeddings, m.special_ids)
    for name in ("codec_embedding", "cp_codec_embedding"):
        (tmp_path / out[name]["file"]).parent.mkdir(exist_ok=True)
        (tmp_path / out[name]["file"]).write_bytes((tiny_bundle_dir / out[name]["file"]).read_bytes())
    packed = EmbeddingTables(tmp_path, out, m.special_ids)
    ids = np.arange(0, exact.text_vocab, 997)
    scale = load_row_scales(tmp_path, PROJECTED, out[PROJECTED])[ids]
    assert np.all(np.abs(packed.text(ids) - exact.text(ids)) <= scale[:, None] / 2 + 1e-5)
    assert np.array_equal(packed.codec_sum(np.arange(16) * 3), exact.codec_sum(np.arange(16) * 3))


def test_a_projected_table_under_its_bound_is_refused(tiny_bundle_dir, small_target, tmp_path, monkeypatch):
    """One scale for the whole projected table (a bad build: 0.9982 on this model) fails the packed-tables bound and
    the pack is not written."""
    import kztts.bundle.table_compact as T
    import kztts.plan.pack as pack
    from kztts.core.errors import KzttsError

    def per_tensor(rows):
        s = np.full(rows.shape[0], np.abs(rows).max() / 127, np.float32)
        return np.clip(np.rint(rows / s[:, None]), -127, 127).astype(np.int8), s

    monkeypatch.setattr(T, "row_quantize", per_tensor)
    monkeypatch.setattr(pack, "_projection_pays", lambda embeddings: True)
    monkeypatch.setattr(pack, "resolve_plan", _all_cpu_plan_on_htp(pack.resolve_plan))
    with pytest.raises(KzttsError, match=r"projected text rows .* cosine 0\.99\d+ of the fp32 ones, under the 0\.999"):
        pack.pack_bundle(tiny_bundle_dir, tmp_path / "device", small_target)
    assert not (tmp_path / "device").exists()


def _all_cpu_plan_on_htp(resolve):
    """A CPU bundle's plan with one role marked as on the HTP: what the pack needs to go on to its tables."""
    from dataclasses import replace

    def plan(bundle, **kw):
        p = resolve(bundle, **{**kw, "target": None, "strict": False})
        p.steps["decoder"] = replace(p.steps["decoder"], device="htp")
        return p

    return plan
