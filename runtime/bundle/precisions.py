"""The one table of precisions every route reads: a bundle's static HTP graphs (``kztts export --target``), the
speech decoder's ``--decoder``, one graph's per-node plan (``kztts calibrate GRAPH.onnx``) and its QDQ recipes
(``kztts.export.common.graph_qdq``), the real-vocoder study. Each entry says its weight and activation bits,
whether it is quantized, the ``kztts.eval.acceptance.BOUNDS`` keys that judge it, the ONNX Runtime quantizer
types of its graph recipe, and where it may be used, so code asks an entry (``precision("a8w8").activation_bits``)
instead of branching on its name.

``MEASURED_BROKEN``: recipes a QNN version was measured to compute wrong (the HTP's result far from the CPU EP's
run of the same QDQ graph). The plan tool never assigns them on that version.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    """One precision (module docstring).

    ``quantized``: a QDQ graph (MinMax ranges calibrated on real data), else a float graph the HTP computes in fp16.
    MatMul weights: ``weight_bits`` per element (16: fp16), scales per output column (``granularity`` "channel"),
    or LPBQ (``"block"``: one integer scale of ``block_scale_bits`` per ``block_size`` rows of K, times a float
    scale per output column; a weight whose K the block does not divide into two or more blocks gets per-column
    scales). ``other_float_bytes``: any other float constant of the graph on the device (norm weights, tables,
    biases). ``kv_dtypes``: the static Talker's KV I/O types, first the default (target key ``kv_dtype``).
    ``bounds`` / ``lm_bounds``: the ``kztts.eval.acceptance.BOUNDS`` tables of ``validate --target`` on a TTS / an
    LM bundle; ``decoder_bounds``: that of the speech decoder's static graph (``decoder_chunk``) at this
    precision, empty when the decoder is not exported at it. ``qdq_activation`` / ``qdq_weight``: the
    ``onnxruntime.quantization.QuantType`` names of its one-graph QDQ recipe (empty: no such recipe).
    ``bundle``: a bundle's static HTP graphs take it (``HTP_PRECISIONS``); ``plan``: a one-graph plan may give
    it to a node."""

    name: str
    help: str
    kv_dtypes: tuple[str, ...] = ()
    weight_bits: int = 16
    quantized: bool = False
    other_float_bytes: float = 2.0
    bounds: str = ""
    lm_bounds: str = ""
    colour: str = "tab:gray"
    granularity: str = "channel"
    block_size: int = 0
    block_scale_bits: int = 0
    decoder_bounds: str = ""
    activation_bits: int = 16
    qdq_activation: str = ""
    qdq_weight: str = ""
    bundle: bool = False
    plan: bool = False

    @property
    def recipe(self) -> bool:
        """Whether one graph can be quantized by this precision (``graph_qdq.RECIPES``)."""
        return bool(self.qdq_weight)

    def blocked(self, k: int) -> bool:
        """Whether a MatMul weight with ``k`` input rows gets LPBQ block scales (two or more whole blocks)."""
        return self.granularity == "block" and self.block_size > 0 and k % self.block_size == 0 \
            and k >= 2 * self.block_size

    def matmul_weight_bytes(self, k: int, n: int) -> float:
        """Bytes a [k, n] MatMul weight holds on the device, its scales included (fp32 per column; LPBQ
        also ``block_scale_bits`` per block)."""
        if not self.quantized:
            return k * n * self.weight_bits / 8
        scales = n * 4 + (k // self.block_size * n * self.block_scale_bits / 8 if self.blocked(k) else 0)
        return k * n * self.weight_bits / 8 + scales


# Most precise first within each use (HTP_PRECISIONS' order is the bundle's; a plan's cheapest is its last).
PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    Precision("fp16", "float graphs, fp16 arithmetic on the HTP", ("fp16", "fp32"), 16, False, 2.0,
              "htp-fp16", "lm-placement", "tab:purple", granularity="tensor", decoder_bounds="htp-decoder",
              bundle=True, plan=True),
    Precision("a16w16", "QDQ: 16-bit weights per output channel, 16-bit activations", weight_bits=16,
              quantized=True, colour="tab:cyan", qdq_activation="QUInt16", qdq_weight="QInt16"),
    # QDQ graphs: fp32 KV I/O, or uint8 with one fixed symmetric scale per layer and kind shared by the past
    # input and the new output (as Qualcomm's LLM exports tie their KV quantizers)
    Precision("w8a16", "QDQ: 8-bit weights per output channel, 16-bit activations, calibrated on real prompts",
              ("fp32", "uint8"), 8, True, 1.0, "htp-w8a16", "lm-w8a16", "tab:red",
              decoder_bounds="htp-decoder-w8a16", qdq_activation="QUInt16", qdq_weight="QInt8", bundle=True,
              plan=True),
    Precision("a8w8", "QDQ: 8-bit weights per output channel, 8-bit activations", weight_bits=8, quantized=True,
              colour="tab:green", activation_bits=8, qdq_activation="QUInt8", qdq_weight="QInt8", plan=True),
    # LPBQ blocks of 64 (Qualcomm AI Hub's w4a16 LLM exports use block quantization; QNN HTP takes it for
    # MatMul from v73 on, measured on the simulator: kztts.export.htp.qdq)
    Precision("w4a16", "QDQ: 4-bit weights (LPBQ: blocks of 64 with 4-bit scales, else per output channel), "
              "16-bit activations, calibrated on real prompts", ("fp32", "uint8"), 4, True, 1.0, "htp-w4a16",
              "lm-w4a16", "tab:brown", granularity="block", block_size=64, block_scale_bits=4, bundle=True),
)}
CPU = "cpu"  # a plan's node (or a placement's unit) kept on the CPU in fp32


def precision(name: str) -> Precision:
    """The entry of ``name``; ValueError naming the known ones."""
    try:
        return PRECISIONS[name]
    except KeyError:
        raise ValueError(f"unknown precision {name!r} (known: {', '.join(PRECISIONS)})") from None


BUNDLE_PRECISIONS = tuple(n for n, p in PRECISIONS.items() if p.bundle)  # most precise first
GRAPH_RECIPES = tuple(n for n, p in PRECISIONS.items() if p.recipe)  # one graph's whole-graph QDQ recipes
PLAN_PRECISIONS = tuple(n for n, p in PRECISIONS.items() if p.plan)  # a plan node's, besides CPU
PLAN_QUANTIZED = tuple(n for n in PLAN_PRECISIONS if PRECISIONS[n].quantized)  # most precise first
PLAN_FLOAT = next(n for n in PLAN_PRECISIONS if not PRECISIONS[n].quantized)  # a plan node left float (fp16)


@dataclass(frozen=True)
class MeasuredBroken:
    """A precision one onnxruntime-qnn version computes wrong on the HTP, as measured (``evidence``)."""

    precision: str
    qnn_version: str  # onnxruntime-qnn's version
    where: str  # in which graphs it was seen
    evidence: str


MEASURED_BROKEN: tuple[MeasuredBroken, ...] = (
    MeasuredBroken("a8w8", "2.7.0", "8-bit activation tensors on the HTP (whole-graph or a mixed per-node plan)",
                   "benchmarks/piper_decoder: the Piper decoder at whole-graph a8w8 on the simulated HTP is 13.6 dB "
                   "from the CPU EP's run of the same graph, WER 31.2% (fp32 18.8%); the plan with one a8w8 node "
                   "(19 w8a16, rest fp16): -0.4 dB"),
    MeasuredBroken("w8a16", "2.7.0", "16-bit QDQ nodes between float (fp16) nodes: a mixed per-node plan; whole "
                   "graphs at w8a16 are computed right (55.4 dB from the CPU EP)",
                   "benchmarks/piper_decoder: the Piper decoder's plan with no a8w8 (20 w8a16 convolutions, 3 fp16, "
                   "the rest float) on the simulated HTP: 0.6 dB against fp32 where the CPU EP's run of the same "
                   "graph gives 32.2 dB; the first node under the goal resblocks.2.convs.1 (1.1 dB, 38.2 dB at the "
                   "LeakyRelu before it)"),
)


def broken_on(qnn_version: str | None) -> dict[str, MeasuredBroken]:
    """{precision: why} of the precisions measured broken on ``qnn_version``; None (no QNN package to ask):
    those measured broken on any version, since the version that will run the plan is unknown."""
    return {b.precision: b for b in MEASURED_BROKEN if qnn_version is None or b.qnn_version == qnn_version}


__all__ = ["BUNDLE_PRECISIONS", "CPU", "GRAPH_RECIPES", "MEASURED_BROKEN", "MeasuredBroken", "PLAN_FLOAT",
           "PLAN_PRECISIONS", "PLAN_QUANTIZED", "PRECISIONS", "Precision", "broken_on", "precision"]
