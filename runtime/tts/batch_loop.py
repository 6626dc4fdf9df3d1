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
from dataclasses import dataclass, field, replace
from typing import Iterator

import numpy as np

from kztts.core.errors import KzttsError
from kztts.runners.codec import SAMPLES_PER_FRAME
from kztts.tts.audio_join import OpenJoiner, PieceJoiner, join_pieces
from kztts.tts.prepared import PreparedSpeech, written_label
from kztts.tts.request import SynthesisRequest
from kztts.tts.result import SynthesisResult, joined
from kztts.tts.streaming import chunk_sizes
from kztts.tts.utterance import Utterance

# kztts.tts.tts imports this module: the TTS is named, not imported

log = logging.getLogger(__name__)


@dataclass(eq=False)  # rows are found by identity
class _Row:
    """A request in the batch: its utterance (``kztts.tts.utterance.Utterance``) and where its frame loop stands."""

    index: int
    run: Utterance
    logits: np.ndarray
    hidden: np.ndarray
    step: int = 0
    history: list[int] = field(default_factory=list)
    c0: int = 0


def _check_batch(batch: int) -> int:
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise KzttsError(f"batch must be an integer >= 1, got {batch!r}")
    return int(batch)


def _ready(run: Utterance) -> Utterance:
    run.loop._suppress = run.loop._suppressed()  # what FrameLoop.frames sets before choose_cb0
    return run


def start_runs(tts: "TTS", requests: list, names: list[str] | None = None) -> list[Utterance]:
    """Each request checked and prepared (prompt, settings, random stream) before any frame runs; ``names`` say
    how errors and warnings name each (default ``request I``, its list index)."""
    runs = []
    for i, item in enumerate(requests):
        name = names[i] if names is not None else f"request {i}"
        prepared = tts.prepare(SynthesisRequest.of(item, i))
        if len(prepared.texts) > 1:
            raise KzttsError(f"{name}: its text needs more than the Talker's context of {tts.talker.context} "
                             "positions; batched synthesis speaks one utterance per request (split the text, or "
                             "use synthesize)")
        runs.append(_ready(prepared.utterance(0, name)))
    return runs


