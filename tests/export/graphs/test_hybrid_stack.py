"""kztts.export.graphs.hybrid_stack: the gated delta rule as the hybrid graphs compute it. A chunk's triangular
system solved as a product of ``ceil(log2 L)`` factors is exact, and the chunked rule (plain, and the fp16-safe form
of the static graphs) leaves the outputs and the state the recurrent rule leaves token by token (the whole stack
against transformers: tests/lm/test_hybrid_lm.py)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kztts.export.graphs.hybrid_stack import (  # noqa: E402
    chunk_delta_rule,
    factors_for,
    neumann_inverse,
    recurrent_delta_rule,
)


def test_the_triangular_inverse_is_exact_with_enough_factors():
    torch.manual_seed(0)
    for length in (1, 2, 5, 16, 63, 64):
        n = torch.randn(3, length, length, dtype=torch.float64).tril(-1) * 0.3
        want = torch.linalg.inv(torch.eye(length, dtype=torch.float64) - n)
        got = neumann_inverse(n, factors_for(length))
        assert 2 ** factors_for(length) >= length
        assert torch.allclose(got, want, rtol=1e-9, atol=1e-9), length


@pytest.mark.parametrize("safe", [False, True])
def test_a_chunk_leaves_what_the_tokens_leave_one_by_one(safe):
    torch.manual_seed(1)
    h, length, dk, dv = 2, 13, 8, 6
    q = torch.randn(1, h, length, dk, dtype=torch.float64) * dk ** -0.5
    k = torch.nn.functional.normalize(torch.randn(1, h, length, dk, dtype=torch.float64), dim=-1)
    v = torch.randn(1, h, length, dv, dtype=torch.float64)
    g = -torch.rand(1, h, length, dtype=torch.float64) * 2  # log decays
    beta = torch.rand(1, h, length, dtype=torch.float64)
    state = torch.randn(1, h, dk, dv, dtype=torch.float64)
    out, chunk_state = chunk_delta_rule(q, k, v, g, beta, state, factors_for(length), safe=safe)
    outs, s = [], state
    for t in range(length):
        o, s = recurrent_delta_rule(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], g[:, :, t:t + 1],
                                    beta[:, :, t:t + 1], s, safe=safe)
        outs.append(o)
    assert torch.allclose(out, torch.cat(outs, dim=2), rtol=1e-9, atol=1e-9)
    assert torch.allclose(chunk_state, s, rtol=1e-9, atol=1e-9)
