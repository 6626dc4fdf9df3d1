"""``kztts serve``: an OpenAI-compatible speech and chat server over one scheduler that owns the graphs.

``command`` (the CLI command: ``kztts.cli`` holds the most modules a folder may) -> ``run`` (uvicorn, the
drain on SIGTERM) -> ``app`` (Starlette routes, errors, access log) over a ``service`` (the opened TTS or
LM, its ``scheduler`` thread and engine: ``speech`` or ``chat``, batched or one at a time), with
``bodies`` (request checks), ``voices``, ``audio_out``, ``metrics`` and ``errors``. docs/SERVE.md.

May import: the runtime layers below it (``core`` .. ``tts``, ``lm``); never ``kztts.eval``,
``kztts.export``, ``kztts.bench`` or ``kztts.cli``.
"""
