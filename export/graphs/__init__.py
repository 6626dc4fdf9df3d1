"""The graph definitions: each wrapper module that becomes one ONNX graph kind, with its exporter: the
Talker (``talker_graph``), Code Predictor (``code_predictor_graph``), codec (``codec_graphs``), speaker
encoder (``speaker_graph``), fused-attention CPU graphs (``gqa_graphs``), static HTP layers
(``static_layers``) and per-layer segments (``segment_graphs``); a hybrid LM's stack, ``hybrid_stack``, and
its graphs, ``hybrid_graphs``; and the fused CPU forms of the traced graphs (``cpu_fusion``).

May import: the kztts runtime below ``kztts.bench``, ``kztts.export.common``.
"""
