"""What every exporter shares: importing the official qwen-tts package (``qwen_import``), reading a
Qwen3-TTS checkpoint (``checkpoint``) and running it as the reference (``reference``), torch -> ONNX
(``onnx_export``), the Qwen3 decoder stack with explicit KV I/O (``qwen3_stack``), what a written graph file
carries (``graph_parts``), writing a bundle's embedding tables (``embeddings``) and tokenizer (``tokenizer``),
the rebuilt Qwen text tokenizer of the tiny models (``offline_tokenizer``); and around a bundle: its output
folder checked, locked and staged (``bundle_output``), its exporter's code key (``export_key``) and its
precision variants (``variants``), TTS or LM alike; quantizing any float graph by a named recipe (``graph_qdq``),
the Qwen3 speech decoder's static int8 variant (``decoder_qdq``) and the MinMax ranges both calibrate
(``qdq_ranges``).

May import: the kztts runtime below ``kztts.bench``, and ``kztts.export.common``.
"""
