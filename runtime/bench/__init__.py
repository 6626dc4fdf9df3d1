"""``kztts bench``: configurations timed and checked against the fp32 bundle and qwen-tts.

``run`` orchestrates a run (bundles, baseline, rows, report); ``grid`` names the configurations;
``worker``, ``batch_worker``, ``htp_worker`` and ``e2e_worker`` each run one row in its own process;
``report``, ``limits`` and ``bandwidth`` write and annotate the table; ``quality_rows`` samples speech;
``batch_rows`` adds the batched rows (``--batch``), ``e2e`` the end-to-end row (text to WAV file), ``htp``
the HTP rows' parent side (static context, target, host process); ``ray_units`` runs a sweep's units as
Ray tasks (``--ray``); ``lm`` holds the causal-LM rows. The PyTorch reference row is ``kztts.export.tts.bench_reference``.

May import: every runtime layer and ``kztts.export`` (inside functions: torch is an optional extra);
never ``kztts.cli``.
"""
