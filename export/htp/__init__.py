"""Graphs for the Qualcomm HTP: static-shape graphs and QNN context binaries (``static_graphs``),
their QDQ quantization at a quantized HTP precision (w8a16, w4a16) calibrated on real prompts (``qdq``), 8-bit
KV I/O (``kv_quant``), the KV type changed after export (``kv_io``) and the weight-outlier test checkpoints
(``outlier``).

May import: the kztts runtime below ``kztts.bench``, ``kztts.export.common``, ``kztts.export.graphs``.
"""
