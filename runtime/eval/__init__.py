"""Measuring what was built: teacher forcing (``replay``), the acceptance bounds of ``kztts validate``
(``acceptance``), ``kztts calibrate`` (``calibrate``) with each layer's quantization loss (``sqnr``),
sampled-speech measures (``quality``, ``dnsmos``), the ASR round trip (``asr``: Whisper's transcript
and WER/CER; ``asr_text`` its normalisation, ``asr_models`` the model wheels) and the accuracy of an
LM's precisions and placements (``lm_accuracy``); the time to first audio over a set of texts (``ttfa``); the
Piper voice fetched as a real-weight judge (``piper_voice``).

May import: every runtime layer below it (``core`` .. ``tts``, ``lm``); never ``kztts.export``,
``kztts.bench`` or ``kztts.cli``.
"""
