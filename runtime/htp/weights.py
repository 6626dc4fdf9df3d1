"""MatMul weights at an HTP precision, in numpy: the quantization the exporter writes into the QDQ graphs
(``kztts.export.htp.qdq``) and ``kztts calibrate`` emulates on the CPU to measure each layer's loss, so
both use the very same numbers; and which layer and projection each MatMul of a graph belongs to.

Symmetric, zero offsets (the HTP runs int4 weights with a non-zero offset off by a systematic error,
and refuses per-channel int4 with offsets: measured on the simulator, ``kztts.export.htp.qdq``):

- 8 bits per output column, as ONNX Runtime's quantizer writes them (scale max|w| / 127, codes -127..127);
- 4 bits per output column: scale max|w| / 7, codes -7..7 (-8 unused: the largest weight is not clipped);
- 4 bits LPBQ (``HtpPrecision.granularity`` "block"): each block of ``block_size`` rows of a column gets
  scale ``s_col * i`` with a float ``s_col`` per column and an integer ``i`` in 1..15 (4 bits) per block,
  ``i = ceil(block max / 7 / s_col)`` with ``s_col = column's largest block max / 7 / 15``: a block of small
  weights keeps its own finer grid instead of the column's.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from kztts.bundle.graphs import HtpPrecision

SQNR_CAP_DB = 150.0  # an exact match: reported as this (JSON has no infinity)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
HEAD = "head"
_HEAD_SCOPES = ("codec_head", "lm_head", "heads.")


@dataclass(frozen=True)
class QuantizedWeight:
    """A [K, N] weight as codes and scales: ``codes`` int8 (4-bit values when ``bits`` is 4), ``scale`` [N]
    float32 per column, ``block_scale`` [K / block, N] uint8 (LPBQ) or None."""

    codes: np.ndarray
    scale: np.ndarray
    bits: int
    block: int = 0
    block_scale: np.ndarray | None = None

    def dequantize(self) -> np.ndarray:
        s = self.scale[None, :].astype(np.float32)
        if self.block_scale is not None:
            s = np.repeat(self.block_scale.astype(np.float32) * s, self.block, axis=0)
        return (self.codes.astype(np.float32) * s).astype(np.float32)


def quantize_weight(w: np.ndarray, precision: HtpPrecision) -> QuantizedWeight:
    """``w`` [K, N] (float32) at ``precision``'s weight bits and granularity (module docstring)."""
    w = np.asarray(w, np.float32)
    if w.ndim != 2:
        raise ValueError(f"a MatMul weight is [K, N], got shape {w.shape}")
    bits = precision.weight_bits
    if bits not in (4, 8):
        raise ValueError(f"{precision.name}: no integer weights ({bits} bits)")
    k, _ = w.shape
    if bits == 4 and precision.blocked(k):
        return _lpbq(w, precision.block_size, precision.block_scale_bits)
    qmax = 127 if bits == 8 else 7
    absmax = np.abs(w).max(axis=0).astype(np.float64)
    scale = np.where(absmax > 0, absmax / qmax, 1.0).astype(np.float32)
    lo = -qmax if bits == 8 else -8
    codes = np.clip(np.rint(w / scale[None, :]), lo, qmax).astype(np.int8)
    return QuantizedWeight(codes, scale, bits)


def _lpbq(w: np.ndarray, block: int, scale_bits: int) -> QuantizedWeight:
    k, n = w.shape
    imax = 2 ** scale_bits - 1
    blockmax = np.abs(w.reshape(k // block, block, n)).max(axis=1).astype(np.float64)  # [B, N]
    f = blockmax / 7.0
    col = f.max(axis=0) / imax
    col = np.where(col > 0, col, 1.0)
    iscale = np.clip(np.ceil(f / col[None, :] - 1e-9), 1, imax).astype(np.uint8)
    col32 = col.astype(np.float32)
    step = np.repeat(iscale.astype(np.float32) * col32[None, :], block, axis=0)
    codes = np.clip(np.rint(w / step), -8, 7).astype(np.int8)
    return QuantizedWeight(codes, col32, 4, block, iscale)


def fake_quantize(w: np.ndarray, precision: HtpPrecision) -> np.ndarray:
    """``w`` quantized at ``precision`` and back to float32 (what the QDQ graph's DequantizeLinear yields)."""
    return quantize_weight(w, precision).dequantize()


def sqnr_db(reference: np.ndarray, test: np.ndarray) -> float:
    """10 log10(sum reference^2 / sum (test - reference)^2), capped at ``SQNR_CAP_DB``."""
    ref = np.asarray(reference, np.float64)
    noise = float(((np.asarray(test, np.float64) - ref) ** 2).sum())
    signal = float((ref ** 2).sum())
    if noise <= signal * 10 ** (-SQNR_CAP_DB / 10):
        return SQNR_CAP_DB
    return 10.0 * np.log10(signal / noise) if signal > 0 else -SQNR_CAP_DB


def projection(node_name: str) -> str | None:
    """The projection a MatMul node belongs to, from its export scope name (``/stack/mlp/down_proj_3/MatMul``
    -> ``down_proj``; a head -> ``head``), or None."""
    if any(s in node_name for s in _HEAD_SCOPES):
        return HEAD
    for p in PROJECTIONS:
        if re.search(rf"/{p}(_\d+)?/", node_name):
            return p
    return None


def matmul_keys(nodes, constants, first_layer: int = 0) -> dict[str, str]:
    """{MatMul node name: key} for the MatMuls of a Talker-shaped graph whose weight is a constant: key
    ``"{layer}.{projection}"`` (``"3.down_proj"``) or ``"head"``. ``nodes``: objects with ``name``, ``op``
    and ``inputs`` (``kztts.bundle.onnx_wire`` nodes, or adapted ONNX nodes); ``constants``: the names of
    the graph's constant tensors. Layers are numbered by each projection's distinct weights in order of
    use, from ``first_layer`` (a layer graph: its own index). A weight used several times (the Code
    Predictor's unrolled steps) keeps one key."""
    alias = {n.outputs[0]: n.inputs[0] for n in nodes if n.op == "Identity" and n.inputs and n.outputs}
    seen: dict[str, dict[str, int]] = {}
    out: dict[str, str] = {}
    for n in nodes:
        if n.op != "MatMul" or len(n.inputs) < 2:
            continue
        w = n.inputs[1]
        while w in alias:
            w = alias[w]
        proj = projection(n.name)
        if w not in constants or proj is None:
            continue
        if proj == HEAD:
            out[n.name] = HEAD
            continue
        index = seen.setdefault(proj, {})
        layer = index.setdefault(w, len(index))
        out[n.name] = f"{first_layer + layer}.{proj}"
    return out


def matmul_weights(nodes, constants, first_layer: int = 0) -> dict[str, str]:
    """{weight constant name: key} (``matmul_keys`` by weight rather than by node)."""
    alias = {n.outputs[0]: n.inputs[0] for n in nodes if n.op == "Identity" and n.inputs and n.outputs}
    keys = matmul_keys(nodes, constants, first_layer)
    out = {}
    for n in nodes:
        if n.name in keys:
            w = n.inputs[1]
            while w in alias:
                w = alias[w]
            out[w] = keys[n.name]
    return out


def key_layer(key: str) -> int | None:
    """The layer of a MatMul key (None for the head)."""
    return None if key == HEAD else int(key.split(".", 1)[0])
