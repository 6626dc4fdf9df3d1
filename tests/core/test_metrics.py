"""kztts.core.metrics: the accuracy measures every bench row, validation and test reads (cosine of rows, SNR,
code agreement)."""
from __future__ import annotations

from kztts.core.metrics import agreement, snr_db


def test_agreement_and_snr_db():
    import numpy as np

    a = np.arange(32).reshape(2, 16)
    b = a.copy()
    b[1, 3] += 1
    assert agreement(a, a) == 1.0 and agreement(b, a) == 31 / 32 and agreement(a[:1], a) == 0.5
    x = np.sin(np.arange(1000.0))
    assert snr_db(x, x) == float("inf")
    assert abs(snr_db(x * 1.01, x) - 40.0) < 1e-6
