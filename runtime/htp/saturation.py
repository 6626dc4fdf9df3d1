"""fp16 saturation on the HTP, seen at run time through the layer segments' magnitude probes.

Every Talker segment graph returns ``stats``, the largest |x| of its inner tensors
(``kztts.bundle.segments.LAYER_STATS`` / ``HEAD_STATS``). ``kztts calibrate`` reads them on the CPU to
choose a placement; a :class:`SaturationGuard` reads them on every call of a graph that ran on
the HTP, against the same threshold (``kztts.bundle.segments.DEFAULT_THRESHOLD``, or the one of the
placement file): at or above it, fp16 has lost the value (or nearly) and the audio may be wrong.
By default the first such call of a guard logs one warning; ``strict`` raises instead. ``count``
is the number of flagged graph calls of the current utterance (the synthesis summary shows it).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from kztts.bundle.segments import DEFAULT_THRESHOLD, HEAD_STATS, LAYER_STATS, Unit
from kztts.core.errors import KzttsError

log = logging.getLogger(__name__)


class SaturationError(KzttsError):
    """A probe of an HTP graph reached the guard threshold under ``strict``."""


@dataclass
class SaturationGuard:
    """Checks the probes of HTP graph calls; ``count`` flagged calls since ``new_utterance``."""

    threshold: float = DEFAULT_THRESHOLD
    strict: bool = False
    count: int = 0
    total: int = 0
    warned: bool = False
    layer_names: tuple | None = None  # per layer, the names of its stats (a hybrid's DeltaNet layers differ)

    def new_utterance(self) -> None:
        self.count = 0

    def check(self, phase: str, unit: Unit, stats: np.ndarray) -> None:
        """One graph call's ``stats`` (``phase``: prefill or decode; ``unit``: layer index or head)."""
        mags = np.abs(np.asarray(stats, dtype=np.float32).ravel())
        over = ~(mags < self.threshold)  # NaN counts: an overflow that has already propagated
        if not over.any():
            return
        self.count += 1
        self.total += 1
        if self.warned and not self.strict:
            return
        k = int(np.argmax(np.where(np.isnan(mags), np.inf, mags)))
        names = HEAD_STATS if unit == "head" else (self.layer_names[int(unit)] if self.layer_names else LAYER_STATS)
        where = "head" if unit == "head" else f"layer {int(unit)}"
        msg = (f"fp16 saturation on the HTP: Talker {phase} {where}, {names[k]} reached |x| = {mags[k]:.4g} "
               f"(guard threshold {self.threshold:g}); the audio may be wrong: run `kztts calibrate BUNDLE -o "
               f"placement.json` and synthesise with --placement placement.json, which keeps such layers on the CPU")
        if self.strict:
            raise SaturationError(msg)
        self.warned = True
        log.warning("%s", msg)
