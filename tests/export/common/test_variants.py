"""Precision variants of a bundle (int8/int4 MatMulNBits weights, fp16 KV I/O) against the fp32 bundle."""
from __future__ import annotations

import numpy as np
import pytest

from kztts.bundle.bundle import Bundle
from kztts.bundle.embeddings import EmbeddingTables
from kztts.core.metrics import cosine_rows
from kztts.generation.sampling import SamplingParams, XorShift32
from kztts.plan.resolve import resolve_plan
from kztts.runners.talker import Talker

FRAMES = 10


@pytest.fixture(scope="module")
def base_bundle():
    from kztts.export.tts.bundle_writer import cached_bundle
    from kztts.export.tts.tiny import cached_tiny

    return cached_bundle(cached_tiny("equal"))


def variant(base, **kw):
    from kztts.export.common.variants import cached_variant

    return cached_variant(base, **kw)


def run(bundle_dir, frames: int = FRAMES, codes=None, talker_graph: str = "talker"):
    """Greedy frames (or teacher-forced on ``codes``): talker logits [F, V], CP step logits of
    frame 0 [15, V], codes [F, 16]."""
    b = Bundle.open(bundle_dir, load_graphs=False)
    tables = EmbeddingTables.from_bundle(b)
    talker = Talker(b.session(talker_graph), b.manifest.talker, context=64)
    cp = resolve_plan(b, cp_mode="step").open_code_predictor(tables)
    rng = np.random.default_rng(0)
    prompt = rng.standard_normal((7, talker.hidden_size)).astype(np.float32) * 0.5
    logits, hidden = talker.prefill(prompt)
    out_logits, out_codes, cp_logits = [logits], [], None
    for k in range(frames):
        c0 = int(np.argmax(logits[:2048])) if codes is None else int(codes[k, 0])
        if codes is None:
            rest, _ = cp.predict(hidden, c0, SamplingParams.greedy_params(), XorShift32(1))
        else:
            rest = codes[k, 1:]
        if k == 0:
            cp_logits = cp.teacher_forced_logits(hidden, c0, rest)
        frame = np.concatenate([[c0], rest])
        out_codes.append(frame)
        if k + 1 < frames:
            logits, hidden = talker.decode(tables.codec_sum(frame).astype(np.float32))
            out_logits.append(logits)
    return np.stack(out_logits), cp_logits, np.stack(out_codes), b


def test_matmuls_become_matmulnbits_everywhere(base_bundle):
    """Every constant-weight MatMul of the Talker and both Code Predictor graphs is quantized, including
    the unrolled cp_frame steps that reach shared weights through Identity nodes."""
    import onnx

    b = Bundle.open(variant(base_bundle, weights="int4"), load_graphs=False)
    for name in ("talker", "cp_step", "cp_frame", "talker_gqa", "cp_frame_gqa"):
        m = onnx.load(str(b.path / b.manifest.graphs[name].file))
        inits = {i.name for i in m.graph.initializer}
        nodes = list(m.graph.node)
        for n in m.graph.node:  # the If branches of cp_step's head tree
            for a in n.attribute:
                if a.g is not None:
                    nodes += list(a.g.node)
        const_matmuls = [n.name for n in nodes if n.op_type == "MatMul" and n.input[1] in inits]
        nbits = [n for n in nodes if n.op_type == "MatMulNBits"]
        assert not const_matmuls, (name, const_matmuls[:3])
        assert nbits and all(next(a.i for a in n.attribute if a.name == "bits") == 4 for n in nbits)
        assert b.manifest.graphs[name].precision == "int4"


def test_block_size_reaches_every_matmulnbits(base_bundle, tmp_path):
    """``make_variant(block_size=..., accuracy_level=...)`` (the benchmarks' rows) quantizes with those
    settings, and the manifest says so; the bundles' own variants keep 128 and level 4."""
    import onnx

    from kztts.export.common.variants import ACCURACY_LEVEL, BLOCK_SIZE, make_variant

    out = make_variant(base_bundle, tmp_path / "b64", weights="int4", block_size=64, accuracy_level=1)
    b = Bundle.open(out, load_graphs=False)
    assert (b.manifest.data["variant"]["block_size"], b.manifest.data["variant"]["accuracy_level"]) == (64, 1)
    m = onnx.load(str(out / b.manifest.graphs["talker_gqa"].file))
    nbits = [n for n in m.graph.node if n.op_type == "MatMulNBits"]
    assert nbits and {tuple(next(a.i for a in n.attribute if a.name == k) for k in ("block_size", "accuracy_level"))
                      for n in nbits} == {(64, 1)}
    default = Bundle.open(variant(base_bundle, weights="int4"), load_graphs=False).manifest.data["variant"]
    assert (default["block_size"], default["accuracy_level"]) == (BLOCK_SIZE, ACCURACY_LEVEL) == (128, 4)


