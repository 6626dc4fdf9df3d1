"""The 12 Hz speech tokenizer on ONNX Runtime: codes -> 24 kHz samples (whole or streamed), wav -> codes.

Decoding follows qwen-tts exactly (``Qwen3TTSTokenizerV2Model.decode``): the frames
are decoded in segments of 300 frames, each segment preceded by up to 25 frames of
left context whose samples are dropped (``chunked_decode(300, 25)``); every segment
starts from a fresh decoder (zero conv state, RoPE positions from 0). Inside a
segment the decoder is causal, so

* ``Decoder.decode`` runs the ``decoder`` graph once per segment, and
* ``StreamingDecoder.push`` runs the stateful ``decoder_stream`` graph on the
  frames as they arrive (any chunk sizes), carrying each causal conv's input tail,
  each ConvTranspose's last input and each transformer layer's last
  ``sliding_window - 1`` keys/values. 25 frames before a segment boundary it starts
  a second, fresh state on the same frames (their samples are discarded) and
  switches to it at the boundary, so it returns the samples ``Decoder.decode``
  returns for the same frames.

``chunk_size=None`` turns the segmentation off (one causal pass over everything).
"""
from __future__ import annotations

import queue
import threading
import time

import numpy as np
import onnxruntime as ort

from kztts.bundle.graphs import DECODER_LEFT_CONTEXT, DECODER_SEGMENT
from kztts.core.audio import resample
from kztts.core.errors import BundleError, KzttsError

SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 1920
NUM_QUANTIZERS = 16
CODEBOOK_SIZE = 2048
REFERENCE_CHUNK = DECODER_SEGMENT
REFERENCE_LEFT_CONTEXT = DECODER_LEFT_CONTEXT


