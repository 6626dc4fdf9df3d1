"""Rotary position tables, built on the host from explicit positions.

The Talker's M-RoPE uses three position axes; for speech they are always equal,
and interleaved M-RoPE with equal axes is plain 1-D RoPE over the full head_dim.
Building the positions explicitly here (instead of letting a graph derive them)
avoids a bug an earlier C++ port hit, where embeddings-mode positions were garbage.
"""
from __future__ import annotations

import numpy as np


def rope_tables(length: int, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin as float32 [length, head_dim], computed as the reference's default rope does."""
    exponent = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    inv_freq = np.float32(1.0) / (np.float32(theta) ** exponent)
    freqs = np.arange(length, dtype=np.float32)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)