class BatchLoop:
    """The rows of the batched graphs: a run joins a free row (``join``: its prompt prefilled into that
    row alone) and leaves at its end or when dropped (``leave``); ``step`` runs one frame for every
    row. ``batch_frames`` drives it over a fixed list of runs; a server admits runs while it goes.

    The KV buffers hold ``capacity`` positions per row and grow (the filled positions copied into
    larger buffers) when a joining run needs more: a row's numbers do not depend on the capacity."""

    def __init__(self, tts: "TTS", rows: int, capacity: int):
        self.tts = tts
        self.talker, self.cp = tts.plan.open_batched(tts.tables, _check_batch(rows), max(1, int(capacity)))
        self.eos = int(tts.bundle.manifest.special_ids["codec_eos"])
        self.active: list[_Row] = []  # active[k] holds row k of the buffers
        self.waiting = 0  # rows that sat the last frame out, waiting for their text
        self.sat_out: set = set()  # their keys

    @property
    def rows(self) -> int:
        return self.talker.rows

    @property
    def free(self) -> int:
        """Rows a run may join now."""
        return self.talker.rows - len(self.active)

    def _grow(self, capacity: int) -> None:
        old = self.talker
        self.talker, self.cp = self.tts.plan.open_batched(self.tts.tables, old.rows, capacity)
        for row in range(len(self.active)):
            n = int(old.lengths[row])
            for dst, src in zip((*self.talker.keys, *self.talker.values), (*old.keys, *old.values)):
                dst[row, :, :n] = src[row, :, :n]
            self.talker.lengths[row] = n
        log.debug("batch KV capacity grown from %d to %d positions per row", old.capacity, capacity)

    def join(self, key, run: Utterance) -> None:
        """Prefill ``run`` (from ``start_runs`` or ``BatchedRequest``) into the next free row; its frames
        are reported under ``key``."""
        if not self.free:
            raise KzttsError(f"all {self.rows} batch rows are taken")
        need = run.prompt.embeds.shape[0] + run.loop.settings.max_frames - 1
        if need > self.talker.capacity:
            self._grow(max(need, min(2 * self.talker.capacity, run.loop.talker.context)))
        t = time.perf_counter()
        logits, hidden = self.talker.prefill(len(self.active), run.prompt.embeds)
        run.loop.times.talker += time.perf_counter() - t
        self.active.append(_Row(key, run, logits, hidden))

    def leave(self, keys) -> None:
        """Drop the rows of ``keys`` before their end (their requests were cancelled)."""
        staying = [k for k, row in enumerate(self.active) if row.index not in keys]
        if len(staying) < len(self.active):
            self.talker.keep(staying)
            self.active = [self.active[k] for k in staying]

    def step(self) -> Iterator[tuple[object, np.ndarray | None]]:
        """One frame for every row that can make one now: yield ``(key, frame int64 [16])`` per frame (also
        appended to the run's codes) and ``(key, None)`` when a run ends (EOS or its ``max_frames``); its row is
        free once the generator is exhausted. A row whose text is still being written and has not come this
        far (``Utterance.ready``) sits the frame out: the others go on without it."""
        tts, talker, cp = self.tts, self.talker, self.cp
        going, ended = [], set()
        self.sat_out = set()
        for row in self.active:
            if not row.run.ready(row.step):
                self.sat_out.add(row.index)
                continue
            loop = row.run.loop
            row.c0 = loop.choose_cb0(row.logits, row.history, row.step)
            row.history.append(row.c0)
            if row.c0 == self.eos:
                loop.stopped_by_eos = True
                ended.add(id(row))
                yield row.index, None
            else:
                going.append(row)
        self.waiting = len(self.active) - len(going) - len(ended)
        t = time.perf_counter()
        if going:
            uniforms = np.stack([r.run.loop.rng.uniforms(cp.num_groups) for r in going])
            codes, sums = cp.predict(np.stack([r.hidden for r in going]), [r.c0 for r in going],
                                     [r.run.loop.settings.code_predictor for r in going], uniforms)
        spent = time.perf_counter() - t
        fed = []  # (row, the embedding it takes in)
        for k, row in enumerate(going):
            row.run.loop.times.code_predictor += spent
            frame = np.empty(16, np.int64)
            frame[0], frame[1:] = row.c0, codes[k]
            row.run.codes.append(frame)
            yield row.index, frame
            if row.run.last_frame(row.step):  # the reference never feeds it back
                ended.add(id(row))
                yield row.index, None
            else:
                fed.append((row, k))
        if ended:
            staying = [k for k, row in enumerate(self.active) if id(row) not in ended]
            talker.keep(staying)
            self.active = [self.active[k] for k in staying]
        if not fed:
            return
        embeds = (tts.tables.codec([r.c0 for r, _ in fed]) + sums[[k for _, k in fed]]
                  + np.stack([r.run.prompt.text_after(r.step) for r, _ in fed]))
        t = time.perf_counter()
        logits, hidden = talker.decode_rows([self.active.index(r) for r, _ in fed], embeds)
        spent = time.perf_counter() - t
        for k, (row, _) in enumerate(fed):
            row.logits, row.hidden = logits[k], hidden[k]
            row.step += 1
            row.run.loop.times.talker += spent


def batch_frames(tts: "TTS", runs: list[Utterance], batch: int) -> Iterator[tuple[int, np.ndarray | None]]:
    """Yield ``(index, frame int64 [16])`` as rows produce frames and ``(index, None)`` when request
    ``index`` is finished (EOS or its ``max_frames``); frames go to ``runs[index].codes`` too."""
    batch = _check_batch(batch)
    if not runs:
        return
    capacity = max(r.prompt.embeds.shape[0] + r.loop.settings.max_frames - 1 for r in runs)
    loop = BatchLoop(tts, min(batch, len(runs)), capacity)
    waiting = deque(range(len(runs)))
    while waiting or loop.active:
        while waiting and loop.free:  # join at this frame
            i = waiting.popleft()
            loop.join(i, runs[i])
        yield from loop.step()


