"""kztts.core.env: the KZTTS_* variables read in one place, booleans in their documented spellings, thread
counts within the documented bound (the command line's refusals of bad values: tests/cli/test_bad_input.py)."""
from __future__ import annotations

import os
import re

import pytest

from kztts.core import env
from kztts.core.errors import KzttsError

from support import ROOT


def test_boolean_variables_accept_the_documented_spellings(monkeypatch):
    for raw, want in [("1", True), ("TRUE", True), ("yes", True), ("On", True), ("0", False), ("false", False),
                      ("NO", False), ("off", False), ("", False)]:
        monkeypatch.setenv("KZTTS_DISABLE_QNN", raw)
        assert env.flag("KZTTS_DISABLE_QNN") is want, raw
    monkeypatch.setenv("KZTTS_DISABLE_QNN", "maybe")
    with pytest.raises(KzttsError, match=r"KZTTS_DISABLE_QNN='maybe' is not valid: use one of 1/true/yes/on"):
        env.flag("KZTTS_DISABLE_QNN")


def test_thread_bound_is_the_documented_one(monkeypatch):
    top = env.max_threads()
    assert top == max(64, 4 * (os.cpu_count() or 1))
    monkeypatch.setenv("KZTTS_THREADS", str(top))
    assert env.threads("KZTTS_THREADS") == top
    monkeypatch.setenv("KZTTS_THREADS", str(top + 1))
    with pytest.raises(KzttsError, match=f"KZTTS_THREADS={top + 1}: thread count out of range; give 0..{top}"):
        env.threads("KZTTS_THREADS")


def test_every_kztts_variable_is_read_through_kztts_env():
    """No module reads a KZTTS_* variable itself (the sampling overrides go through kztts.generation.settings)."""
    pattern = re.compile(r"""(os\.environ(\.get)?\s*[\[(]|os\.getenv\()\s*["']KZTTS_""")
    offenders = [str(p.relative_to(ROOT)) for folder in ("runtime", "export") for p in (ROOT / folder).rglob("*.py")
                 if p.name != "env.py" and pattern.search(p.read_text())]
    assert offenders == []