@pytest.mark.parametrize("graph", ["talker", "talker_gqa"])
@pytest.mark.parametrize("weights, talker_min, cp_min", [("int8", 0.999, 0.995), ("int4", 0.95, 0.85)])
def test_quantized_bundle_teacher_forced_accuracy(base_bundle, weights, talker_min, cp_min, graph):
    ref_logits, ref_cp, ref_codes, _ = run(base_bundle)
    logits, cp_logits, _, b = run(variant(base_bundle, weights=weights), codes=ref_codes, talker_graph=graph)
    assert b.manifest.data["variant"]["weights"] == weights
    talker_cos = cosine_rows(logits, ref_logits)
    cp_cos = cosine_rows(cp_logits, ref_cp)
    assert talker_cos.min() >= talker_min, talker_cos
    assert cp_cos.min() >= cp_min, cp_cos
    assert talker_cos.min() < 1.0 - 1e-9  # the weights really changed


def test_fp16_kv_agrees_with_fp32(base_bundle):
    ref_logits, ref_cp, ref_codes, _ = run(base_bundle)
    logits, cp_logits, codes, b = run(variant(base_bundle, weights="fp32", kv="fp16"))
    sess = b.session("talker")
    assert {i.type for i in sess.get_inputs() if i.name.startswith("past_")} == {"tensor(float16)"}
    assert {o.type for o in sess.get_outputs() if o.name.startswith("new_")} == {"tensor(float16)"}
    np.testing.assert_array_equal(codes, ref_codes)
    assert cosine_rows(logits, ref_logits).min() >= 0.99999
    assert cosine_rows(cp_logits, ref_cp).min() >= 0.99999
    # the Code Predictor's codec table, a view into the base's weights file, is one into the variant's own (written
    # anew, its layout its own): the same values, not the base's offsets read in another file
    spec = b.manifest.embeddings["cp_codec_embedding"]
    assert spec["file"] == b.manifest.data["weights"]["file"] and len(spec["offsets"]) == 15
    base = Bundle.open(base_bundle, load_graphs=False)
    assert np.array_equal(np.asarray(b.table("cp_codec_embedding")), np.asarray(base.table("cp_codec_embedding")))


def test_fp16_kv_fused_talker_runs_attention_in_fp16(base_bundle):
    """kv fp16 on ``talker_gqa``: the fused attention's cache is float16, so is the attention."""
    ref_logits, _, ref_codes, _ = run(base_bundle)
    logits, _, codes, b = run(variant(base_bundle, weights="fp32", kv="fp16"), talker_graph="talker_gqa")
    sess = b.session("talker_gqa")
    ins = {i.name: i.type for i in sess.get_inputs()}
    assert {t for n, t in ins.items() if n.startswith("past_")} == {"tensor(float16)"}
    assert ins["cos_cache"] == ins["sin_cache"] == "tensor(float16)"
    assert {o.type for o in sess.get_outputs() if o.name.startswith("present_")} == {"tensor(float16)"}
    np.testing.assert_array_equal(codes, ref_codes)
    cos = cosine_rows(logits, ref_logits)
    assert 0.9999 <= cos.min() and cos.min() < 1.0 - 1e-9, cos  # fp16 attention: close, not identical


def test_variant_rejects_unknown_precision(base_bundle):
    from kztts.core.errors import KzttsError

    with pytest.raises(KzttsError, match="int3"):
        variant(base_bundle, weights="int3")