def synthesize_many(tts: "TTS", requests: list, batch: int, names: list[str] | None = None) -> list[SynthesisResult]:
    """``tts.synthesize`` of every request, ``batch`` at a time; results in request order."""
    runs = start_runs(tts, requests, names)
    results: list = [None] * len(runs)
    for index, frame in batch_frames(tts, runs, batch):
        if frame is None:
            results[index] = runs[index].decode(tts.whole_decoder(), tts.sample_rate)
    return results


class _RowStream:
    """One request's audio as ``TTS.stream`` makes it: its own ``StreamingDecoder``, chunks of
    ``chunk_sizes(first_chunk, chunk_frames)`` frames, an ICL reference decoded in front and its samples
    dropped."""

    def __init__(self, tts: "TTS", run: Utterance, chunk_frames: int, first_chunk: int = 1):
        self.run = run
        self._sizes = chunk_sizes(first_chunk, chunk_frames)
        self._size = next(self._sizes)  # frames of the chunk being gathered
        self.dec = tts.plan.open_streaming_decoder()  # a fresh state over the shared session
        self.pending: list[np.ndarray] = []
        self.chunks: list[np.ndarray] = []
        self.skip = 0
        ref = run.reference_codes
        if ref is not None:
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
        if self.pending and (frame is None or len(self.pending) == self._size):
            self._size = next(self._sizes)
            return self._flush()
        return np.zeros(0, np.float32)

    def samples(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)


def stream_many(tts: "TTS", requests: list, batch: int, chunk_frames: int = 4,
                results: dict | None = None, first_chunk: int = 1) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(index, audio chunk)`` as the rows' chunks are decoded (``chunk_frames`` frames each);
    ``results`` (a dict) receives each request's ``SynthesisResult`` under its index when it ends."""
    if isinstance(chunk_frames, bool) or not isinstance(chunk_frames, int) or chunk_frames < 1:
        raise KzttsError(f"chunk_frames must be >= 1, got {chunk_frames}")
    runs = start_runs(tts, requests)
    streams: dict[int, _RowStream] = {}
    for index, frame in batch_frames(tts, runs, batch):
        if index not in streams:
            streams[index] = _RowStream(tts, runs[index], chunk_frames, first_chunk)
        audio = streams[index].frame(frame)
        if audio.shape[0]:
            yield index, audio
        if frame is None:
            if results is not None:
                results[index] = runs[index].finish(streams[index].samples(), tts.sample_rate)
            del streams[index]


