"""Qwen3-TTS checkpoints -> bundles: ``kztts export`` (``bundle_writer``), what its manifest holds of the model
besides the graphs (``tts_parts``), the calibration prompts of its QDQ HTP graphs (``prompt_calibration``),
random-weight checkpoints for tests and demos (``tiny``, ``massive``) and the qwen-tts row of ``kztts bench``
(``bench_reference``).

May import: the kztts runtime below ``kztts.bench``, ``kztts.export.common``, ``.graphs``, ``.htp`` (not ``.lm``).
"""
