"""The static Talker with one graph: decode steps served by the prefill graph (target
``"talker_graphs": "prefill-only"``, ``kztts.htp.targets.TALKER_GRAPHS``).

Where the prompt and token graphs cannot share one weight copy (the x86 HTP simulator of
onnxruntime-qnn 2.7.0 segfaults loading a weight-shared context binary), a bundle can ship the
prefill graph alone: one copy of the Talker's weights on disk and in memory. A decode step at
position ``p`` is then a prefill chunk of ``S`` positions, padded:

- ``p <= C - S``: the new position sits in the chunk's first row, the cache holds ``0..p-1``;
- ``p > C - S`` (the chunk's new slots would run past the context): the chunk starts at
  ``C - S`` and recomputes positions ``C-S..p-1`` from their inputs (kept here) before ``p``, so
  the whole context ``C - 1`` stays usable.

Cost per decode step on a device (qnn_configs/README.md, "Weight sharing", counted from the 0.6B
shapes): ``S`` times the linear-layer and attention MACs of an AR-1 step, the same weight bytes
read. The extra MACs are the price of one weight copy without QNN weight sharing; device targets
keep ``prefill+decode`` in one shared context.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort

from kztts.htp.saturation import SaturationGuard
from kztts.runners.talker_static import PREFILL, StaticTalker


class PrefillOnlyTalker(StaticTalker):
    """``StaticTalker`` over the prefill graph alone (module docstring); same API and KV layout."""

    def __init__(self, prefill_session: ort.InferenceSession, config: dict, mask_value: float = -50.0, *,
                 kv_scales: dict | None = None, guard: SaturationGuard | None = None):
        super().__init__(prefill_session, None, config, mask_value, kv_scales=kv_scales, guard=guard)
        # inputs of positions C-S..C-2: a step past C-S re-runs them in front of the new position
        self._tail = np.zeros((self.chunk, self.hidden_size), np.float32)

    def _run(self, graph: str, sess: ort.InferenceSession, embeds: np.ndarray, n: int, seq: int):
        first = self.graph_context - self.chunk
        for i in range(n):
            if self.length + i >= first:
                self._tail[self.length + i - first] = embeds[i]
        return super()._run(graph, sess, embeds, n, seq)

    def _run_chunk(self, phase: str, embeds: np.ndarray, n: int, seq: int) -> tuple[np.ndarray, np.ndarray]:
        S, p = self.chunk, self.length
        if phase == "prefill":
            return self._run(PREFILL, self.prefill_session, embeds, n, S)
        start = min(p, self.graph_context - S)
        window = np.concatenate([self._tail[:p - start], embeds[:1]]) if p > start else embeds[:1]
        self.length = start
        return self._run(PREFILL, self.prefill_session, window, p - start + 1, S)
