"""Preallocated key/value buffers for one decoder stack.

Graphs return only the new entries; this class owns the full buffers and the
fill level, so no per-step concatenation or reallocation happens on the host.
``np.zeros`` maps untouched pages lazily, so a long context costs memory only
as it fills.
"""
from __future__ import annotations

import numpy as np

from kztts.errors import ContextOverflowError

_ORT_FLOATS = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def kv_dtype(session, input_name: str = "past_key_0") -> np.dtype:
    """The KV element type a graph takes (float32, or float16 for ``kv-fp16`` bundle variants)."""
    for i in session.get_inputs():
        if i.name == input_name:
            return np.dtype(_ORT_FLOATS.get(i.type, np.float32))
    return np.dtype(np.float32)


class KVCache:
    """Keys and values [1, kv_heads, context, head_dim] per layer, filled up to ``length``."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, context: int,
                 dtype: np.dtype = np.float32):
        self.context = context
        shape = (1, num_kv_heads, context, head_dim)
        self.keys = [np.zeros(shape, dtype) for _ in range(num_layers)]
        self.values = [np.zeros(shape, dtype) for _ in range(num_layers)]
        self.length = 0

    def reset(self) -> None:
        self.length = 0

    def check_room(self, n: int) -> None:
        if self.length + n > self.context:
            raise ContextOverflowError(
                f"context overflow: {self.length} positions used + {n} new > context {self.context}; "
                "shorten the text, lower --max-frames, or raise the context length")

    def past(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Views of the filled part of one layer's buffers."""
        n = self.length
        return self.keys[layer][:, :, :n], self.values[layer][:, :, :n]

    def append(self, new_keys: list[np.ndarray], new_values: list[np.ndarray]) -> None:
        """Write the graph's new entries ([1, kv, T, hd] per layer) after the filled part."""
        t = new_keys[0].shape[2]
        self.check_room(t)
        end = self.length + t
        for buf, new in zip(self.keys, new_keys):
            buf[:, :, self.length:end] = new
        for buf, new in zip(self.values, new_values):
            buf[:, :, self.length:end] = new
        self.length = end
