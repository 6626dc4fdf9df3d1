"""Text in, audio out: the ``TTS`` front door (``tts``), a synthesis request (``request``), the
prompt (``prompt``) from the text's ids (``text``), long text cut into pieces (``text_split``) and
joined again (``audio_join``), the frame loop where every frame is produced (``frame_loop``) and
continuous batching (``batch_loop``).

May import: ``kztts.core``, ``kztts.bundle``, ``kztts.generation``, ``kztts.htp``, ``kztts.runners``,
``kztts.plan``.
"""
