"""The speech decoder's 8-bit graphs, by the recipes of ``kztts.export.common.graph_qdq``.

CPU static int8 (``kztts export --decoder int8-static``): every Conv and MatMul of the
``decoder`` / ``decoder_stream`` graph in QDQ with per-output-channel int8 weights and uint8 activations whose
ranges are calibrated on the graph's own calls (``kztts.export.common.graph_qdq``'s ``cpu_int8`` recipe), so
ONNX Runtime runs them with its int8 kernels (QLinearConv, QLinearMatMul / MatMulIntegerToFloat).

The recipe is the one the real-vocoder study kept (benchmarks/piper_decoder: Piper's trained HiFi-GAN decoder
under each recipe, judged by the ASR round trip and DNSMOS); ``dynamic_int8`` (per-tensor weights, activations
ranged per call) is the option benchmarks/decoder rejected at 16.7 dB.

Calibration feeds: the graph's calls while the bundle's decoder decodes seeded random codes (``CALIBRATION_FRAMES``
frames, streamed in ``CALIBRATION_CHUNK``-frame runs for ``decoder_stream``): the codes reach every codebook entry
a model can emit, and the decoder does not feed back into generation.

HTP w8a16 (``kztts export --target T --decoder w8a16``, :data:`HTP_RECIPE`): the static ``decoder_chunk`` in QDQ with
per-output-channel int8 weights (Conv, ConvTranspose, and MatMul columns) and 16-bit activations, the recipe that kept
speech on the real vocoder (benchmarks/piper_decoder: WER and DNSMOS BAK equal to fp32); its feeds come from
``kztts.export.htp.static_graphs.export_decoder_chunk``'s calibration source. Its LayerNormalizations stay float
(fp16 on the HTP): quantized, the HTP refused them (strict simulator, onnxruntime-qnn 2.7.0: the LayerNormalization
of each ConvNeXt upsampling block, its 16-bit weight and bias DequantizeLinear nodes and the Q/DQ around it fell
back to the CPU).
"""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Iterable

import numpy as np

from kztts.bundle.bundle import Bundle
from kztts.export.common import graph_qdq as Q
from kztts.runners.codec import Decoder, StreamingDecoder, decoder_kwargs

log = logging.getLogger(__name__)

RECIPE = "cpu_int8"
HTP_RECIPE = "w8a16"
FLOAT_OPS = ("LayerNormalization",)  # kept float in a QNN (HTP) recipe's graph: see the module docstring
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


def float_nodes(prepared: str | Path) -> list[str]:
    """The nodes of ``prepared`` an HTP recipe keeps float (``FLOAT_OPS``)."""
    import onnx

    return [n.name for n in onnx.load(str(prepared), load_external_data=False).graph.node if n.op_type in FLOAT_OPS]


def quantize_decoder_graph(src: str | Path, dst: str | Path, feeds: Iterable[dict], recipe: str = RECIPE) -> Path:
    """``src`` (a float decoder graph) as a QDQ graph at ``dst`` by ``recipe`` (``RECIPE``: the CPU's static int8;
    ``HTP_RECIPE``: the HTP's w8a16, its MatMul weights per column and its ``FLOAT_OPS`` float), calibrated on
    ``feeds``."""
    htp = Q.RECIPES[recipe].qnn
    with tempfile.TemporaryDirectory(prefix="kztts-decoder-qdq-") as tmp:
        prepared = Q.prepare(src, Path(tmp) / "prepared.onnx")
        count = Q.graph_ranges(prepared, feeds, Path(tmp) / "ranges.json")
        Q.quantize(prepared, dst, recipe, Path(tmp) / "ranges.json", exclude=float_nodes(prepared) if htp else (),
                   matmul_channels=htp)
    log.info("%s: %s (%s), calibrated on %d calls", Path(src).name, "HTP QDQ" if htp else "static int8", recipe, count)
    return Path(dst)


__all__ = ["CALIBRATION_FRAMES", "FLOAT_OPS", "HTP_RECIPE", "RECIPE", "decoder_feeds", "float_nodes",
           "quantize_decoder_graph"]
