"""``kztts export --decoder int8-static`` (kztts.export.common.decoder_qdq, variants): the decoder graphs' Convs and
MatMuls in static int8 QDQ. The codes do not change (the decoder does not feed back); the samples keep the SNR
measured on the tiny model; speed is benchmarks/decoder's business, not a test's."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("onnx")

# Measured on the tiny "equal" model (random weights), 30 frames: 16.2 dB; the real-weight study's static int8
# (benchmarks/piper_decoder) kept Piper's speech at 18-19 dB. Bound: the measured value less 3 dB.
MIN_SNR_DB = 13.0


@pytest.fixture(scope="module")
def int8_static(equal_bundle):
    from kztts.export.common.variants import cached_variant

    return cached_variant(equal_bundle, weights="fp32", decoder="int8-static")


def test_manifest_records_the_decoder_precision(int8_static):
    import onnx

    data = json.loads((int8_static / "kztts.json").read_text())
    assert data["variant"]["decoder"] == "int8-static"
    for name in ("decoder", "decoder_stream"):
        spec = data["graphs"][name]
        assert spec["precision"] == "int8-static"
        ops = {n.op_type for n in onnx.load(str(int8_static / spec["file"])).graph.node}
        assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops
    assert data["graphs"]["talker"]["precision"] == json.loads(
        (int8_static.parent / data["variant"]["base"] / "kztts.json").read_text())["graphs"]["talker"]["precision"]


def test_codes_unchanged_and_samples_within_bound(equal_bundle, int8_static):
    from kztts.core.audio import synthetic_voice
    from kztts.core.metrics import snr_db
    from kztts.tts.tts import TTS

    out = []
    for b in (equal_bundle, int8_static):
        tts = TTS(b)
        out.append(tts.synthesize("Hello there, this is a test.", tts.voice_from_wav(synthetic_voice(), 24000),
                                  seed=3, max_frames=30))
    assert np.array_equal(out[0].codes, out[1].codes)
    assert snr_db(out[1].samples, out[0].samples) >= MIN_SNR_DB


def test_calibration_feeds_cover_the_stream(equal_bundle):
    from kztts.export.common.decoder_qdq import CALIBRATION_FRAMES, decoder_feeds

    feeds = decoder_feeds(equal_bundle, "decoder_stream")
    assert len(feeds) >= CALIBRATION_FRAMES // 4 and all("codes" in f for f in feeds)
    assert any(np.abs(v).max() > 0 for k, v in feeds[-1].items() if k.startswith("state_"))  # a carried state
