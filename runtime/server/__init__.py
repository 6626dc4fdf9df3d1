"""``kztts serve``: an OpenAI-compatible speech and chat server over one scheduler that owns the graphs.

May import: the runtime layers below it (``core`` .. ``tts``, ``lm``); never ``kztts.eval``,
``kztts.export``, ``kztts.bench`` or ``kztts.cli``.
"""
