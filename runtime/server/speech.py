"""Speech engines: requests of ``POST /v1/audio/speech`` through the TTS's graphs.

``BatchedSpeech`` runs every request in a row of one ``kztts.tts.batch_loop.BatchLoop`` (continuous
batching over ``talker_batched`` / ``cp_frame_batched``): a request joins at the next frame, each of its
pieces (a long text) in turn in its row, and its audio is what ``TTS.stream`` (streamed) or
``TTS.synthesize`` (whole) gives it alone. The audio (a streaming decoder per request, or the
whole-utterance decode at its end) is made on a thread of its own while the next frame runs, so a long
decode never stalls the other rows' frames. ``SerialSpeech`` serves a bundle without batched graphs (or
a target/placement that runs other graphs) one request at a time, in arrival order, through
``TTS.stream`` / ``TTS.synthesize`` themselves.
"""
from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from kztts.core.errors import KzttsError
from kztts.runners.codec import SAMPLES_PER_FRAME
from kztts.server.errors import ApiError
from kztts.server.scheduler import Job
from kztts.tts.batch_loop import BatchedRequest, BatchLoop, WrittenRequest
from kztts.tts.prepared import PreparedSpeech
from kztts.tts.text.track import TextFeed
from kztts.tts.request import SynthesisRequest
from kztts.tts.result import SynthesisResult
from kztts.tts.tts import TTS

log = logging.getLogger(__name__)

TEXT_ENDED = object()  # the audio side's event after a written text's last piece (WrittenRequest.finish)
CHUNK_FRAMES = 4  # a streamed chunk: ``TTS.stream``'s default, so a stream equals ``kztts synth --stream``
FIRST_CAPACITY = 256  # KV positions per row to start with; the rows grow when a request needs more


@dataclass
class SpeechSpec:
    """What a speech job runs: the request, streamed or whole (in chunks of ``TTS.stream``'s sizes), and its
    prepared pieces (batched)."""

    request: SynthesisRequest
    stream: bool
    prepared: BatchedRequest | PreparedSpeech | None = None
    chunk_frames: int = CHUNK_FRAMES
    first_chunk: int = 1
    text: "TextFeed | None" = None  # a text still being written (the request's text is empty)


def summary(result: SynthesisResult) -> dict:
    return {"frames": result.frames, "audio_seconds": round(result.audio_seconds, 3),
            "pieces": len(result.pieces), "stopped_by_eos": result.stopped_by_eos, "truncated": bool(result.limits)}


class _AudioWorker:
    """The thread that turns frames into audio (``BatchedRequest.frame``: the streaming decoders, the
    whole-utterance decodes), in the order the frame loop made them, while the scheduler thread runs
    the next frame. The frame loop may run ``depth`` steps ahead of it, no more."""

    def __init__(self, depth: int = 2):
        self._queue: queue.Queue = queue.Queue()
        self._ahead = threading.Semaphore(depth)
        self._pending = 0  # events queued or being decoded
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="kztts-audio", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        with self._lock:
            return self._pending

    def begin_step(self) -> None:
        self._ahead.acquire()  # the audio side is ``depth`` steps behind: wait for it

    def submit(self, job: Job, frame: "np.ndarray | None | object") -> None:
        with self._lock:
            self._pending += 1
        self._queue.put((job, frame))

    def end_step(self) -> None:
        self._queue.put(None)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                self._ahead.release()
                continue
            try:
                self._audio(*item)
            finally:
                with self._lock:
                    self._pending -= 1

    @staticmethod
    def _audio(job: Job, frame: "np.ndarray | None | object") -> None:
        if job.finished or job.cancelled:
            return
        req: BatchedRequest = job.spec.prepared
        try:
            if frame is TEXT_ENDED:  # a written text's last piece has ended: its held-back end, then done
                audio = req.finish()
                if audio.shape[0]:
                    job.emit("audio", audio)
                job.emit("done", summary(req.result()))
                return
            audio = req.frame(frame)
            if audio.shape[0]:
                job.emit("audio", audio)
            if frame is None and req.done and not isinstance(req, WrittenRequest):
                job.emit("done", summary(req.result()))
        except KzttsError as exc:
            job.fail(ApiError(400, str(exc), code="invalid_value"))
        except Exception:
            log.exception("bug while decoding the audio of request %d; it ends with a 500", job.id)
            job.fail(ApiError(500, "internal error in kztts (the traceback is in the server log; please report it)",
                              code="internal_error"))


