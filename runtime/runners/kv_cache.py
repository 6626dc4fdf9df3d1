"""Host key/value buffers for one decoder stack, grown geometrically.

Graphs return only the new entries; this class owns the full buffers and the
fill level, so no per-step concatenation happens on the host. Capacity starts at
``INITIAL_CAPACITY`` positions and doubles when needed (one copy of the filled
part, amortised over as many steps): numpy asks the kernel for transparent huge
pages on large arrays, and with the [kv_heads, positions, head_dim] layout the
first position of every head lands in its own 2 MB page, so a cache allocated for
the full 4096-position context became ~0.8 GB resident at the first step of the
0.6B Talker (measured), while a cache sized to the text holds a few MB.
"""
from __future__ import annotations

import numpy as np

from kztts.bundle.graphs import DYNAMIC_KV
from kztts.core.errors import ContextOverflowError

INITIAL_CAPACITY = 256
_ORT_FLOATS = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(uint8)": np.uint8}


def check_room(used: int, n: int, context: int, remedy: str) -> None:
    """Raise ContextOverflowError when ``n`` new positions do not fit after ``used`` of ``context``."""
    if used + n > context:
        raise ContextOverflowError(f"context overflow: {used} positions used + {n} new > context {context}; "
                                   f"shorten the text, lower --max-frames, or {remedy}")


def kv_dtype(session, input_name: str = DYNAMIC_KV.past_name("key", 0)) -> np.dtype:
    """The KV element type a graph takes (float32; float16 for ``kv-fp16`` bundle variants and fp16
    static HTP graphs; uint8 for static w8a16 graphs with 8-bit KV); float32 for session stand-ins
    that do not describe their inputs."""
    get_inputs = getattr(session, "get_inputs", None)
    for i in get_inputs() if get_inputs is not None else ():
        if i.name == input_name:
            return np.dtype(_ORT_FLOATS.get(i.type, np.float32))
    return np.dtype(np.float32)


class KVCache:
    """Keys and values [1, kv_heads, capacity, head_dim] per layer, filled up to ``length``
    (``capacity`` grows up to ``context``)."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, context: int,
                 dtype: np.dtype = np.float32, initial_capacity: int = INITIAL_CAPACITY):
        self.context = context
        self.dtype = np.dtype(dtype)
        self._shape = (1, num_kv_heads, 0, head_dim)
        self.num_layers = num_layers
        self.capacity = 0
        self.keys: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.length = 0
        self.generation = 0  # bumped whenever the buffers are replaced (IO bindings must follow)
        self._grow(min(context, initial_capacity))

    def _grow(self, capacity: int) -> None:
        b, kv, _, hd = self._shape
        old_k, old_v, n = self.keys, self.values, self.length
        self.keys = [np.zeros((b, kv, capacity, hd), self.dtype) for _ in range(self.num_layers)]
        self.values = [np.zeros((b, kv, capacity, hd), self.dtype) for _ in range(self.num_layers)]
        for new, old in zip(self.keys + self.values, old_k + old_v):
            new[:, :, :n] = old[:, :, :n]
        self.capacity = capacity
        self.generation += 1

    def reset(self) -> None:
        self.length = 0

    def check_room(self, n: int) -> None:
        check_room(self.length, n, self.context, "raise the context length")

    def past(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Views of the filled part of one layer's buffers."""
        n = self.length
        return self.keys[layer][:, :, :n], self.values[layer][:, :, :n]

    def append(self, new_keys: list[np.ndarray], new_values: list[np.ndarray]) -> None:
        """Write the graph's new entries ([1, kv, T, hd] per layer) after the filled part."""
        t = new_keys[0].shape[2]
        self.reserve(t)
        end = self.length + t
        for buf, new in zip(self.keys, new_keys):
            buf[:, :, self.length:end] = new
        for buf, new in zip(self.values, new_values):
            buf[:, :, self.length:end] = new
        self.length = end

    def reserve(self, n: int) -> None:
        """Make room for ``n`` more positions (growing the buffers if needed)."""
        self.check_room(n)
        end = self.length + n
        if end > self.capacity:
            self._grow(min(self.context, max(end, 2 * self.capacity)))

    def snapshot(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Copies of the filled keys and values of every layer (``restore`` puts them back)."""
        n = self.length
        return [k[:, :, :n].copy() for k in self.keys], [v[:, :, :n].copy() for v in self.values]

    def restore(self, keys: list[np.ndarray], values: list[np.ndarray]) -> None:
        """Make the cache hold exactly ``snapshot``'s positions (written into the current buffers, so an
        IO binding to them stays valid unless they must grow)."""
        n = keys[0].shape[2]
        self.length = 0
        self.reserve(n)
        for buf, k in zip(self.keys, keys):
            buf[:, :, :n] = k
        for buf, v in zip(self.values, values):
            buf[:, :, :n] = v
        self.length = n

    def advance(self, n: int) -> None:
        """Count ``n`` positions a graph wrote into the buffers in place (after ``reserve(n)``)."""
        if self.length + n > self.capacity:
            raise ValueError(f"advance({n}) past the capacity {self.capacity} at length {self.length}")
        self.length += n
