"""``kztts.TTS``: text in, audio out, from a bundle (no torch)."""
from __future__ import annotations

import itertools
import logging
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from kztts.bundle.bundle import Bundle
from kztts.bundle.embeddings import EmbeddingTables
from kztts.bundle.sessions import SessionConfig
from kztts.core.call_lock import CallLock, one_call_at_a_time
from kztts.core.errors import BundleError, ContextOverflowError, KzttsError
from kztts.generation.sampling import XorShift32
from kztts.generation.settings import GenerationSettings, reference_settings, with_environment
from kztts.htp.placement import LayerPlacement
from kztts.htp.targets import Target
from kztts.plan.resolve import resolve_plan
from kztts.runners.codec import SAMPLES_PER_FRAME, BackgroundDecoder, Encoder, StaticChunkDecoder, StreamingDecoder
from kztts.runners.protocol import TalkerRunner
from kztts.runners.speaker import SpeakerEncoder, load_xvector
from kztts.runners.talker import DEFAULT_CONTEXT
from kztts.tts.audio_join import PieceJoiner, join_pieces
from kztts.tts.batch_loop import stream_many, synthesize_many
from kztts.tts.duration import FRAMES_PER_SECOND, expected_seconds, runaway_frames
from kztts.tts.frame_loop import FrameLoop, StageTimes
from kztts.tts.prompt import Prompt, build_prompt, language_id, prompt_length
from kztts.tts.request import SynthesisRequest, Voice
from kztts.tts.text import TextTokenizer, assistant_text
from kztts.tts.text_split import frames_per_token, split_text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Piece:
    """One utterance of a text (a long text is spoken in several): its text and how it ended."""

    text: str
    frames: int
    stopped_by_eos: bool
    limit: str | None = None  # the limit that stopped it before its end of speech (also logged)


@dataclass
class SynthesisResult:
    samples: np.ndarray  # float32 mono in [-1, 1]
    sample_rate: int
    codes: np.ndarray  # (frames, 16) int64, the pieces' frames one after the other
    times: StageTimes
    total_seconds: float
    stopped_by_eos: bool  # every piece ended at its end of speech
    pieces: list[Piece] = field(default_factory=list)
    fp16_saturations: int | None = None  # HTP graph calls over the guard threshold (None: not checked)

    @property
    def limits(self) -> list[str]:
        """What stopped a piece before its end of speech (empty when nothing was cut)."""
        return [p.limit for p in self.pieces if p.limit]

    @property
    def frames(self) -> int:
        return int(self.codes.shape[0])

    @property
    def audio_seconds(self) -> float:
        return self.samples.shape[0] / self.sample_rate

    @property
    def real_time_factor(self) -> float:
        """Processing seconds per second of audio (below 1 is faster than real time)."""
        return self.total_seconds / self.audio_seconds if self.audio_seconds else float("inf")

    def summary(self) -> dict:
        return {"frames": self.frames, "audio_seconds": round(self.audio_seconds, 3),
                "real_time_factor": round(self.real_time_factor, 3), "stopped_by_eos": self.stopped_by_eos,
                "ms": self.times.as_ms(), "total_ms": round(self.total_seconds * 1000, 1),
                "pieces": len(self.pieces), "truncated": bool(self.limits), "limits": self.limits,
                **({} if self.fp16_saturations is None else {"fp16_saturations": self.fp16_saturations})}


@dataclass
class _Run:
    """One synthesis in progress: its frame loop, prompt and the voice's ICL codes."""

    loop: FrameLoop
    prompt: Prompt
    request: SynthesisRequest
    started: float
    limited_by: str  # what sets loop.settings.max_frames: "max_frames", "expected duration" or "context"
    label: str = "the text"  # "piece 2/5" for a long text's pieces
    codes: list = field(default_factory=list)
    audio: list = field(default_factory=list)  # decoded chunks (pipelined stream)

    @property
    def voice(self) -> Voice:
        return self.request.voice

    @property
    def text(self) -> str:
        return self.request.text