class BatchedRequest:
    """One request through a ``BatchLoop``, spoken as ``TTS.synthesize`` speaks it alone (``stream``
    False: each piece decoded whole at its end, the pieces joined at the end) or as ``TTS.stream``
    does (``stream`` True: chunks of ``chunk_frames`` frames as they are decoded, joined as they go).
    A long text is spoken in ``TTS.pieces``, one after the other in the request's row: when a piece
    ends, ``next_run`` gives the next one to join.

    Two sides, which may run on two threads: ``next_run`` (the frame loop's side) and ``frame`` /
    ``result`` (the audio side), fed each piece's frames then its end, in order. The audio side reads
    a piece's codes only at its end, when the frame loop has finished with them."""

    def __init__(self, tts: "TTS", request: SynthesisRequest | PreparedSpeech, *, stream: bool, chunk_frames: int = 4,
                 first_chunk: int = 1):
        chunk_sizes(first_chunk, chunk_frames)  # checks both
        prepared = request if isinstance(request, PreparedSpeech) else tts.prepare(request)
        self._start(tts, prepared, stream, chunk_frames, first_chunk, PieceJoiner(tts.sample_rate, len(prepared.texts)))
        self.texts = prepared.texts
        self.index = -1  # the last piece handed to the frame loop

    def _start(self, tts: "TTS", prepared: PreparedSpeech, stream: bool, chunk_frames: int, first_chunk: int,
               joiner) -> None:
        """What every request through the loop holds: its prepared speech, how it is streamed, its clock, and the
        audio side's results, joiner and output."""
        self.prepared = prepared
        self.tts, self.request, self.stream, self.chunk_frames = tts, prepared.request, bool(stream), chunk_frames
        self.first_chunk = first_chunk
        self.started = time.perf_counter()
        self.results: list = []  # each finished piece's SynthesisResult (audio side)
        self.first_audio: float | None = None  # seconds from the start to the first audio out
        self._joiner = joiner
        self._pieces: deque = deque()  # (run, _RowStream | None) of the pieces started, not yet ended
        self._out: list[np.ndarray] = []

    @property
    def done(self) -> bool:
        """Every piece has ended (audio side)."""
        return len(self.results) == len(self.texts)

    def next_run(self) -> "Utterance | None":
        """The next piece's utterance (for ``BatchLoop.join``), or None after the last piece (frame loop side)."""
        self.index += 1
        if self.index >= len(self.texts):
            return None
        run = self.prepared.utterance(self.index)
        self._pieces.append((_ready(run), _RowStream(self.tts, run, self.chunk_frames, self.first_chunk)
                                                   if self.stream else None))
        return run

    def _emit(self, audio: np.ndarray) -> np.ndarray:
        if audio.shape[0]:
            if self.first_audio is None:
                self.first_audio = time.perf_counter() - self.started
            self._out.append(audio)
        return audio

    def frame(self, frame: np.ndarray | None) -> np.ndarray:
        """The audio (float32) that the next frame of the oldest unfinished piece, or its end (None),
        makes ready; empty when none (audio side). Streamed, the chunks concatenated are the request's
        ``stream``; whole, the audio comes at the end of the last piece and equals its ``synthesize``."""
        empty = np.zeros(0, np.float32)
        run, row = self._pieces[0]
        if frame is None:
            self._pieces.popleft()
        if self.stream:
            audio = row.frame(frame)
            out = [self._joiner.push(audio)] if audio.shape[0] else []
            if frame is None:
                self.results.append(run.finish(row.samples(), self.tts.sample_rate))
                out.append(self._joiner.end_piece())
            out = [a for a in out if a.shape[0]]
            return self._emit(np.concatenate(out) if len(out) > 1 else out[0] if out else empty)
        if frame is None:
            self.results.append(run.decode(self.tts.whole_decoder(), self.tts.sample_rate))
            if self.done:
                samples = self.results[0].samples if len(self.texts) == 1 else \
                    join_pieces([r.samples for r in self.results], self.tts.sample_rate)
                return self._emit(samples)
        return empty

    def result(self) -> SynthesisResult:
        """The request's ``SynthesisResult`` once every piece has ended (audio side)."""
        if not self.done:
            raise KzttsError(f"the request has {len(self.texts) - len(self.results)} pieces left to speak")
        if len(self.texts) == 1:
            return self.results[0]
        samples = np.concatenate(self._out) if self._out else np.zeros(0, np.float32)
        return joined(self.results, samples, self.tts.sample_rate, self.started, self.first_audio)

    def ready(self) -> bool:
        """Whether ``next_run`` would not wait (frame loop side): always, for a text given whole."""
        return True

    def finish(self) -> np.ndarray:
        """The audio held back once the frame loop has no piece left (audio side): none for a text given
        whole, whose last piece is known as such."""
        return np.zeros(0, np.float32)


