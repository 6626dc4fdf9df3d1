"""The graph definitions: each wrapper module that becomes one ONNX graph kind, with its exporter (Talker,
Code Predictor, codec, speaker encoder, fused-attention CPU graphs, static HTP layers and per-layer segments; a
hybrid LM's stack, ``hybrid_stack``, and its graphs, ``hybrid_graphs``), and the fused CPU forms of the traced
graphs (``cpu_fusion``).

May import: the kztts runtime below ``kztts.bench``, ``kztts.export.common``.
"""