def test_a_quantized_bundle_keeps_compact_tables(base_bundle, tmp_path):
    """int8/int4 weights come with compact tables: the text table 8 bits per row (one fp32 scale per row), the
    codec tables fp16, about half the bytes. Each text row is within half a step of its scale of the fp32 bundle's
    (measured: the prompt rows' cosine 0.99998 on the tiny model, benchmarks/tables); a bundle whose int8 table
    lost its scales is one line."""
    import json
    import shutil

    from kztts.bundle.manifest import read_manifest
    from kztts.core.errors import BundleError

    q = variant(base_bundle, weights="int4")
    full, small = read_manifest(base_bundle).embeddings, read_manifest(q).embeddings
    assert small["text_embedding"]["dtype"] == "int8" and "scale_file" in small["text_embedding"]
    assert small["codec_embedding"]["dtype"] == small["cp_codec_embedding"]["dtype"] == "fp16"
    assert small["text_proj_fc1_w"] == full["text_proj_fc1_w"]  # the projection stays fp32

    def size(bundle, spec):
        return sum((bundle / f).stat().st_size for s in spec.values() for f in (s["file"], s.get("scale_file")) if f)

    assert size(q, small) < 0.6 * size(base_bundle, full)
    t_full = EmbeddingTables.from_bundle(Bundle.open(base_bundle, load_graphs=False))
    t_small = EmbeddingTables.from_bundle(Bundle.open(q, load_graphs=False))
    ids = np.arange(0, t_full.text_vocab, 997)
    raw, rows = t_full.text_rows(ids), t_small.text_rows(ids)
    step = np.abs(raw).max(axis=1) / 127
    assert np.all(np.abs(rows - raw) <= step[:, None] * 0.5 + 1e-7)
    assert cosine_rows(t_small.text(ids), t_full.text(ids)).min() > 0.9999
    np.testing.assert_allclose(t_small.codec([0, 5, 100]), t_full.codec([0, 5, 100]), rtol=1e-3, atol=1e-6)
    broken = tmp_path / "broken"
    shutil.copytree(q, broken)
    data = json.loads((broken / "kztts.json").read_text())
    del data["embeddings"]["text_embedding"]["scale_file"]
    (broken / "kztts.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match="int8 table 'text_embedding' has no scale_file") as e:
        EmbeddingTables.from_bundle(Bundle.open(broken, load_graphs=False))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("variant, size", [("equal", "tiny"), ("proj", "tiny"), (None, "mha")])
def test_fp16_decoder_weights_halve_the_decoder_within_its_bound(variant, size, tmp_path):
    """``--decoder fp16``: the decoder's weights stored in fp16 behind Casts, judged against the fp32 decoder at
    export (``decoder_check``); good builds stay well above the bound."""
    from kztts.bundle.manifest import read_manifest
    from kztts.eval.acceptance import BOUNDS
    from kztts.export.common.variants import make_variant
    from kztts.export.tts.bundle_writer import cached_bundle
    from kztts.export.tts.tiny import cached_tiny

    base = cached_bundle(cached_tiny(variant, size=size))
    out = make_variant(base, tmp_path / "dec16", weights="fp32", kv="fp32", decoder="fp16")
    m = read_manifest(out)
    check = m.data["decoder_check"]
    assert check["snr_db"] >= BOUNDS["cpu-decoder-fp16"]["decoder_snr_db"][1] + 10, check
    assert m.graphs["decoder_stream"].precision == "fp16" and m.data["variant"]["decoder"] == "fp16"
    assert m.data["weights"]["bytes"] < read_manifest(base).data["weights"]["bytes"]
    Bundle.open(out)  # every graph opens over the variant's own weights file


def test_a_bad_fp16_decoder_is_refused(base_bundle, tmp_path, monkeypatch):
    """A decoder whose stored weights lose more than fp16 rounding (here: rounded to bf16) fails the bound, and the
    variant is not written."""
    import kztts.export.common.variants as V
    from kztts.core.errors import KzttsError
    from onnx import TensorProto, numpy_helper

    fp16 = V.fp16_weights

    def bf16(model, min_elements=1024):
        n = fp16(model, min_elements)
        for i, t in enumerate(model.graph.initializer):
            if t.data_type == TensorProto.FLOAT16:
                w = numpy_helper.to_array(t).astype(np.float32)
                b = (w.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32).astype(np.float16)
                model.graph.initializer[i].CopyFrom(numpy_helper.from_array(b, t.name))
        return n

    monkeypatch.setattr(V, "fp16_weights", bf16)
    with pytest.raises(KzttsError, match=r"fp16-weight decoder is \d+\.\d dB from the fp32 one, under the 40 dB"):
        V.make_variant(base_bundle, tmp_path / "bad", weights="fp32", kv="fp32", decoder="fp16")
    assert not (tmp_path / "bad").exists()
