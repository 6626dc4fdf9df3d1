"""``kztts serve``: an OpenAI-compatible speech and chat server over one scheduler that owns the graphs.

``command`` (the CLI command: ``kztts.cli`` holds the most modules a folder may) -> ``run`` (uvicorn, the
drain on SIGTERM) -> ``app`` (Starlette routes, errors, access log; the WebSocket of speech from text as it is
written: ``speech_stream``) over a ``service`` (the opened TTS or
LM, its ``scheduler`` thread and engine: ``speech`` or ``chat``, batched or one at a time, or ``spoken_chat``
over both for an LM whose replies a TTS speaks), with
``bodies`` (request checks), ``voices``, ``audio_out``, ``metrics`` and ``errors``. docs/SERVE.md.

``app`` also serves the try-it page (``page/index.html``). May import: the runtime layers below it (``core`` ..
``tts``, ``lm``, ``assistant``); never ``kztts.eval``,
``kztts.export``, ``kztts.bench`` or ``kztts.cli``.
"""
