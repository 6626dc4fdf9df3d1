"""Text in, audio out: the ``TTS`` front door (``tts``), a synthesis request (``request``) checked once and its
text tokenized once into the pieces it is spoken in (``prepared``), each piece an utterance on its way to audio
(``utterance``), which every way of speaking drives; the checkpoint kind and what it takes (``model_kind``),
saved voices (``voice_file``), the prompt (``prompt``) from the text's ids (``kztts.tts.text``), or from a text
still being written, read one token per frame (``kztts.tts.text.track``); the frame loop where every frame is produced
(``frame_loop``; a voice's prompt prefix kept between runs when asked: ``voice_prefix``) with its frame cap
from the text's expected duration (``duration``), the result an utterance becomes (``result``), audio streamed
while frames are produced, pipelined or not (``streaming``), a text longer than one context spoken in pieces
(``long_text``) cut at its boundaries (``kztts.tts.text.split``) and joined again (``audio_join``), and
continuous batching (``batch_loop``).

May import: ``kztts.core``, ``kztts.bundle``, ``kztts.generation``, ``kztts.htp``, ``kztts.runners``,
``kztts.plan``.
"""