class TTS:
    """A bundle ready to speak. ``synthesize`` returns everything; ``stream`` yields audio chunks.

    Threads: one ``TTS`` may be shared, but it runs one call at a time (``kztts.core.call_lock``): its
    runners keep KV caches, IO bindings and decoder history between runs, so ``synthesize``,
    ``generate_codes``, ``stream`` and ``voice_from_wav``/``voice_from_reference`` hold a lock, and a
    second thread waits for it. A ``stream`` holds it from its first chunk until it is exhausted or
    closed: a thread that keeps a stream open blocks the others (close it, or give each thread its
    own ``TTS`` for parallel work); in the stream's own thread a new call is refused meanwhile."""

    def __init__(self, bundle: str | Path | Bundle, *, cp_mode: str = "frame", context: int = DEFAULT_CONTEXT,
                 session_config: SessionConfig | None = None, target: "str | Path | Target | None" = None,
                 strict: bool = False, placement: "str | LayerPlacement | None" = None,
                 talker: TalkerRunner | None = None, pipeline: bool = False, attention: str | None = None):
        """Where each graph runs is decided once, by ``kztts.plan.resolve.resolve_plan`` (``self.plan``;
        ``print(tts.plan.table())`` shows it):
        ``target``: a qnn_configs target (name, file or ``kztts.htp.targets.Target``); the graphs its
        placement puts on the HTP run there (its static graphs, exported with ``kztts export --target``),
        the others on the CPU.
        ``placement``: where the Talker's layers run (a mode, or a file from ``kztts calibrate``;
        see ``kztts.htp.placement``), overriding the target's Talker placement; a placement that
        decodes on the CPU (``prefill-htp-decode-cpu``, ``all-cpu``) keeps the Code Predictor,
        which runs every frame, on the CPU as well. On a bundle exported with ``--segments``, a
        placement with HTP work runs the per-layer graphs, whose magnitude probes are checked on
        every call (``kztts.htp.saturation``: one warning, or an error when ``strict``; the count is
        ``SynthesisResult.fp16_saturations``). ``talker``: a Talker runner to use as is
        (a ``kztts.runners.protocol.TalkerRunner``; validation and calibration pass theirs).
        Without onnxruntime-qnn they fall back to the CPU EP with one warning, unless ``strict``.
        ``attention``: ``fused`` or ``plain`` CPU graphs (default ``$KZTTS_ATTENTION``, else fused).
        ``pipeline``: ``stream`` decodes on a background thread while the next frames are generated
        (same samples; give the decoder its own thread count, ``SessionConfig.decoder_threads``).
        Only the graphs used are opened: the Talker, the Code Predictor of ``cp_mode`` and one
        decoder graph (``decoder_stream``, which also serves ``synthesize``); the encoders on use."""
        self.bundle = bundle if isinstance(bundle, Bundle) else Bundle.open(bundle, session_config, load_graphs=False)
        self.pipeline = bool(pipeline)
        m = self.bundle.manifest
        if m.kind != "tts":  # an LM bundle (kztts.lm.lm)
            raise BundleError(f"{m.path}: a causal-LM bundle, not a TTS one; use `kztts generate` / `kztts chat`")
        self.tables = EmbeddingTables.from_bundle(self.bundle)
        self.tokenizer = TextTokenizer(self.bundle.path)
        self.plan = resolve_plan(self.bundle, target=target, placement=placement, strict=strict, cp_mode=cp_mode,
                                 attention=attention, check_saturation=True)
        self.target = self.plan.target
        log.info("%s", self.plan.table())
        try:
            self.talker = talker if talker is not None else self.plan.open_talker(context)
            self.code_predictor = self.plan.open_code_predictor(self.tables)
            self.plan.session(self.plan.decoder_graph())  # open (and check) it now, as the other graphs
        except BaseException:
            self.plan.close()  # HTP host processes started for the graphs opened so far
            raise
        self.sample_rate = int(m.data["config"].get("sample_rate", 24000))
        self.speaker_size = int(m.data["config"]["speaker_embedding_size"])
        self._decoder = None
        self._streaming = None
        self._speaker_encoder: SpeakerEncoder | None = None
        self._encoder: Encoder | None = None
        self._calls = CallLock("TTS")

    # ------------------------------------------------------------ voices
    def voice_from_xvector(self, path: str | Path) -> Voice:
        """A voice from a precomputed x-vector file (.npy, or raw little-endian float32)."""
        return Voice(load_xvector(path, self.speaker_size))

    @one_call_at_a_time
    def voice_from_wav(self, wav: np.ndarray, sr: int) -> Voice:
        """An x-vector voice from a recording (any sample rate)."""
        if self._speaker_encoder is None:
            self._speaker_encoder = self.plan.open_speaker_encoder()
        return Voice(self._speaker_encoder.xvector(wav, sr))

    @one_call_at_a_time
    def voice_from_reference(self, wav: np.ndarray, sr: int, ref_text: str) -> Voice:
        """An ICL voice: x-vector, the recording's codes and its transcript."""
        self.tokenizer.ref_ids(ref_text)  # reject an empty transcript before encoding audio
        if self._encoder is None:
            self._encoder = self.plan.open_speech_encoder()
        speaker = self.voice_from_wav(wav, sr).speaker
        return Voice(speaker, self._encoder.encode(wav, sr), ref_text)

    def default_settings(self) -> GenerationSettings:
        """The checkpoint's generation settings (as qwen-tts merges them), then $KZTTS_* overrides."""
        return with_environment(reference_settings(self.bundle.manifest.generation))

    # ------------------------------------------------------------ generation
    def prompt(self, text: str | SynthesisRequest, voice: Voice | None = None, **options) -> Prompt:
        """The Talker prompt a request is spoken from (prefill embeddings and trailing text), as
        qwen-tts builds it; benchmarks and validation teacher-force from it."""
        return self._prompt(SynthesisRequest.make(text, voice, options))

    def _prompt(self, r: SynthesisRequest) -> Prompt:
        ids = self.tokenizer.assistant_ids(r.text)
        voice = r.voice
        ref_ids = self.tokenizer.ref_ids(voice.ref_text) if voice.icl else None
        return build_prompt(self.tables, ids, special_ids=self.bundle.manifest.special_ids,
                            language_id=language_id(self.bundle.manifest.languages, r.language),
                            speaker=voice.speaker, mode="icl" if voice.icl else "xvector",
                            non_streaming=not r.streaming_text, ref_text_ids=ref_ids, ref_codes=voice.ref_codes)

    def _settings(self, r: SynthesisRequest) -> GenerationSettings:
        """The request's settings: its own or the checkpoint's, greedy and ``max_frames`` applied."""
        s = r.settings or self.default_settings()
        if r.greedy:
            s = s.greedy()
        if r.max_frames is not None:
            s = replace(s, max_frames=int(r.max_frames))
        return s.validate()

    def _start(self, r: SynthesisRequest) -> _Run:
        started = time.perf_counter()
        if not isinstance(r.voice, Voice):
            raise KzttsError("a voice is required: the Base model clones one (use voice_from_xvector, "
                             "voice_from_wav or voice_from_reference)")
        s = self._settings(r)
        prompt = self._prompt(r)
        needed = prompt.embeds.shape[0] + s.max_frames - 1
        if prompt.embeds.shape[0] > self.talker.context:
            raise ContextOverflowError(
                f"the text is too long: its prompt takes {prompt.embeds.shape[0]} positions, the context holds "
                f"{self.talker.context}; split the text into shorter pieces")
        limited_by = "max_frames"
        if r.max_frames is None and runaway_frames(r.text, r.language) < s.max_frames:
            # no cap asked for: a model that fails to stop ends at 3x the text's expected duration
            s = replace(s, max_frames=runaway_frames(r.text, r.language))
            needed = prompt.embeds.shape[0] + s.max_frames - 1
            limited_by = "expected duration"
        if needed > self.talker.context:
            s = replace(s, max_frames=self.talker.context - prompt.embeds.shape[0] + 1)
            limited_by = "context"  # said (warning, result.limits) only if it cuts the speech: _limit
            log.info("max frames lowered to %d to fit the context of %d", s.max_frames, self.talker.context)
        loop = FrameLoop(self.talker, self.code_predictor, self.tables, s,
                         int(self.bundle.manifest.special_ids["codec_eos"]), XorShift32(r.seed))
        loop.times.prompt = time.perf_counter() - started
        return _Run(loop, prompt, r, started, limited_by)

    def _streaming_decoder(self):
        if self._streaming is None:
            self._streaming = self.plan.open_streaming_decoder()
        return self._streaming

    def _full_decoder(self):
        """The whole-utterance decoder, on the graph the stream uses (one copy of the weights)."""
        if self._decoder is None:
            self._decoder = self.plan.open_decoder()
        return self._decoder

    @one_call_at_a_time
    def stream(self, text: str | SynthesisRequest, voice: Voice | None = None, *, chunk_frames: int = 4,
               result: dict | None = None, pipeline: bool | None = None, **options) -> Iterator[np.ndarray]:
        """Yield float32 audio chunks (``chunk_frames`` frames each, the last may be shorter) as
        frames are produced. ``text``, ``voice`` and ``options`` (language, seed, greedy, settings,
        max_frames, streaming_text) make a :class:`SynthesisRequest`, or pass one instead.
        If ``result`` is a dict it receives the SynthesisResult at the end.
        ``pipeline`` (default: the constructor's) decodes each chunk on a background thread while
        the next frames are generated; the samples are the same, a chunk is yielded once decoded.
        A text longer than one context is streamed piece by piece (``pieces``)."""
        if chunk_frames < 1:
            raise KzttsError(f"chunk_frames must be >= 1, got {chunk_frames}")
        request = SynthesisRequest.make(text, voice, options)
        texts = self.pieces(request)
        if len(texts) > 1:
            yield from self._stream_pieces(texts, request, chunk_frames, result, pipeline)
            return
        yield from self._stream_run(self._start(request), chunk_frames, result, pipeline)

    def _stream_run(self, run: _Run, chunk_frames: int, result: dict | None,
                    pipeline: bool | None) -> Iterator[np.ndarray]:
        """``stream`` of one utterance (one piece)."""
        dec = self._streaming_decoder()
        dec.reset()
        if self.pipeline if pipeline is None else pipeline:
            if isinstance(dec, StaticChunkDecoder):
                raise KzttsError(f"the pipelined stream decodes on a CPU thread, but target {self.target.name} "
                                 "places the decoder on the HTP; stream without --pipeline")
            yield from self._stream_pipelined(run, dec, chunk_frames)
            if result is not None:
                samples = np.concatenate(run.audio) if run.audio else np.zeros(0, np.float32)
                result["result"] = self._result(run, samples)
            return
        times = run.loop.times
        skip = 0  # samples of the ICL reference, which qwen-tts decodes in front and cuts
        if run.voice.icl:
            t = time.perf_counter()
            skip = run.voice.ref_codes.shape[0] * SAMPLES_PER_FRAME - dec.push(run.voice.ref_codes).shape[0]
            times.decoder += time.perf_counter() - t
        pending: list[np.ndarray] = []
        chunks: list[np.ndarray] = []

        def decoded(audio: np.ndarray) -> np.ndarray:
            nonlocal skip
            cut = min(skip, audio.shape[0])
            skip -= cut
            audio = audio[cut:]
            if audio.shape[0] and times.first_audio is None:
                times.first_audio = time.perf_counter() - run.started
            chunks.append(audio)
            return audio

        def flush() -> np.ndarray:
            t = time.perf_counter()
            audio = dec.push(np.stack(pending))
            times.decoder += time.perf_counter() - t
            pending.clear()
            return decoded(audio)

        for frame in run.loop.frames(run.prompt):
            run.codes.append(frame)
            pending.append(frame)
            if len(pending) == chunk_frames:
                audio = flush()
                if audio.shape[0]:
                    yield audio
        if pending:
            audio = flush()
            if audio.shape[0]:
                yield audio
        if isinstance(dec, StaticChunkDecoder):  # the frames of a last, partial static run
            t = time.perf_counter()
            audio = decoded(dec.flush())
            times.decoder += time.perf_counter() - t
            if audio.shape[0]:
                yield audio
        if result is not None:
            samples = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
            result["result"] = self._result(run, samples)

    def _stream_pipelined(self, run: _Run, dec: StreamingDecoder, chunk_frames: int) -> Iterator[np.ndarray]:
        """``stream`` with ``dec.push`` on a background thread; decoded chunks go to ``run.audio``.

        The first chunk is waited for (time to first audio); later ones are yielded when a
        poll after a frame finds them done, and all remaining ones at the end."""
        times = run.loop.times
        worker = BackgroundDecoder(dec)
        skip = 0
        try:
            if run.voice.icl:  # qwen-tts decodes [ref codes ++ codes]; their samples are dropped
                worker.submit(run.voice.ref_codes)
                skip = 1

            def finished(block: bool) -> Iterator[np.ndarray]:
                nonlocal skip
                while worker.pending:
                    out = worker.wait() if block else worker.poll()
                    if out is None:
                        return
                    if skip:
                        skip -= 1
                        continue
                    if times.first_audio is None:
                        times.first_audio = time.perf_counter() - run.started
                    run.audio.append(out)
                    yield out

            pending: list[np.ndarray] = []
            for frame in run.loop.frames(run.prompt):
                run.codes.append(frame)
                pending.append(frame)
                if len(pending) == chunk_frames:
                    worker.submit(np.stack(pending))
                    pending = []
                    yield from finished(block=not run.audio)  # the first chunk: as soon as possible
                else:
                    yield from finished(block=False)
            if pending:
                worker.submit(np.stack(pending))
            yield from finished(block=True)
        finally:
            worker.close()
            times.decoder += worker.busy

    @one_call_at_a_time
    def generate_codes(self, text: str | SynthesisRequest, voice: Voice | None = None, **options) -> np.ndarray:
        """The frames only ([F, 16] int64), no audio decoding (calibration, code comparisons); one
        utterance, never split; a cut by the context is a warning (``max_frames`` is the caller's own
        choice here: calibration and comparisons ask for a fixed number of frames)."""
        run = self._start(SynthesisRequest.make(text, voice, options))
        run.codes.extend(run.loop.frames(run.prompt))
        limit = self._limit(run)
        if limit and run.limited_by == "context":
            log.warning("%s", limit)
        return np.array(run.codes, dtype=np.int64).reshape(-1, 16)

    @one_call_at_a_time
    def synthesize(self, text: str | SynthesisRequest, voice: Voice | None = None, *,
                   on_frame: Callable[[int], object] | None = None, **options) -> SynthesisResult:
        """Generate all frames, then decode them (the reference's chunked decode). ``text``,
        ``voice`` and ``options`` (language, seed, greedy, settings, max_frames, streaming_text)
        make a :class:`SynthesisRequest`, or pass one instead.

        For ICL voices the reference codes are decoded in front of the new ones and
        their samples dropped, as qwen-tts does; kztts drops exactly ``ref frames * 1920``
        samples, where qwen-tts's proportional cut can keep one more sample through
        float rounding. ``on_frame(index)`` is called after each frame (progress).

        A text longer than one context is spoken in pieces (``pieces``; ``result.pieces``), each
        as its own ``synthesize`` call would, their audio joined by ``kztts.tts.audio_join``."""
        request = SynthesisRequest.make(text, voice, options)
        texts = self.pieces(request)
        if len(texts) > 1:
            return self._synthesize_pieces(texts, request, on_frame)
        return self._synthesize_run(self._start(request), on_frame)

    def _synthesize_run(self, run: _Run, on_frame) -> SynthesisResult:
        """``synthesize`` of one utterance (one piece)."""
        for frame in run.loop.frames(run.prompt):
            run.codes.append(frame)
            if on_frame is not None:
                on_frame(len(run.codes))
        return self._decoded_result(run)

    def _decoded_result(self, run: _Run) -> SynthesisResult:
        """The result of a run whose frames are all in ``run.codes``: the whole-utterance decode."""
        decoder = self._full_decoder()
        t = time.perf_counter()
        codes = np.array(run.codes, dtype=np.int64).reshape(-1, 16)
        if run.voice.icl:
            ref = run.voice.ref_codes
            samples = decoder.decode(np.concatenate([ref, codes]))[ref.shape[0] * SAMPLES_PER_FRAME:]
        else:
            samples = decoder.decode(codes) if len(codes) else np.zeros(0, np.float32)
        run.loop.times.decoder += time.perf_counter() - t
        run.loop.times.first_audio = time.perf_counter() - run.started
        return self._result(run, samples)

    @one_call_at_a_time
    def synthesize_many(self, requests: list, *, batch: int = 4) -> list[SynthesisResult]:
        """``synthesize`` of each request (a :class:`SynthesisRequest` or a dict of its fields), ``batch`` at a time
        through the batched graphs (continuous batching, ``kztts.tts.batch_loop``); each result equals
        that request's ``synthesize`` alone (bit for bit with fp32 weights; int8/int4 weights may differ
        in the last bits, see docs/DESIGN.md "Continuous batching"). Results in request order."""
        return synthesize_many(self, requests, batch)

    @one_call_at_a_time
    def stream_many(self, requests: list, *, batch: int = 4, chunk_frames: int = 4,
                    results: dict | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(request index, audio chunk)`` as each request's chunks are ready (its chunks are
        those of its ``stream`` alone); ``results`` receives each ``SynthesisResult`` by index."""
        yield from stream_many(self, requests, batch, chunk_frames, results)

    def _result(self, run: _Run, samples: np.ndarray) -> SynthesisResult:
        codes = np.array(run.codes, dtype=np.int64).reshape(-1, 16)
        piece = Piece(run.text, codes.shape[0], run.loop.stopped_by_eos, self._limit(run))
        if piece.limit:
            log.warning("%s", piece.limit)
        guard = getattr(self.talker, "guard", None)  # kztts.htp.saturation: probes of the HTP layer graphs
        return SynthesisResult(samples.astype(np.float32, copy=False), self.sample_rate, codes, run.loop.times,
                               time.perf_counter() - run.started, run.loop.stopped_by_eos, pieces=[piece],
                               fp16_saturations=None if guard is None else guard.count)

    # ------------------------------------------------------------ long text
    def pieces(self, text: str | SynthesisRequest, voice: Voice | None = None, **options) -> list[str]:
        """The utterances ``synthesize``/``stream`` speak a request's text in: ``[text]`` itself when its
        prompt plus the frames it is expected to need fit in the Talker's context, else pieces cut
        at sentence, clause, word, then character boundaries (``kztts.tts.text_split``) that each do.

        Expected frames: ``kztts.tts.text_split.frames_per_token`` (an upper estimate for the language)
        times the text tokens, at most the utterance's ``max_frames``; the bound is
        ``prompt + frames - 1 <= context``."""
        r = SynthesisRequest.make(text, voice, options)
        text, voice, language = r.text, r.voice, r.language
        if not isinstance(voice, Voice) or not isinstance(text, str) or not text.strip():
            return [text]  # _start rejects it with its usual message
        s = r.settings or self.default_settings()
        frames_cap = int(r.max_frames) if r.max_frames is not None else s.max_frames
        language_tag = language_id(self.bundle.manifest.languages, language) is not None
        ref_text = len(self.tokenizer.ref_body(self.tokenizer.ref_ids(voice.ref_text))) if voice.icl else 0
        ref_frames = voice.ref_codes.shape[0] if voice.icl else 0
        rate = frames_per_token(language, text)
        context = self.talker.context

        def needed(tokens: int) -> int:
            positions = prompt_length(tokens, language=language_tag, speaker=True, mode="icl" if voice.icl else
                                      "xvector", non_streaming=not r.streaming_text, ref_text_tokens=ref_text,
                                      ref_frames=ref_frames)
            return positions + min(math.ceil(rate * tokens), frames_cap) - 1

        tokens = self._text_tokens(text)
        if needed(tokens) <= context:
            return [text]
        if needed(1) > context:
            raise ContextOverflowError(
                f"the Talker's context of {context} positions cannot hold the prompt and the frames of even one "
                f"text token ({needed(1)} positions); use a shorter reference recording or a larger context")
        lo, hi = 1, tokens  # the most tokens a piece may have: needed() only grows with tokens
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if needed(mid) <= context else (lo, mid - 1)
        texts = split_text(text, lo, self._text_tokens)
        log.info("text of %d tokens spoken in %d pieces of at most %d tokens (%.1f frames per token expected, "
                 "context %d)", tokens, len(texts), lo, rate, context)
        return texts

    def _text_tokens(self, text: str) -> int:
        """Text tokens of ``text`` in its prompt (``ids[3:-5]`` of the assistant template)."""
        return len(self.tokenizer.text_body(self.tokenizer.encode(assistant_text(text)))) if text else 0

    def _limit(self, run: _Run) -> str | None:
        """What cut the utterance before its end of speech, or None. A stop at ``max_frames`` that
        the EOS could not have preceded (``max_frames <= min_new_tokens``) is what was asked for."""
        s = run.loop.settings
        if run.loop.stopped_by_eos or len(run.codes) < s.max_frames or s.max_frames <= s.min_new_tokens:
            return None
        head = f"{run.label} ({run.text[:40]!r}{'...' if len(run.text) > 40 else ''})"
        if run.limited_by == "context":
            return (f"{head} stopped at {s.max_frames} frames before its end of speech: the Talker's context of "
                    f"{self.talker.context} positions holds its {run.prompt.embeds.shape[0]}-position prompt and no "
                    f"more frames; the rest of its text may be unspoken")
        if run.limited_by == "expected duration":
            expected = expected_seconds(run.text, run.request.language)
            return (f"{head} stopped at {s.max_frames} frames ({s.max_frames / FRAMES_PER_SECOND:.1f} s of audio; "
                    f"its text is expected to take {expected:.1f} s) before its end of speech: the model did not "
                    f"stop by itself; give max_frames (--max-frames) to allow more")
        return f"{head} stopped at max_frames={s.max_frames} before its end of speech"

    def _synthesize_pieces(self, texts: list[str], request: SynthesisRequest, on_frame) -> SynthesisResult:
        """``synthesize`` of each piece (same voice, settings and seed), the audio joined."""
        started = time.perf_counter()
        results: list[SynthesisResult] = []
        for i, text in enumerate(texts):
            run = self._start(replace(request, text=text))
            run.label = f"piece {i + 1}/{len(texts)}"
            done = sum(r.frames for r in results)
            results.append(self._synthesize_run(run, None if on_frame is None else
                                                lambda n, done=done: on_frame(done + n)))
        samples = join_pieces([r.samples for r in results], self.sample_rate)
        return self._joined(results, samples, started, time.perf_counter() - started)

    def _stream_pieces(self, texts: list[str], request: SynthesisRequest, chunk_frames: int, result: dict | None,
                       pipeline: bool | None) -> Iterator[np.ndarray]:
        """``stream`` of each piece in turn (same voice, settings and seed), joined as it goes."""
        started = time.perf_counter()
        joiner = PieceJoiner(self.sample_rate, len(texts))
        results: list[SynthesisResult] = []
        chunks: list[np.ndarray] = []
        first_audio = None
        for i, text in enumerate(texts):
            run = self._start(replace(request, text=text))
            run.label = f"piece {i + 1}/{len(texts)}"
            holder: dict = {}
            # None after the piece's chunks: its faded end and the silence
            for chunk in itertools.chain(self._stream_run(run, chunk_frames, holder, pipeline), [None]):
                audio = joiner.end_piece() if chunk is None else joiner.push(chunk)
                if audio.shape[0]:
                    if first_audio is None:
                        first_audio = time.perf_counter() - started
                    chunks.append(audio)
                    yield audio
            results.append(holder["result"])
        if result is not None:
            samples = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
            result["result"] = self._joined(results, samples, started, first_audio)

    def _joined(self, results: list[SynthesisResult], samples: np.ndarray, started: float,
                first_audio: float | None) -> SynthesisResult:
        """One result for a text spoken in pieces: their codes in order, their stage times summed."""
        times = StageTimes(first_audio=first_audio)
        for r in results:
            for name in ("prompt", "talker", "code_predictor", "decoder"):
                setattr(times, name, getattr(times, name) + getattr(r.times, name))
        codes = np.concatenate([r.codes for r in results])
        counts = [r.fp16_saturations for r in results if r.fp16_saturations is not None]
        return SynthesisResult(samples, self.sample_rate, codes, times, time.perf_counter() - started,
                               all(r.stopped_by_eos for r in results), pieces=[p for r in results for p in r.pieces],
                               fp16_saturations=sum(counts) if counts else None)