class WrittenRequest(BatchedRequest):
    """A ``BatchedRequest`` whose text is still being written (``text``: a ``kztts.tts.text.track.TextFeed``, or
    any iterable of pieces), spoken as ``TTS.stream_text`` speaks it: each piece (``WrittenText``) joins the
    row when its prompt's text has come (``ready``), and a row waiting for its text sits frames out
    (``Utterance.ready``) while the others go on. The number of pieces is known only at the end: the frame loop's
    side calls ``next_run`` until None, then the audio side ``finish`` for the held-back end."""

    def __init__(self, tts: "TTS", request: SynthesisRequest | PreparedSpeech, text, *, stream: bool,
                 chunk_frames: int = 4, first_chunk: int = 1):
        chunk_sizes(first_chunk, chunk_frames)  # checks both
        if isinstance(request, PreparedSpeech):
            prepared = request
        else:
            if request.streaming_text is False and request.text:
                raise KzttsError("a text still being written is spoken in the streaming text mode")
            prepared = PreparedSpeech(tts, replace(request, streaming_text=True), written=True)
        self._start(tts, prepared, stream, chunk_frames, first_chunk, OpenJoiner(tts.sample_rate))
        self.written = prepared.written_text(text)
        self._pending = None  # the next piece, before its prompt's text has come
        self._ended = False  # the frame loop's side found no piece left
        self._begun = 0  # pieces handed to the frame loop

    @property
    def texts(self) -> list[str]:
        """The pieces' texts so far."""
        return [r.pieces[0].text for r in self.results]

    @property
    def done(self) -> bool:
        return self._ended and len(self.results) == self._begun

    def ready(self) -> bool:
        if self._ended:
            return True
        if self._pending is None:
            if not self.written.next_ready():
                return False
            source = self.written.next_piece()
            if source is None:
                return True
            self._pending = self.prepared.pending_utterance(source, written_label(self.written))
        return self._pending.ready()

    def next_run(self) -> "Utterance | None":
        if self._pending is None and not self._ended:
            source = self.written.next_piece()  # waits, when not ready
            if source is not None:
                self._pending = self.prepared.pending_utterance(source, written_label(self.written))
        if self._pending is None:
            self._ended = True
            return None
        run, self._pending = self._pending.utterance(), None
        self._begun += 1
        self._pieces.append((_ready(run), _RowStream(self.tts, run, self.chunk_frames, self.first_chunk)
                                           if self.stream else None))
        return run

    def frame(self, frame: np.ndarray | None) -> np.ndarray:
        empty = np.zeros(0, np.float32)
        run, row = self._pieces[0]
        if frame is None:
            self._pieces.popleft()
            # the text its speech read (the audio side reads no source: the frame loop's side does)
            run.request = replace(run.request, text=run.track.track.text)
        if self.stream:
            audio = row.frame(frame)
            out = [self._joiner.push(audio)] if audio.shape[0] else []
            if frame is None:
                self.results.append(run.finish(row.samples(), self.tts.sample_rate))
                self._joiner.end_piece()
            out = [a for a in out if a.shape[0]]
            return self._emit(np.concatenate(out) if len(out) > 1 else out[0] if out else empty)
        if frame is None:
            self.results.append(run.decode(self.tts.whole_decoder(), self.tts.sample_rate))
        return empty

    def finish(self) -> np.ndarray:
        if self.stream:
            return self._emit(self._joiner.finish())
        if not self.results:
            return np.zeros(0, np.float32)
        samples = (self.results[0].samples if len(self.results) == 1 else
                   join_pieces([r.samples for r in self.results], self.tts.sample_rate))
        return self._emit(samples)

    def result(self) -> SynthesisResult:
        if not self.done:
            raise KzttsError("the request's text has not been spoken to its end yet")
        if len(self.results) == 1:
            return self.results[0]
        samples = np.concatenate(self._out) if self._out else np.zeros(0, np.float32)
        return joined(self.results, samples, self.tts.sample_rate, self.started, self.first_audio)
