"""The text of a TTS request, below the speaking: its tokens as qwen-tts makes them (``tokenizer``: the bundle's
tokenizer and qwen-tts's templates), a long text cut into the pieces that each fit one Talker context, whole or
as it is written (``split``), and a text still being written, committed a token at a time and read by the
streaming text mode one row per frame (``track``).

May import: ``kztts.core``, ``kztts.bundle``.
"""
