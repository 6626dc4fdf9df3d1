"""Every choice of an export decided once, before any work (``export_plan``: the target parsed, the HTP and
CPU precisions resolved; every exporter reads it). Graphs for the Qualcomm HTP: static-shape graphs and QNN context binaries (``static_graphs``),
their QDQ quantization at a quantized HTP precision (w8a16, w4a16: ``qdq``) calibrated on the data of a
calibration source the exporter passes in (``calibration``: TTS prompts or LM texts), 8-bit KV I/O
(``kv_quant``), the KV type changed after export (``kv_io``) and the weight-outlier test checkpoints
(``outlier``); per-node precision analysis of any ONNX graph (``graph_analysis``); a ConvTranspose written so the
HTP computes it right (``tconv_rewrite``); what a quantized export's HTP check covers and the manifest's record of it
(``export_check``; the judging is ``kztts.export.validate.htp_check``).

May import: the kztts runtime below ``kztts.bench``, ``kztts.export.common``, ``kztts.export.graphs``.
"""