class BatchedSpeech:
    """Continuous batching of speech requests (``Engine``); the audio is made on a thread of its own."""

    unit = "frames"

    def __init__(self, tts: TTS, rows: int):
        self.tts = tts
        self.capacity = rows
        self.loop = BatchLoop(tts, rows, FIRST_CAPACITY)  # refuses a plan without the batched graphs
        self.running: list[Job] = []
        self.parked: list[Job] = []  # running jobs whose text has not come far enough to take their row
        self.text_came = threading.Event()  # set by the feeds of written requests
        self.wait_for_text = True  # sleep on the feeds when every running request waits for its text
        self.audio = _AudioWorker()
        self.mode = (f"continuous batching: up to {rows} requests share each frame "
                     "(talker_batched, cp_frame_batched; the audio decoded on a second thread)")

    @property
    def pending(self) -> int:
        """Frames and ends whose audio is not made yet."""
        return self.audio.pending

    def prepare(self, request: SynthesisRequest, stream: bool, chunk_frames: int = CHUNK_FRAMES,
                first_chunk: int = 1, text: "TextFeed | None" = None) -> SpeechSpec:
        """Check a request and cut its text into pieces (any thread: reads the bundle only). ``text``: a text still
        being written (then ``request.text`` is empty), spoken as it comes (``WrittenRequest``)."""
        if text is not None:
            text.on_write = self.text_came.set
            req = WrittenRequest(self.tts, request, text, stream=stream, chunk_frames=chunk_frames,
                                 first_chunk=first_chunk)
        else:
            req = BatchedRequest(self.tts, request, stream=stream, chunk_frames=chunk_frames, first_chunk=first_chunk)
        return SpeechSpec(request, stream, req, chunk_frames, first_chunk, text)

    def start(self, job: Job) -> None:
        self.running.append(job)
        self._next_piece(job)

    def _next_piece(self, job: Job) -> None:
        """The job's next piece takes its row now if its text has come, else the job is parked until it has."""
        req = job.spec.prepared
        if not req.ready():
            self.parked.append(job)
            return
        run = req.next_run()
        if run is not None:
            self.loop.join(job, run)
            return
        self.running.remove(job)  # its row is free; its audio is finished on the audio thread
        if isinstance(req, WrittenRequest):
            self.audio.submit(job, TEXT_ENDED)

    def step(self) -> int:
        made, ended = 0, []
        for job in list(self.parked):
            if job.spec.prepared.ready():
                self.parked.remove(job)
                self._next_piece(job)
        self.audio.begin_step()
        try:
            for job, frame in self.loop.step():
                self.audio.submit(job, frame)
                if frame is not None:
                    made += 1
                else:
                    ended.append(job)
        finally:
            self.audio.end_step()
        for job in ended:  # the request's next piece joins at the next frame, in its row (or waits for its text)
            self._next_piece(job)
        if self.wait_for_text and not made and not ended and (self.parked or self.loop.waiting):
            self.text_came.wait(0.05)  # every running request waits for its text: sleep until some comes
            self.text_came.clear()
        return made

    def waiting_for_text(self, job: Job) -> bool:
        """Whether ``job`` (a written request) could not make its last frame for want of text."""
        return job in self.parked or job in self.loop.sat_out

    def drop(self, job: Job) -> None:
        if job in self.parked:
            self.parked.remove(job)
        self.loop.leave({job})
        self.running.remove(job)
        req = job.spec.prepared
        if isinstance(req, WrittenRequest):
            req.written.close_source()

    def reset(self) -> None:
        self.running, self.parked = [], []
        self.loop = BatchLoop(self.tts, self.capacity, FIRST_CAPACITY)


class _Left(Exception):
    """The client of the running request left (raised inside ``TTS.synthesize`` to stop it)."""


class SerialSpeech:
    """One request at a time through ``TTS.stream`` / ``TTS.synthesize`` (``Engine``)."""

    unit = "frames"
    capacity = 1

    def __init__(self, tts: TTS, why: str):
        self.tts = tts
        self.running: list[Job] = []
        self._chunks: Iterator[np.ndarray] | None = None
        self.mode = f"one request at a time, in arrival order ({why})"

    def prepare(self, request: SynthesisRequest, stream: bool, chunk_frames: int = CHUNK_FRAMES,
                first_chunk: int = 1, text: "TextFeed | None" = None) -> SpeechSpec:
        # a request that cannot be spoken is refused before it waits
        prepared = PreparedSpeech(self.tts, request, written=text is not None)
        return SpeechSpec(request, stream, prepared, chunk_frames, first_chunk, text)

    def _run(self, job: Job) -> Iterator[np.ndarray]:
        spec: SpeechSpec = job.spec
        holder: dict = {}
        if spec.text is not None:  # a text still being written
            r = spec.request
            yield from self.tts.stream_text(spec.text, r.voice, result=holder, chunk_frames=spec.chunk_frames,
                                            first_chunk=spec.first_chunk, language=r.language, seed=r.seed,
                                            greedy=r.greedy, settings=r.settings, max_frames=r.max_frames,
                                            speaker=r.speaker, instruct=r.instruct)
            job.state = holder["result"]
            return
        if spec.stream:
            yield from self.tts.stream(spec.prepared, result=holder, chunk_frames=spec.chunk_frames,
                                       first_chunk=spec.first_chunk)
            result = holder["result"]
        else:
            def frame(_n: int) -> None:
                if job.cancelled:
                    raise _Left()
            result = self.tts.synthesize(spec.prepared, on_frame=frame)
            yield result.samples
        job.state = result

    def start(self, job: Job) -> None:
        self._chunks = self._run(job)
        self.running = [job]

    def step(self) -> int:
        job = self.running[0]
        try:
            audio = next(self._chunks)
        except StopIteration:
            self.running, self._chunks = [], None
            job.emit("done", summary(job.state))
            return 0
        except _Left:
            self.running, self._chunks = [], None
            return 0
        if audio.shape[0]:
            job.emit("audio", audio)
        return round(audio.shape[0] / SAMPLES_PER_FRAME)

    def drop(self, job: Job) -> None:
        if self._chunks is not None:
            self._chunks.close()
        self.running, self._chunks = [], None

    def reset(self) -> None:
        self.drop(None)


def open_speech_engine(tts: TTS, batch: int):
    """``BatchedSpeech`` where the plan runs the fused CPU graphs and the bundle has their batched forms,
    else ``SerialSpeech`` (the reason is in its ``mode``)."""
    try:
        return BatchedSpeech(tts, batch)
    except KzttsError as exc:
        return SerialSpeech(tts, f"no continuous batching: {exc}")
