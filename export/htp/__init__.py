"""Graphs for the Qualcomm HTP: static-shape graphs and QNN context binaries (``static_graphs``),
their QDQ quantization at a quantized HTP precision (w8a16, w4a16: ``qdq``) calibrated on the data of a
calibration source the exporter passes in (``calibration``: TTS prompts or LM texts), 8-bit KV I/O
(``kv_quant``), the KV type changed after export (``kv_io``) and the weight-outlier test checkpoints
(``outlier``); per-node precision analysis of any ONNX graph (``graph_analysis``).

May import: the kztts runtime below ``kztts.bench``, ``kztts.export.common``, ``kztts.export.graphs``.
"""
