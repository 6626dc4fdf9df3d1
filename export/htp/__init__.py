"""Graphs for the Qualcomm HTP: static-shape graphs and QNN context binaries (``static_graphs``),
their w8a16 quantization calibrated on real prompts (``w8a16``), 8-bit KV I/O (``kv_quant``) and the
KV type changed after export (``kv_io``).

May import: the kztts runtime below ``kztts.bench``, ``kztts.export.common``, ``kztts.export.graphs``.
"""
