"""``kztts bench``: a grid of configurations timed and checked against the fp32 bundle and qwen-tts.

- ``grid``: the configurations and their names;
- ``worker``: one configuration in its own process (numpy + ONNX Runtime only): timing pass,
  peak RSS, then teacher-forced accuracy against the fp32 baseline;
- ``metrics``: cosine, code agreement, SNR, medians;
- ``report``: JSON, CSV, Markdown table and the Pareto plot.
The command itself is ``kztts.cli_bench``; the PyTorch reference row is
``kztts.export.bench_reference`` (needs the export extra).
"""