def check_codes(codes, codebook_size: int = CODEBOOK_SIZE, num_quantizers: int = NUM_QUANTIZERS) -> np.ndarray:
    """Codes as a contiguous int64 [F, num_quantizers] array, or a KzttsError saying what is wrong."""
    arr = np.asarray(codes)
    if arr.ndim != 2 or arr.shape[1] != num_quantizers:
        raise KzttsError(f"codes must have shape [frames, {num_quantizers}], got {list(arr.shape)}")
    if arr.size and arr.dtype.kind not in "iu":
        raise KzttsError(f"codes must be integers, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= codebook_size):
        raise KzttsError(f"codes must be in 0..{codebook_size - 1}, got values {int(arr.min())}..{int(arr.max())}")
    return np.ascontiguousarray(arr, dtype=np.int64)


def decoder_codes(frames: int, codebook_size: int, seed: int = 0) -> np.ndarray:
    """``frames`` frames of seeded random codes [frames, 16]: what a check of a decoder's arithmetic feeds it (random
    codes exercise the whole codebooks)."""
    return np.random.default_rng(seed).integers(0, codebook_size, (frames, 16)).astype(np.int64)


def _segmentation(chunk_size, left_context) -> tuple[int | None, int]:
    if chunk_size is None:
        return None, 0
    chunk_size, left_context = int(chunk_size), int(left_context)
    if chunk_size <= 0 or not 0 <= left_context < chunk_size:
        raise ValueError(f"need chunk_size > 0 and 0 <= left_context < chunk_size "
                         f"(got {chunk_size}, {left_context})")
    return chunk_size, left_context


def decoder_kwargs(bundle, name: str, kw: dict) -> dict:
    """Segmentation and codebook size recorded with graph ``name``, unless given in ``kw``."""
    extra = _graph_extra(bundle, name)
    kw.setdefault("chunk_size", extra.get("reference_chunk", REFERENCE_CHUNK))
    kw.setdefault("left_context", extra.get("reference_left_context", REFERENCE_LEFT_CONTEXT))
    kw.setdefault("codebook_size", extra.get("codebook_size", CODEBOOK_SIZE))
    return kw


def _graph_extra(bundle, name: str) -> dict:
    spec = bundle.manifest.graphs.get(name)
    if spec is None:
        raise BundleError(f"{bundle.path}: the bundle has no {name!r} graph; re-export it")
    return spec.extra


def _zero_state(session: ort.InferenceSession) -> dict[str, np.ndarray]:
    """Zero tensors for the ``state_*`` inputs of a ``decoder_stream`` session."""
    inputs = session.get_inputs()
    names = [i.name for i in inputs]
    if names[:2] != ["codes", "position"] or not all(n.startswith("state_") for n in names[2:]):
        raise BundleError(f"not a decoder_stream graph: inputs {names[:4]}...; expected codes, position, state_*")
    zeros = {}
    for i in inputs[2:]:
        if not all(isinstance(d, int) for d in i.shape):
            raise BundleError(f"decoder_stream state {i.name} has a symbolic shape {i.shape}")
        zeros[i.name] = np.zeros(i.shape, dtype=np.float32)
    return zeros


# Frames per run when a whole utterance is decoded on the stateful decoder_stream graph. One run
# over a whole segment costs more per frame the longer the utterance (its activations grow with
# it and leave the caches): 0.6B decoder, 2 threads, one run 70.9 / 91.1 ms per frame at 60 / 150
# frames against 70.0 / 70.3 fed 16 frames at a time, and a peak RSS near 3.8 GB at 150 frames
# (benchmarks/decoder/bench_synth_decode.py, busy machine). Same samples up to float rounding (max
# 6.8e-6; ~3% of the 16-bit samples move by one step at 0.6B, none on the tiny model's 100).
FRAMES_PER_RUN = 16


class Decoder:
    """Codes [F, 16] -> float32 samples [F * 1920] at 24 kHz.

    Runs the ``decoder`` graph once per segment; given a ``decoder_stream`` session instead it
    streams each utterance through that graph ``frames_per_run`` frames at a time
    (``chunked_decode``; None: one run per segment from zero state). Same samples up to float
    rounding, one weight copy.
    """

    def __init__(self, session: ort.InferenceSession, *, chunk_size: int | None = REFERENCE_CHUNK,
                 left_context: int = REFERENCE_LEFT_CONTEXT, codebook_size: int = CODEBOOK_SIZE,
                 frames_per_run: int | None = FRAMES_PER_RUN):
        self.session = session
        self.chunk_size, self.left_context = _segmentation(chunk_size, left_context)
        self.codebook_size = int(codebook_size)
        stateful = len(session.get_inputs()) > 1
        self._zeros = _zero_state(session) if stateful else None
        self._stream = (StreamingDecoder(session, chunk_size=chunk_size, left_context=left_context,
                                         codebook_size=codebook_size)
                        if stateful and frames_per_run else None)
        self.frames_per_run = frames_per_run

    @classmethod
    def from_bundle(cls, bundle, **kw) -> "Decoder":
        return cls(bundle.session("decoder"), **decoder_kwargs(bundle, "decoder", kw))

    def _run(self, codes: np.ndarray) -> np.ndarray:
        feed = {"codes": codes[None]}
        if self._zeros is not None:
            feed.update(self._zeros, position=np.zeros(1, dtype=np.int64))
        return self.session.run(["wav"], feed)[0][0]

    def decode(self, codes) -> np.ndarray:
        if self._stream is not None:
            return chunked_decode(self._stream, codes, self.frames_per_run)
        codes = check_codes(codes, self.codebook_size)
        n = codes.shape[0]
        if n == 0:
            return np.zeros(0, dtype=np.float32)
        if self.chunk_size is None:
            return self._run(codes)
        pieces, start = [], 0
        while start < n:  # Qwen3TTSTokenizerV2Decoder.chunked_decode
            end = min(start + self.chunk_size, n)
            ctx = self.left_context if start - self.left_context > 0 else start
            wav = self._run(codes[start - ctx:end])
            pieces.append(wav[ctx * SAMPLES_PER_FRAME:])
            start = end
        return np.concatenate(pieces)


class _State:
    """One decode pass of the stream graph: its state tensors and next position."""

    def __init__(self, zeros: dict[str, np.ndarray]):
        self.tensors = dict(zeros)
        self.position = 0


class StreamingDecoder:
    """Feed frames as they are produced; get their samples back at once.

    ``push(codes [n, 16]) -> float32 [n * 1920]``. The concatenated output of any
    sequence of pushes equals ``Decoder.decode`` of all frames pushed (same
    ``chunk_size``/``left_context``). ``reset()`` starts a new utterance.
    """

    def __init__(self, session: ort.InferenceSession, *, chunk_size: int | None = REFERENCE_CHUNK,
                 left_context: int = REFERENCE_LEFT_CONTEXT, codebook_size: int = CODEBOOK_SIZE,
                 max_frames_per_run: int | None = None):
        self.session = session
        self.chunk_size, self.left_context = _segmentation(chunk_size, left_context)
        self.codebook_size = int(codebook_size)
        self.max_frames_per_run = max_frames_per_run
        self._zeros = _zero_state(session)
        self._out_names = ["wav"] + ["new_" + n for n in self._zeros]
        self.reset()

    @classmethod
    def from_bundle(cls, bundle, **kw) -> "StreamingDecoder":
        return cls(bundle.session("decoder_stream"), **decoder_kwargs(bundle, "decoder_stream", kw))

    def reset(self) -> None:
        self.frames = 0  # frames pushed since reset
        self._main = _State(self._zeros)
        self._next: _State | None = None  # warming up for the next segment

    def _run(self, state: _State, codes: np.ndarray) -> np.ndarray:
        feed = {"codes": codes[None], "position": np.array([state.position], dtype=np.int64), **state.tensors}
        out = self.session.run(self._out_names, feed)
        state.tensors = {name[4:]: t for name, t in zip(self._out_names[1:], out[1:])}
        state.position += codes.shape[0]
        return out[0][0]

    def _boundaries(self) -> tuple[int, int]:
        """(frame where the next segment's warm-up starts, frame where the next segment starts)."""
        nxt = (self.frames // self.chunk_size + 1) * self.chunk_size
        ctx = self.left_context if nxt - self.left_context > 0 else nxt
        return nxt - ctx, nxt

    def push(self, codes) -> np.ndarray:
        codes = check_codes(codes, self.codebook_size)
        out, i, n = [], 0, codes.shape[0]
        while i < n:
            m = n - i
            if self.chunk_size is not None:
                warm, nxt = self._boundaries()
                m = min(m, (warm if self.frames < warm else nxt) - self.frames)
            if self.max_frames_per_run:
                m = min(m, self.max_frames_per_run)
            piece = codes[i:i + m]
            out.append(self._run(self._main, piece))
            if self._next is not None:
                self._run(self._next, piece)  # warm-up only: qwen-tts drops these samples
            i += m
            self.frames += m
            if self.chunk_size is not None:
                if self.frames == warm:
                    self._next = _State(self._zeros)
                if self.frames == nxt:
                    self._main, self._next = (self._next or _State(self._zeros)), None
        if not out:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate(out)


def chunked_decode(stream: "StreamingDecoder", codes, frames_per_push: int) -> np.ndarray:
    """A whole utterance on the streaming decoder, ``frames_per_push`` frames per run (from a
    reset; reset again after): the samples ``Decoder.decode`` gives, up to float rounding."""
    codes = check_codes(codes, stream.codebook_size)
    stream.reset()
    try:
        out = [stream.push(codes[i:i + frames_per_push]) for i in range(0, codes.shape[0], frames_per_push)]
    finally:
        stream.reset()
    return np.concatenate(out) if out else np.zeros(0, np.float32)


class StaticChunkDecoder:
    """The speech decoder on a static graph of ``frames_per_run`` frames (``decoder_chunk``, for
    the HTP), with the ``Decoder`` and ``StreamingDecoder`` APIs.

    ``push`` buffers frames until whole runs are there and returns their samples (possibly
    none); ``flush`` ends the utterance: the last partial run is padded by repeating its last
    frame and only the real frames' samples are returned. The graph is causal, so frames
    after the real ones change none of their samples. Every segment boundary of the reference
    decode (``chunk_size``, ``chunk_size - left_context``) must be a multiple of the run."""

    def __init__(self, session: ort.InferenceSession, *, chunk_size: int | None = REFERENCE_CHUNK,
                 left_context: int = REFERENCE_LEFT_CONTEXT, codebook_size: int = CODEBOOK_SIZE):
        shape = next(a.shape for a in session.get_inputs() if a.name == "codes")
        if not isinstance(shape[1], int):
            raise BundleError(f"decoder_chunk: its codes input {shape} is not static; re-export the bundle")
        self.frames_per_run = int(shape[1])
        self.chunk_size, self.left_context = _segmentation(chunk_size, left_context)
        if self.chunk_size is not None and (self.chunk_size % self.frames_per_run
                                            or (self.chunk_size - self.left_context) % self.frames_per_run):
            raise BundleError(f"decoder_chunk runs {self.frames_per_run} frames, which does not divide the "
                              f"decoder's segments ({self.chunk_size} frames, {self.left_context} of left context); "
                              "export with a target whose shapes.decoder_chunk divides both")
        self._stream = StreamingDecoder(session, chunk_size=chunk_size, left_context=left_context,
                                        codebook_size=codebook_size, max_frames_per_run=self.frames_per_run)
        self.codebook_size = self._stream.codebook_size
        self._pending = np.zeros((0, NUM_QUANTIZERS), np.int64)

    def reset(self) -> None:
        self._stream.reset()
        self._pending = np.zeros((0, NUM_QUANTIZERS), np.int64)

    def push(self, codes) -> np.ndarray:
        codes = check_codes(codes, self.codebook_size)
        self._pending = np.concatenate([self._pending, codes])
        whole = self._pending.shape[0] // self.frames_per_run * self.frames_per_run
        ready, self._pending = self._pending[:whole], self._pending[whole:]
        return self._stream.push(ready) if whole else np.zeros(0, np.float32)

    def flush(self) -> np.ndarray:
        """The samples of the frames still buffered (the utterance ends: ``reset`` before the next)."""
        n = self._pending.shape[0]
        if n == 0:
            return np.zeros(0, np.float32)
        pad = np.repeat(self._pending[-1:], self.frames_per_run - n, axis=0)
        wav = self._stream.push(np.concatenate([self._pending, pad]))
        self._pending = self._pending[:0]
        return wav[:n * SAMPLES_PER_FRAME]

    def decode(self, codes) -> np.ndarray:
        self.reset()
        wav = np.concatenate([self.push(codes), self.flush()])
        self.reset()
        return wav


class BackgroundDecoder:
    """``decoder.push`` on one background thread, in submission order (a pipelined stream).

    ``submit(codes)`` returns at once; ``poll()`` returns the next finished output or None,
    ``wait()`` blocks for it. An exception raised in the thread is raised again by the
    ``poll``/``wait`` that reaches its job, in the caller's thread, and every later job
    fails with it too (the decoder state after a failed push is not trustworthy), so a
    caller never waits for a result that will not come. ``close()`` ends the thread
    after its current push. ``busy`` is the seconds spent in ``push``.
    """

    _STOP = object()

    def __init__(self, decoder, name: str = "kztts-decoder"):
        self.decoder = decoder
        self.pending = 0  # submitted, not yet returned by poll/wait
        self.busy = 0.0
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        failed: BaseException | None = None
        while True:
            codes = self._jobs.get()
            if codes is self._STOP:
                return
            if failed is None:
                t = time.perf_counter()
                try:
                    self._done.put((self.decoder.push(codes), None))
                except BaseException as exc:  # handed to the caller's thread, not lost with this one
                    failed = exc
                self.busy += time.perf_counter() - t
            if failed is not None:
                self._done.put((None, failed))

    def submit(self, codes: np.ndarray) -> None:
        if not self._thread.is_alive():
            raise KzttsError("the background decoder is closed")
        self._jobs.put(codes)
        self.pending += 1

    def _take(self, block: bool) -> np.ndarray | None:
        if not self.pending:
            return None
        while True:
            try:
                out, exc = self._done.get(timeout=0.5) if block else self._done.get_nowait()
                break
            except queue.Empty:
                if not block:
                    return None
                if not self._thread.is_alive():  # cannot happen unless the interpreter is stopping
                    raise KzttsError("the background decoder thread ended with work pending") from None
        self.pending -= 1
        if exc is not None:
            raise exc
        return out

    def poll(self) -> np.ndarray | None:
        """The next output if it is finished, else None."""
        return self._take(block=False)

    def wait(self) -> np.ndarray | None:
        """The next output (blocks); None when nothing is pending."""
        return self._take(block=True)

    def close(self) -> None:
        """Stop the thread once its current push (if any) ends; unreturned outputs are dropped."""
        self._jobs.put(self._STOP)
        if self._thread is not threading.current_thread():
            self._thread.join()


class Encoder:
    """Reference audio -> codes [F, 16] int64 (F = ceil(samples / 1920)), the ``encoder`` graph (ICL prompts)."""

    def __init__(self, session: ort.InferenceSession, sample_rate: int = SAMPLE_RATE):
        self.session = session
        self.sample_rate = int(sample_rate)

    @classmethod
    def from_bundle(cls, bundle, session=None) -> "Encoder":
        """The bundle's ``encoder`` (``session``: one already opened for it, e.g. by the plan)."""
        extra = _graph_extra(bundle, "encoder")
        return cls(session or bundle.session("encoder"), int(extra.get("sample_rate", SAMPLE_RATE)))

    def encode(self, wav, sr: int = SAMPLE_RATE) -> np.ndarray:
        """Codes of mono ``wav`` sampled at ``sr`` Hz (resampled to 24 kHz first, as qwen-tts does)."""
        wav = np.asarray(wav, dtype=np.float32)
        if wav.ndim == 2:  # [n, channels] -> mono, as qwen-tts does
            wav = wav.mean(axis=-1, dtype=np.float32)
        if wav.ndim != 1 or wav.size == 0:
            raise KzttsError(f"reference audio must be non-empty 1-D samples, got shape {list(wav.shape)}")
        if int(sr) != self.sample_rate:
            wav = resample(wav, int(sr), self.sample_rate)
        codes = self.session.run(["codes"], {"wav": np.ascontiguousarray(wav)[None]})[0][0]
        return np.ascontiguousarray(codes, dtype=np.int64)
