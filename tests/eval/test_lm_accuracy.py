"""LM accuracy rows (``kztts.eval.lm_accuracy``) on the tiny random Qwen3 LM of tests/lm/test_lm.py (the same cached
bundle): the measures on known values, the rows of a CPU variant against fp32, and the reports' portable commands
(the bench's LM rows: tests/bench/test_lm.py; ``kztts validate`` on LM bundles: tests/export/validate/test_lm.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from kztts.eval.lm_accuracy import SAMPLES, RowSpec, common_prefix, markdown_table, perplexity, run_rows


def test_metrics_on_known_values():
    vocab = 10
    assert perplexity(np.zeros((3, vocab)), [1, 2, 3]) == pytest.approx(vocab)  # uniform: ppl = vocab
    sure = np.full((2, vocab), -30.0)
    sure[0, 4] = sure[1, 7] = 30.0
    assert perplexity(sure, [4, 7]) == pytest.approx(1.0)
    assert perplexity(sure, [7, 4]) > 1e20
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2 and common_prefix([5], [6]) == 0
    assert {s.name for s in SAMPLES} == {"code", "english", "french", "chinese"}
    assert all(s.text.startswith(s.prompt) and len(s.text) > len(s.prompt) for s in SAMPLES)


def test_commands_in_reports_carry_no_machine_path(tmp_path):
    """A report's command line names paths portably wherever they stand: alone, after ``--flag=`` and after
    ``NAME=`` (``--quantized-bundle w4a16=/path``)."""
    from kztts.core.cache import portable_command

    b = tmp_path / "B4"
    line = portable_command(f"python x.py --bundle {b} --quantized-bundle w4a16={b} --out={b} --texts code,english")
    assert str(tmp_path) not in line and line == "python x.py --bundle B4 --quantized-bundle w4a16=B4 --out=B4 " \
                                                 "--texts code,english"


def test_rows_cpu_variant(qwen3_bundle, tmp_path):
    """The reference row agrees with itself exactly; int4 (random weights) drifts and the rows say so.
    The fp32 row saved to a file is reused by a second run (same rows), not by a run with other settings."""
    from kztts.core.cache import portable_path
    from kztts.export.common.variants import cached_variant

    specs = [RowSpec("cpu fp32", qwen3_bundle),
             RowSpec("cpu int4", cached_variant(qwen3_bundle, weights="int4"), weights="int4")]
    saved = tmp_path / "ref.npz"
    rows = run_rows(specs, threads=1, context=64, reference_file=saved)
    again = run_rows(specs, threads=1, context=64, reference_file=saved)
    assert "reused" not in rows[0] and again[0]["reused"] == portable_path(saved)  # no machine folder in reports
    assert {k: v for k, v in again[0].items() if k != "reused"} == rows[0]
    assert again[1]["logits_cos_mean"] == rows[1]["logits_cos_mean"] and again[1]["ppl"] == rows[1]["ppl"]
    assert "reused" not in run_rows(specs[:1], threads=1, context=64, steps=8, reference_file=saved)[0]
    ref, int4 = rows
    assert all(0 < n <= 64 for n in ref["positions"].values())
    assert ref["logits_cos_min"] == pytest.approx(1.0) and ref["top1_agree"] == 1.0
    assert ref["greedy_equal"] == 4 and ref["greedy_prefix_mean"] == 1.0 and ref["ms_per_token"] > 0
    assert math.isfinite(ref["ppl"]) and ref["ppl"] > 1 and set(ref["ppl_per_sample"]) == {s.name for s in SAMPLES}
    assert 0.5 < int4["logits_cos_mean"] < 0.9999 and int4["top1_agree"] < 1.0 and int4["ppl"] != ref["ppl"]
    assert int4["greedy_equal"] < 4 and int4["ms_per_token"] > 0 and int4["tokens"] == ref["tokens"]
    table = markdown_table(rows).splitlines()
    assert len(table) == 4 and table[2].startswith("| cpu fp32 | cpu | 1.000000 |")
    with pytest.raises(ValueError, match="first row"):
        run_rows(specs[1:])


