"""Helpers the test folders share (importable as ``support``: setup.cfg puts tests/ on the path).

Fixtures live in conftest.py files (the root one for what several folders use); plain functions that
several test files call live here, once."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]  # the repository: README.md, runtime/, export/, benchmarks/


def run_kztts(*args, **kw) -> subprocess.CompletedProcess:
    """``kztts ARGS`` in a child process (``python -m kztts.cli.main``), its output captured as text."""
    return subprocess.run([sys.executable, "-m", "kztts.cli.main", *map(str, args)], capture_output=True, text=True,
                          **kw)


def kztts_main(capsys, *args) -> tuple[int, str, str]:
    """``kztts ARGS`` in this process (``kztts.cli.main.main``): (exit code, stdout, stderr) of this call alone."""
    from kztts.cli.main import main

    capsys.readouterr()
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def cosine(a, b) -> float:
    """The cosine of two arrays taken whole (flattened), as ``kztts.core.metrics.cosine_rows`` computes it for
    one row; per-row cosines are ``cosine_rows`` itself."""
    from kztts.core.metrics import cosine_rows

    return float(cosine_rows(np.ravel(a)[None], np.ravel(b)[None])[0])
