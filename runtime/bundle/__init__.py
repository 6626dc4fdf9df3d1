"""A bundle on disk: the graph registry (``graphs``: every graph kind, its role, I/O and KV names), the one
table of precisions every route reads (``precisions``: bits, bounds keys, QDQ recipes, the recipes a QNN version
is measured to compute wrong),
the manifest (``manifest``), the bundle itself (``bundle``), ONNX Runtime sessions (``sessions``),
the embedding tables (``embeddings``), their compact form (``table_compact``) and the tables stored as views
into the graphs' shared weights file (``table_views``), constant tensors read from an ONNX file's wire format
(``onnx_wire``; it also points a graph's external data elsewhere) and the names of the per-layer Talker graphs (``segments``).

May import: ``kztts.core``.
"""
