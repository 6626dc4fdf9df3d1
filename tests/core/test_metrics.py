"""kztts.core.metrics: the accuracy measures every bench row, validation and test reads (cosine of rows, SNR,
code agreement, the accuracy columns against a baseline), the timing summaries and the busy flag."""
from __future__ import annotations

import numpy as np
import pytest

from kztts.core.metrics import (
    accuracy,
    agreement,
    as_list,
    cosine_rows,
    is_busy,
    median_ms,
    peak_rss_mb,
    snr_db,
)


def test_agreement_and_snr_db():
    a = np.arange(32).reshape(2, 16)
    b = a.copy()
    b[1, 3] += 1
    assert agreement(a, a) == 1.0 and agreement(b, a) == 31 / 32 and agreement(a[:1], a) == 0.5
    x = np.sin(np.arange(1000.0))
    assert snr_db(x, x) == float("inf")
    assert abs(snr_db(x * 1.01, x) - 40.0) < 1e-6


def test_cosine_rows_is_per_row_in_float64():
    a = np.array([[1.0, 0.0], [1.0, 1.0], [3.0, 4.0]], np.float32)
    b = np.array([[0.0, 1.0], [-1.0, -1.0], [6.0, 8.0]], np.float32)
    c = cosine_rows(a, b)
    assert c.dtype == np.float64 and c.tolist() == pytest.approx([0.0, -1.0, 1.0])
    assert cosine_rows(a.reshape(3, 1, 2), b.reshape(3, 1, 2)).shape == (3,)  # rows over every leading axis
    assert cosine_rows(np.zeros((1, 4)), np.ones((1, 4)))[0] == 0.0  # a zero row: 0, not NaN


def test_the_accuracy_columns_against_a_baseline():
    rng = np.random.default_rng(0)
    base = {"codes": rng.integers(0, 2048, (6, 16)), "talker_logits": rng.standard_normal((6, 32)),
            "cp_logits": rng.standard_normal((6, 15, 32)), "wav": rng.standard_normal(1920 * 6)}
    same = accuracy(base["codes"], base["talker_logits"], base["cp_logits"], base["wav"], base["wav"][:-10], base)
    assert same["code_agreement"] == 1.0 and same["talker_cos_min"] == pytest.approx(1.0)
    assert same["talker_argmax_agreement"] == same["cp_argmax_agreement"] == 1.0
    assert same["snr_db"] == same["e2e_snr_db"] == float("inf")  # the shorter own audio: compared over its length
    assert set(accuracy(base["codes"], None, None, None, None, base)) == {"code_agreement"}


def test_timing_summaries_and_the_busy_flag():
    assert median_ms([0.5, 0.001, 0.003, 0.002], skip=1) == 2.0  # the warm-up left out
    assert median_ms([0.004], skip=3) == 4.0 and median_ms([]) is None  # fewer than skip: all of them
    assert peak_rss_mb() > 1.0
    assert is_busy([0.3, 2.6], threads=2) and not is_busy([None, 2.5], threads=2)
    assert as_list(None) == [] and as_list(1.5) == [1.5] and as_list((1, 2)) == [1, 2]
