"""Qwen2/Qwen3 causal LMs -> LM bundles: loading a Hugging Face directory or GGUF (``checkpoint``, ``gguf_meta``,
``family``), the bundle (``bundle_writer``), the text calibration of its QDQ HTP graphs (``text_calibration``),
per-layer magnitudes (``magnitudes``) and tiny random LMs (``tiny``, and the Qwen2 one as a GGUF file,
``tiny_gguf``); hybrid Qwen3-Next / Qwen3.5 LMs (``hybrid``, which ``bundle_writer`` hands them to, and their tiny
random models, ``hybrid_tiny``); what every LM bundle's manifest holds besides its graphs (``lm_parts``).

May import: the kztts runtime below ``kztts.bench``, ``kztts.export.common``, ``.graphs``, ``.htp`` (not ``.tts``:
the TTS and the LM exports are siblings over the shared parts).
"""
