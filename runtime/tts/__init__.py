"""Text in, audio out: the ``TTS`` front door (``tts``), a synthesis request (``request``), the
checkpoint kind and what it takes (``model_kind``), saved voices (``voice_file``), the
prompt (``prompt``) from the text's ids (``text``), the frame loop where every frame is produced
(``frame_loop``; a voice's prompt prefix kept between runs when asked: ``voice_prefix``) with its frame cap from the text's expected duration (``duration``), an utterance in
progress and the result it becomes (``result``), audio streamed while frames are produced, pipelined or
not (``streaming``), a text longer than one context spoken in pieces (``long_text``) cut at its
boundaries (``text_split``) and joined again (``audio_join``), and continuous batching (``batch_loop``).

May import: ``kztts.core``, ``kztts.bundle``, ``kztts.generation``, ``kztts.htp``, ``kztts.runners``,
``kztts.plan``.
"""
