"""Helpers the test folders share (importable as ``support``: setup.cfg puts tests/ on the path).

Fixtures live in conftest.py files (the root one for what several folders use); plain functions that
several test files call live here, once."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository: README.md, runtime/, export/, benchmarks/
