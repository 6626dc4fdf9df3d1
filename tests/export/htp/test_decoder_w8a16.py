"""``kztts export --target T --decoder w8a16`` (kztts.export.htp.static_graphs.export_decoder_chunk): the speech
decoder's static graph on the HTP in QDQ, per-channel int8 weights and 16-bit activations calibrated on the frames
the model speaks. The manifest records it, the simulator runs it within its bound against the fp32 CPU decoder, the
codes do not change (the decoder does not feed back), and a build with one wrong weight scale fails the bound."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("onnx")

from kztts.eval.acceptance import BOUNDS  # noqa: E402
from support import save_bundle_graph  # noqa: E402

W8A16_BOUND = BOUNDS["htp-decoder-w8a16"]["decoder_snr_db"][1]
FP16_BOUND = BOUNDS["htp-decoder"]["decoder_snr_db"][1]
# The HTP recipe on the float decoder_chunk, run on the CPU EP (which predicts the HTP on QDQ graphs, docs/QNN_EP.md):
# measured 20.4 dB over 10 frames of seeded random codes, calibrated on 48 other random frames. Bound: 3 dB less.
CPU_EP_MIN_SNR_DB = 17.0
CORRUPTED_SCALE = "dec.pre_conv.conv.weight_scale"  # the first Conv after the codebooks: every sample goes through it


def _qnn():
    pytest.importorskip("onnxruntime_qnn", reason="onnxruntime-qnn is not installed: pip install 'kztts[qnn]'")


@pytest.fixture(scope="module")
def w8a16_bundle(tiny_dir, decoder_target):
    from kztts.export.tts.bundle_writer import cached_target_bundle

    return cached_target_bundle(tiny_dir, decoder_target, decoder_precision="w8a16")


def _weight_dqs(model) -> list[tuple]:
    """[(node, the DequantizeLinear of its constant weight)] of the Conv, ConvTranspose, MatMul and Gemm nodes."""
    inits = {t.name for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    out = []
    for n in model.graph.node:
        dq = producer.get(n.input[1]) if n.op_type in ("Conv", "ConvTranspose", "MatMul", "Gemm") else None
        if dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] in inits:
            out.append((n, dq))
    return out


def test_the_htp_recipe_on_the_float_decoder_chunk(htp_bundle, tmp_path):
    """``decoder_qdq.HTP_RECIPE`` on the fp16 bundle's float ``decoder_chunk``: every Conv, ConvTranspose, MatMul and
    Gemm weight int8 per output channel, 16-bit activations, the LayerNormalizations float; on the CPU EP its samples
    keep their bound against the float graph's."""
    import onnx
    import onnxruntime as ort

    from kztts.bundle.bundle import Bundle
    from kztts.core.metrics import snr_db
    from kztts.export.common.decoder_qdq import HTP_RECIPE, quantize_decoder_graph
    from kztts.export.htp.calibration import chunk_decoder_feeds
    from kztts.export.validate.decoder import decoder_codes
    from kztts.runners.codec import StaticChunkDecoder

    b = Bundle.open(htp_bundle, load_graphs=False)
    src = b.path / b.manifest.graphs["decoder_chunk"].file
    cal = decoder_codes(48, 2048, seed=1)
    feeds = chunk_decoder_feeds(src, cal, 2048)
    assert len(feeds) == 10 and any(np.abs(v).max() > 0 for k, v in feeds[-1].items() if k.startswith("state_"))
    dst = quantize_decoder_graph(src, tmp_path / "decoder_chunk.w8a16.onnx", feeds, recipe=HTP_RECIPE)

    model = onnx.load(str(dst))
    inits = {t.name: t for t in model.graph.initializer}
    weighted = _weight_dqs(model)
    # no ConvTranspose: the HTP's decoder_chunk writes each as a Conv (static_graphs.HTP_DECODER_OPTIONS)
    assert {n.op_type for n, _ in weighted} >= {"Conv", "MatMul"} and len(weighted) >= 50
    for n, dq in weighted:
        codes, scale = inits[dq.input[0]], inits[dq.input[1]]
        assert codes.data_type == onnx.TensorProto.INT8, n.name
        axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
        transposed = any(a.name == "transB" and a.i for a in n.attribute)
        assert axis == {"Conv": 0, "ConvTranspose": 1, "Gemm": 0 if transposed else 1}.get(n.op_type, 1), n.name
        assert list(scale.dims) == [codes.dims[axis]], n.name  # one scale per output channel
    act_types = {inits[q.input[2]].data_type for q in model.graph.node if q.op_type == "QuantizeLinear"}
    assert act_types == {onnx.TensorProto.UINT16}
    norms = [n for n in model.graph.node if n.op_type == "LayerNormalization"]
    assert norms and all(n.input[1] in inits and inits[n.input[1]].data_type == onnx.TensorProto.FLOAT for n in norms)

    codes = decoder_codes(10, 2048)
    ref = StaticChunkDecoder(ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])).decode(codes)
    got = StaticChunkDecoder(ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])).decode(codes)
    snr = snr_db(got, ref)
    print(f"\nw8a16 decoder_chunk on the CPU EP vs its float graph: {snr:.1f} dB")
    assert CPU_EP_MIN_SNR_DB <= snr < FP16_BOUND


