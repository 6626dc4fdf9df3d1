"""Qwen3-TTS checkpoints -> bundles: ``kztts export`` (``bundle_writer``), what its manifest holds of the model
besides the graphs (``tts_parts``), the calibration prompts of its QDQ HTP graphs (``prompt_calibration``),
random-weight checkpoints for tests and demos (``tiny``: built once in the cache by ``tiny_build``, from the
sizes' configs, ``tiny_configs``, random weights, ``tiny_weights``, EOS wiring, ``tiny_eos``, massive activation,
``massive``, and files, ``tiny_files``) and the qwen-tts row of ``kztts bench`` (``bench_reference``).

May import: the kztts runtime below ``kztts.bench``, ``kztts.export.common``, ``.graphs``, ``.htp`` (not ``.lm``).
"""
