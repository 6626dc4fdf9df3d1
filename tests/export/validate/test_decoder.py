"""The speech decoder on the HTP: the static ``decoder_chunk`` graph on the simulator (strict, fp16)
against the fp32 CPU decoder, tiny model, the test-sized simulator target (decoder on the HTP, 5
frames per run)."""
from __future__ import annotations

import pytest

# measured on the simulator (tiny model, seeded random codes): 46.9 dB over 10 frames, 47-50 dB per
# frame; 21 dB before SnakeBeta's Pow was folded into a Mul (kztts.export.htp.static_graphs)
MIN_SNR_DB = 40.0


def test_decoder_chunk_has_no_pow(htp_bundle):
    """SnakeBeta is folded in the HTP graph (sin^2 as a Mul): the HTP's fp16 Pow of a sine cost 30 dB of SNR
    (the transformer's RMSNorm squares with a Mul too: kztts.export.graphs.static_layers.SafeRMSNorm)."""
    import onnx

    from kztts.bundle.bundle import Bundle

    b = Bundle.open(htp_bundle, load_graphs=False)
    nodes = onnx.load(str(b.path / b.manifest.graphs["decoder_chunk"].file)).graph.node
    sines = {n.output[0] for n in nodes if n.op_type == "Sin"}
    assert sines and not [n.name for n in nodes if n.op_type == "Pow" and n.input[0] in sines]


def test_htp_decoder_snr_against_the_cpu_decoder(htp_bundle, small_target):
    pytest.importorskip("onnxruntime_qnn", reason="onnxruntime-qnn is not installed: pip install 'kztts[qnn]'")
    from kztts.export.validate.decoder import htp_decoder_snr

    r = htp_decoder_snr(htp_bundle, small_target, frames=5, strict=True)
    print(f"\nHTP decoder (decoder_chunk, fp16, simulator) vs fp32 CPU decoder: SNR {r['decoder_snr_db']:.1f} dB "
          f"over {r['decoder_frames']} frames")
    assert r["decoder_device"] == "htp" and r["decoder_graph"] == "decoder_chunk"
    assert MIN_SNR_DB <= r["decoder_snr_db"] < 120  # finite: it did not run on the CPU in fp32
