"""KVCache: geometric growth keeps the filled entries; the context bound still holds."""
from __future__ import annotations

import numpy as np
import pytest

from kztts.core.errors import ContextOverflowError
from kztts.runners.kv_cache import KVCache


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_growth_keeps_entries_and_respects_context(dtype):
    kv = KVCache(num_layers=2, num_kv_heads=3, head_dim=4, context=40, dtype=dtype, initial_capacity=8)
    rng = np.random.default_rng(0)
    written_k, written_v = [], []
    for t in (5, 1, 7, 1, 12, 14):  # crosses 8, 16, 32 and ends at the 40-position context
        k = [rng.standard_normal((1, 3, t, 4)).astype(dtype) for _ in range(2)]
        v = [rng.standard_normal((1, 3, t, 4)).astype(dtype) for _ in range(2)]
        kv.append(k, v)
        written_k.append(k)
        written_v.append(v)
    assert kv.length == 40 and kv.capacity == 40
    for layer in range(2):
        pk, pv = kv.past(layer)
        assert pk.dtype == dtype and pk.shape == (1, 3, 40, 4)
        np.testing.assert_array_equal(pk, np.concatenate([k[layer] for k in written_k], axis=2))
        np.testing.assert_array_equal(pv, np.concatenate([v[layer] for v in written_v], axis=2))
    with pytest.raises(ContextOverflowError):
        kv.append([np.zeros((1, 3, 1, 4), dtype)] * 2, [np.zeros((1, 3, 1, 4), dtype)] * 2)
    kv.reset()
    assert kv.length == 0 and kv.past(0)[0].shape[2] == 0
