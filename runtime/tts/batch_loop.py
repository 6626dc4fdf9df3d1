"""Continuous batching: many requests through one batched frame loop (``TTS.synthesize_many``,
``TTS.stream_many``).

Up to ``batch`` requests hold a row each. Per frame: every row chooses its CB0 with its own
settings and random stream (``FrameLoop.choose_cb0``); a row that draws EOS leaves; the rest run
the Code Predictor together (``cp_frame_batched``); a row at its ``max_frames`` leaves; the rows
that stay decode one Talker position together (``talker_batched``). A waiting request takes a
free row at the start of the next frame: its prompt is prefilled into that row alone, and no other
row is recomputed. Each row follows ``kztts.tts.frame_loop.FrameLoop.frames`` step for step and draws its
uniforms in the same order (1 for CB0, then 15 for the Code Predictor), so its codes are the codes
of the same request run alone, greedy or sampled.

The speech decoder runs per stream, on the request's own codes when it finishes
(``synthesize_many``: the whole-utterance decode of ``synthesize``) or chunk by chunk
(``stream_many``: a ``StreamingDecoder`` per row, as ``stream``), so the audio equals the
request's audio alone too.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from kztts.core.errors import KzttsError
from kztts.runners.codec import SAMPLES_PER_FRAME
from kztts.tts.request import SynthesisRequest

# kztts.tts.tts imports this module: its types (TTS, SynthesisResult, _Run) are named, not imported

log = logging.getLogger(__name__)


@dataclass(eq=False)  # rows are found by identity
class _Row:
    """A request in the batch: its run (``kztts.tts.tts._Run``) and where its frame loop stands."""

    index: int
    run: "_Run"
    logits: np.ndarray
    hidden: np.ndarray
    step: int = 0
    history: list[int] = field(default_factory=list)
    c0: int = 0


def _check_batch(batch: int) -> int:
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise KzttsError(f"batch must be an integer >= 1, got {batch!r}")
    return int(batch)


def start_runs(tts: "TTS", requests: list) -> list["_Run"]:
    """Each request checked and prepared (prompt, settings, random stream) before any frame runs."""
    runs = []
    for i, item in enumerate(requests):
        r = SynthesisRequest.of(item, i)
        if len(tts.pieces(r)) > 1:
            raise KzttsError(f"request {i}: its text needs more than the Talker's context of {tts.talker.context} "
                             "positions; batched synthesis speaks one utterance per request (split the text, or "
                             "use synthesize)")
        run = tts._start(r)
        run.label = f"request {i}"
        run.loop._suppress = run.loop._suppressed()  # what FrameLoop.frames sets before choose_cb0
        runs.append(run)
    return runs


def batch_frames(tts: "TTS", runs: list["_Run"], batch: int) -> Iterator[tuple[int, np.ndarray | None]]:
    """Yield ``(index, frame int64 [16])`` as rows produce frames and ``(index, None)`` when request
    ``index`` is finished (EOS or its ``max_frames``); frames go to ``runs[index].codes`` too."""
    batch = _check_batch(batch)
    if not runs:
        return
    capacity = max(r.prompt.embeds.shape[0] + r.loop.settings.max_frames - 1 for r in runs)
    talker, cp = tts.plan.open_batched(tts.tables, min(batch, len(runs)), capacity)
    eos = int(tts.bundle.manifest.special_ids["codec_eos"])
    waiting = deque(range(len(runs)))
    active: list[_Row] = []  # active[k] holds row k of the buffers
    while waiting or active:
        while waiting and len(active) < talker.rows:  # join at this frame
            i = waiting.popleft()
            t = time.perf_counter()
            logits, hidden = talker.prefill(len(active), runs[i].prompt.embeds)
            runs[i].loop.times.talker += time.perf_counter() - t
            active.append(_Row(i, runs[i], logits, hidden))
        going = []
        for row in active:
            loop = row.run.loop
            row.c0 = loop.choose_cb0(row.logits, row.history, row.step)
            row.history.append(row.c0)
            if row.c0 == eos:
                loop.stopped_by_eos = True
                yield row.index, None
            else:
                going.append(row)
        t = time.perf_counter()
        if going:
            uniforms = np.stack([r.run.loop.rng.uniforms(cp.num_groups) for r in going])
            codes, sums = cp.predict(np.stack([r.hidden for r in going]), [r.c0 for r in going],
                                     [r.run.loop.settings.code_predictor for r in going], uniforms)
        spent = time.perf_counter() - t
        staying = []
        for k, row in enumerate(going):
            row.run.loop.times.code_predictor += spent
            frame = np.empty(16, np.int64)
            frame[0], frame[1:] = row.c0, codes[k]
            row.run.codes.append(frame)
            yield row.index, frame
            if row.step == row.run.loop.settings.max_frames - 1:  # the reference never feeds it back
                yield row.index, None
            else:
                staying.append(k)
        talker.keep([active.index(going[k]) for k in staying])
        active = [going[k] for k in staying]
        if not active:
            continue
        embeds = (tts.tables.codec([r.c0 for r in active]) + sums[staying]
                  + np.stack([r.run.prompt.text_after(r.step) for r in active]))
        t = time.perf_counter()
        logits, hidden = talker.decode(embeds)
        spent = time.perf_counter() - t
        for k, row in enumerate(active):
            row.logits, row.hidden = logits[k], hidden[k]
            row.step += 1
            row.run.loop.times.talker += spent


def synthesize_many(tts: "TTS", requests: list, batch: int) -> list["SynthesisResult"]:
    """``tts.synthesize`` of every request, ``batch`` at a time; results in request order."""
    runs = start_runs(tts, requests)
    results: list = [None] * len(runs)
    for index, frame in batch_frames(tts, runs, batch):
        if frame is None:
            results[index] = tts._decoded_result(runs[index])
    return results


class _RowStream:
    """One request's audio as ``TTS.stream`` makes it: its own ``StreamingDecoder``, chunks of
    ``chunk_frames`` frames, an ICL reference decoded in front and its samples dropped."""

    def __init__(self, tts: "TTS", run: "_Run", chunk_frames: int):
        self.run, self.chunk_frames = run, chunk_frames
        self.dec = tts.plan.open_streaming_decoder()  # a fresh state over the shared session
        self.pending: list[np.ndarray] = []
        self.chunks: list[np.ndarray] = []
        self.skip = 0
        if run.voice.icl:
            ref = run.voice.ref_codes
            self.skip = ref.shape[0] * SAMPLES_PER_FRAME - self._push(ref).shape[0]

    def _push(self, codes: np.ndarray) -> np.ndarray:
        t = time.perf_counter()
        audio = self.dec.push(codes)
        self.run.loop.times.decoder += time.perf_counter() - t
        return audio

    def _flush(self) -> np.ndarray:
        audio = self._push(np.stack(self.pending))
        self.pending.clear()
        cut = min(self.skip, audio.shape[0])
        self.skip -= cut
        audio = audio[cut:]
        if audio.shape[0]:
            if self.run.loop.times.first_audio is None:
                self.run.loop.times.first_audio = time.perf_counter() - self.run.started
            self.chunks.append(audio)
        return audio

    def frame(self, frame: np.ndarray | None) -> np.ndarray:
        """The audio a frame (or the end, None) completes; empty when none."""
        if frame is not None:
            self.pending.append(frame)
        if self.pending and (frame is None or len(self.pending) == self.chunk_frames):
            return self._flush()
        return np.zeros(0, np.float32)

    def samples(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)


def stream_many(tts: "TTS", requests: list, batch: int, chunk_frames: int = 4,
                results: dict | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(index, audio chunk)`` as the rows' chunks are decoded (``chunk_frames`` frames each);
    ``results`` (a dict) receives each request's ``SynthesisResult`` under its index when it ends."""
    if isinstance(chunk_frames, bool) or not isinstance(chunk_frames, int) or chunk_frames < 1:
        raise KzttsError(f"chunk_frames must be >= 1, got {chunk_frames}")
    runs = start_runs(tts, requests)
    streams: dict[int, _RowStream] = {}
    for index, frame in batch_frames(tts, runs, batch):
        if index not in streams:
            streams[index] = _RowStream(tts, runs[index], chunk_frames)
        audio = streams[index].frame(frame)
        if audio.shape[0]:
            yield index, audio
        if frame is None:
            if results is not None:
                results[index] = tts._result(runs[index], streams[index].samples())
            del streams[index]
