"""``kztts validate``: a TTS bundle against qwen-tts (``tts``), its HTP graphs (``htp``), speech decoder
(``decoder``), layer placements (``placement``) and ASR round trip (``asr``), and an LM bundle against
transformers (``lm``); any float graph under a precision plan on a QNN target (``graph_plan``) and a real
vocoder's decoder under each recipe (``vocoder``); and the brief judging of a quantized export's HTP graphs
(``htp_check``), which ``kztts export`` hands the bundle writer.

May import: the kztts runtime below ``kztts.bench``, and every other folder of ``kztts.export``.
"""
