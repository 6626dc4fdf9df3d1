"""Joining the audio of a long text's pieces without clicks, whole or while streaming.

Between two pieces: the last ``FADE_SECONDS`` of the first fade out, ``GAP_SECONDS`` of silence
follow, and the first ``FADE_SECONDS`` of the next fade in (raised-cosine ramps), so no edge jumps.
The text's own start and end are left as they are. 80 ms is one frame's worth of samples (1920
at 24 kHz), a pause shorter than a sentence break in speech.
"""
from __future__ import annotations

import numpy as np

GAP_SECONDS = 0.08
FADE_SECONDS = 0.01


class PieceJoiner:
    """Feed each piece's audio with ``push`` (whole or in chunks), then ``end_piece``; what they
    return, concatenated in order, is the joined audio. It holds back the last ``FADE_SECONDS`` of
    every piece but the last, to fade them out once the piece is known to end."""

    def __init__(self, sample_rate: int, pieces: int):
        self.fade = max(1, round(FADE_SECONDS * sample_rate))
        self.gap = round(GAP_SECONDS * sample_rate)
        self.pieces = pieces
        self.index = 0  # the piece being fed
        ramp = np.sin(0.5 * np.pi * (np.arange(self.fade) + 0.5) / self.fade).astype(np.float32) ** 2
        self._fade_in, self._fade_out = ramp, ramp[::-1].copy()
        self._pos = 0  # samples of the current piece pushed so far
        self._tail = np.zeros(0, np.float32)

    @property
    def _last(self) -> bool:
        return self.index >= self.pieces - 1

    def push(self, audio: np.ndarray) -> np.ndarray:
        """The part of ``audio`` (the next samples of the current piece) that can be played now."""
        audio = np.asarray(audio, dtype=np.float32)
        if self.index > 0 and self._pos < self.fade and audio.shape[0]:
            n = min(self.fade - self._pos, audio.shape[0])
            audio = audio.copy()
            audio[:n] *= self._fade_in[self._pos:self._pos + n]
        self._pos += audio.shape[0]
        if self._last:
            return audio
        held = np.concatenate([self._tail, audio])
        cut = max(0, held.shape[0] - self.fade)
        self._tail = held[cut:]
        return held[:cut]

    def end_piece(self) -> np.ndarray:
        """The faded-out end of the current piece and the silence after it (empty after the last)."""
        if self._last:
            self.index += 1
            return np.zeros(0, np.float32)
        tail = self._tail * self._fade_out[self.fade - self._tail.shape[0]:]
        self.index += 1
        self._pos, self._tail = 0, np.zeros(0, np.float32)
        return np.concatenate([tail, np.zeros(self.gap, np.float32)])


class OpenJoiner:
    """``PieceJoiner`` for a text whose number of pieces is unknown while it is spoken (a reply still being
    written): a piece's faded end and the silence after it are given out when the next piece's first
    audio comes, and ``finish`` gives the last piece's held end as it is. Concatenated, the same samples
    as ``join_pieces`` of the same pieces."""

    def __init__(self, sample_rate: int):
        self._joiner = PieceJoiner(sample_rate, pieces=1 << 62)
        self._ended = False  # a piece ended, its faded end not given out yet

    def push(self, audio: np.ndarray) -> np.ndarray:
        out = []
        if self._ended and np.shape(audio)[0]:
            out.append(self._joiner.end_piece())
            self._ended = False
        out.append(self._joiner.push(audio))
        return np.concatenate(out)

    def end_piece(self) -> None:
        self._ended = True

    def finish(self) -> np.ndarray:
        """The last piece's held end (the text is complete)."""
        tail, self._joiner._tail = self._joiner._tail, np.zeros(0, np.float32)
        return tail


def join_pieces(pieces: list[np.ndarray], sample_rate: int) -> np.ndarray:
    """The pieces' audio joined as ``PieceJoiner`` streams it: ``sum(len) + (n - 1) * gap`` samples."""
    joiner = PieceJoiner(sample_rate, len(pieces))
    out = []
    for audio in pieces:
        out += [joiner.push(audio), joiner.end_piece()]
    return np.concatenate(out) if out else np.zeros(0, np.float32)
