"""``kztts validate``: a TTS bundle against qwen-tts (``tts``), its HTP graphs (``htp``), speech decoder
(``decoder``), layer placements (``placement``) and ASR round trip (``asr``), and an LM bundle against
transformers (``lm``).

May import: the kztts runtime below ``kztts.bench``, and every other folder of ``kztts.export``.
"""
