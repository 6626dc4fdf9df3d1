"""The API every Talker runner shares, so the frame loop, the LM, validation and calibration take any
of them: the CPU ``Talker``, ``StaticTalker`` (HTP), ``PrefillOnlyTalker``, ``HandoverTalker`` (prefill
on the HTP, decode on the CPU) and ``SegmentedTalker`` (layers placed one by one); a hybrid LM's
``HybridTalker``, ``HybridStaticTalker`` and ``HybridHandover``."""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class TalkerRunner(Protocol):
    """A decoder stack with its KV cache: embeddings in, last-position logits and hidden out."""

    @property
    def context(self) -> int:
        """The positions its cache holds."""

    @property
    def position(self) -> int:
        """The positions cached so far."""

    def reset(self) -> None:
        """Forget the cache (a new utterance or conversation)."""

    def prefill(self, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A fresh cache from ``embeds`` [T, hidden]: the last position's (logits, hidden)."""

    def decode(self, embed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One more position ``embed`` [hidden]: its (logits, hidden)."""

    def extend(self, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """More positions ``embeds`` [T, hidden] after those cached: the last one's (logits, hidden)."""