# slow: it pays for the file's export (CPU graphs, the calibration prompts spoken, the QDQ graph): 28 s here at load
# 0.3, 57 s at load 10-13, at an empty cache; the file's other tests then take seconds
@pytest.mark.slow
def test_the_manifest_records_w8a16_and_the_cost_counts_it(w8a16_bundle, decoder_target):
    import onnx

    from kztts.htp.cost import bundle_cost
    from kztts.htp.targets import load_target

    data = json.loads((w8a16_bundle / "kztts.json").read_text())
    spec = data["graphs"]["decoder_chunk"]
    assert spec["precision"] == "w8a16" and spec["file"] == "graphs/decoder_chunk.w8a16.onnx"
    assert not (w8a16_bundle / "graphs" / "decoder_chunk.onnx").exists()  # the float graph is not shipped
    ops = {n.op_type for n in onnx.load(str(w8a16_bundle / spec["file"])).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops and "ConvTranspose" not in ops
    static = {n for n, g in data["graphs"].items() if g["variant"] == "static" and n != "cp_frame"}
    assert static == {"decoder_chunk"}  # the target places only the decoder on the HTP
    rows = {r["role"]: r for r in bundle_cost(w8a16_bundle, load_target(decoder_target))["graphs"]}
    assert rows["decoder"]["graph"] == "decoder_chunk" and rows["decoder"]["precision"] == "w8a16"


@pytest.mark.slow
def test_the_simulator_meets_the_w8a16_bound(w8a16_bundle, decoder_target):
    _qnn()
    from kztts.export.validate.decoder import htp_decoder_snr

    r = htp_decoder_snr(w8a16_bundle, decoder_target, frames=5, strict=True)
    print(f"\nHTP decoder (decoder_chunk, w8a16, simulator) vs fp32 CPU decoder: SNR {r['decoder_snr_db']:.1f} dB "
          f"over {r['decoder_frames']} frames")
    assert (r["decoder_device"], r["decoder_graph"], r["decoder_precision"]) == ("htp", "decoder_chunk", "w8a16")
    assert W8A16_BOUND <= r["decoder_snr_db"] < FP16_BOUND  # the quantized graph ran, not the fp16 one


@pytest.mark.slow
def test_codes_unchanged_and_samples_within_the_bound(w8a16_bundle, decoder_target):
    """The same bundle spoken with the decoder on the HTP simulator (w8a16, strict) and on the CPU (fp32): the same
    codes (the decoder does not feed back), samples within the bound."""
    _qnn()
    from kztts.core.audio import synthetic_voice
    from kztts.core.metrics import snr_db
    from kztts.htp.qnn import Placement
    from kztts.tts.tts import TTS

    out = []
    for target in (None, decoder_target):
        tts = TTS(w8a16_bundle, target=target, strict=target is not None)
        voice = tts.voice_from_wav(synthetic_voice(), 24000)
        out.append(tts.synthesize("Hello there.", voice, greedy=True, max_frames=7))
    pl = Placement.of(tts.plan.session("decoder_chunk"))
    assert pl.cpu_nodes == 0 and pl.qnn_nodes > 0
    assert out[0].frames == 7 and np.array_equal(out[0].codes, out[1].codes)
    snr = snr_db(out[1].samples, out[0].samples)
    print(f"\nspoken, w8a16 decoder on the HTP simulator vs the fp32 CPU decoder: {snr:.1f} dB")
    assert snr >= W8A16_BOUND


@pytest.mark.slow
def test_a_wrong_weight_scale_fails_the_bound(w8a16_bundle, decoder_target, tmp_path):
    """One Conv's weight scales doubled (the bug a scale written for another tensor or layout would be): the SNR falls
    below the bound (measured 11.9 dB), so ``kztts validate --target`` fails the build."""
    _qnn()
    import onnx
    from onnx import numpy_helper

    from kztts.eval.acceptance import judge
    from kztts.export.validate.decoder import htp_decoder_snr

    bad = tmp_path / "bad"
    shutil.copytree(w8a16_bundle, bad)
    f = bad / "graphs" / "decoder_chunk.w8a16.onnx"
    model = onnx.load(str(f))
    (scale,) = [t for t in model.graph.initializer if t.name == CORRUPTED_SCALE]
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * np.float32(2), scale.name))
    save_bundle_graph(model, bad, "graphs/decoder_chunk.w8a16.onnx")
    r = htp_decoder_snr(bad, decoder_target, frames=5, strict=True)
    print(f"\nw8a16 decoder with {CORRUPTED_SCALE} x 2: SNR {r['decoder_snr_db']:.1f} dB")
    assert r["decoder_snr_db"] < W8A16_BOUND
    assert not judge(r, BOUNDS["htp-decoder-w8a16"])
