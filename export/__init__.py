"""kztts.export: Qwen3-TTS checkpoint -> kztts bundle (needs torch, transformers, qwen-tts).

``common`` holds what the TTS and LM exports share (checkpoint loading, the ONNX export call, bundle
folders, CPU weight variants); ``graphs`` the graph definitions; ``htp`` the static HTP forms and their
quantization; ``tts`` and ``lm`` the two exports (and their tiny test checkpoints); ``validate`` checks a
bundle against its reference implementation.
"""
