"""``kztts bench``: configurations timed and checked against the fp32 bundle and qwen-tts.

``run`` orchestrates a run (bundles, baseline, rows, report); ``grid`` names the configurations;
``worker``, ``batch_worker``, ``htp_worker`` and ``e2e_worker`` each run one row in its own process;
``report``, ``limits`` and ``bandwidth`` write and annotate the table; ``quality_rows`` samples speech;
``lm`` holds the causal-LM rows. The PyTorch reference row is ``kztts.export.tts.bench_reference``.

May import: every runtime layer and ``kztts.export`` (inside functions: torch is an optional extra);
never ``kztts.cli``.
"""
