"""kztts.runners.rope: the rotary tables built on the host from explicit positions, as transformers' default RoPE
computes them (the Talker's M-RoPE with equal axes is this 1-D RoPE)."""
from __future__ import annotations

import numpy as np
import pytest

from kztts.runners.rope import rope_tables


@pytest.mark.parametrize("head_dim, theta", [(16, 10000.0), (128, 1000000.0)])
def test_the_tables_are_transformers_default_rope(head_dim, theta):
    import torch
    from transformers import PretrainedConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = PretrainedConfig(rope_theta=theta, head_dim=head_dim, hidden_size=head_dim, num_attention_heads=1,
                              max_position_embeddings=64)
    inv_freq, _ = ROPE_INIT_FUNCTIONS["default"](config, "cpu")
    positions = torch.arange(40, dtype=torch.float32)[:, None]
    emb = torch.cat([positions * inv_freq[None], positions * inv_freq[None]], dim=-1)
    cos, sin = rope_tables(40, head_dim, theta)
    assert cos.dtype == sin.dtype == np.float32 and cos.shape == sin.shape == (40, head_dim)
    # float32 throughout; numpy's and torch's pow round the last bit of some frequencies apart, which position 39
    # turns into at most 1.9e-6 (measured, head_dim 128): bound 4e-6
    np.testing.assert_allclose(cos, emb.cos().numpy(), rtol=0, atol=4e-6)
    np.testing.assert_allclose(sin, emb.sin().numpy(), rtol=0, atol=4e-6)
    assert np.array_equal(cos[0], np.ones(head_dim, np.float32)) and not sin[0].any()  # position 0: no rotation
