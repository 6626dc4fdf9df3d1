"""The speech decoder's CPU static int8 (``kztts export --decoder int8-static``): every Conv and MatMul of the
``decoder`` / ``decoder_stream`` graph in QDQ with per-output-channel int8 weights and uint8 activations whose
ranges are calibrated on the graph's own calls (``kztts.export.common.graph_qdq``'s ``cpu_int8`` recipe), so
ONNX Runtime runs them with its int8 kernels (QLinearConv, QLinearMatMul / MatMulIntegerToFloat).

The recipe is the one the real-vocoder study kept (benchmarks/piper_decoder: Piper's trained HiFi-GAN decoder
under each recipe, judged by the ASR round trip and DNSMOS); ``dynamic_int8`` (per-tensor weights, activations
ranged per call) is the option benchmarks/decoder rejected at 16.7 dB.

Calibration feeds: the graph's calls while the bundle's decoder decodes seeded random codes (``CALIBRATION_FRAMES``
frames, streamed in ``CALIBRATION_CHUNK``-frame runs for ``decoder_stream``): the codes reach every codebook entry
a model can emit, and the decoder does not feed back into generation.
"""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np

from kztts.bundle.bundle import Bundle
from kztts.export.common import graph_qdq as Q
from kztts.runners.codec import Decoder, StreamingDecoder, decoder_kwargs

log = logging.getLogger(__name__)

RECIPE = "cpu_int8"
CALIBRATION_FRAMES = 48
CALIBRATION_CHUNK = 4
SEED = 0


class _Recorder:
    """Stands in for a decoder session, keeping a copy of every feed."""

    def __init__(self, session):
        self.session, self.feeds = session, []

    def run(self, names, feed, *args, **kwargs):
        self.feeds.append({k: np.array(v) for k, v in feed.items()})
        return self.session.run(names, feed, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.session, name)


def decoder_feeds(bundle_dir: str | Path, name: str, frames: int = CALIBRATION_FRAMES, seed: int = SEED) -> list[dict]:
    """The feeds of graph ``name`` (``decoder`` or ``decoder_stream``) while it decodes seeded random codes."""
    bundle = Bundle.open(bundle_dir, load_graphs=False)
    kw = decoder_kwargs(bundle, name, {})
    rec = _Recorder(bundle.session(name))
    codes = np.random.default_rng(seed).integers(0, kw["codebook_size"], (frames, 16)).astype(np.int64)
    if name == "decoder_stream":
        stream = StreamingDecoder(rec, chunk_size=kw["chunk_size"], left_context=kw["left_context"])
        for i in range(0, frames, CALIBRATION_CHUNK):
            stream.push(codes[i:i + CALIBRATION_CHUNK])
    else:
        Decoder(rec, **kw).decode(codes)
    return rec.feeds


def quantize_decoder_graph(src: str | Path, dst: str | Path, feeds: list[dict]) -> Path:
    """``src`` (a float decoder graph) as the CPU's static int8 QDQ graph at ``dst``, calibrated on ``feeds``."""
    with tempfile.TemporaryDirectory(prefix="kztts-decoder-qdq-") as tmp:
        prepared = Q.prepare(src, Path(tmp) / "prepared.onnx")
        count = Q.graph_ranges(prepared, feeds, Path(tmp) / "ranges.json")
        Q.quantize(prepared, dst, RECIPE, Path(tmp) / "ranges.json")
    log.info("%s: static int8 (%s), calibrated on %d calls", Path(src).name, RECIPE, count)
    return Path(dst)


__all__ = ["CALIBRATION_FRAMES", "RECIPE", "decoder_feeds", "quantize_decoder_graph"]
