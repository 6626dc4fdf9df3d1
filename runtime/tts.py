"""``kztts.TTS``: text in, audio out, from a bundle (no torch)."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

import numpy as np

from kztts.bundle import Bundle
from kztts.call_lock import CallLock, one_call_at_a_time
from kztts.codec import SAMPLES_PER_FRAME, BackgroundDecoder, Encoder, StaticChunkDecoder, StreamingDecoder
from kztts.embeddings import EmbeddingTables
from kztts.errors import ContextOverflowError, KzttsError
from kztts.frames import FrameLoop, StageTimes
from kztts.prompt import Prompt, build_prompt, language_id
from kztts.sampling import XorShift32
from kztts.sessions import SessionConfig
from kztts.settings import GenerationSettings, reference_settings, with_environment
from kztts.speaker import SpeakerEncoder, load_xvector
from kztts.placement import LayerPlacement
from kztts.plan import resolve_plan
from kztts.talker import DEFAULT_CONTEXT
from kztts.text import TextTokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Voice:
    """Who speaks: an x-vector, plus reference codes and transcript for ICL voice cloning."""

    speaker: np.ndarray  # x-vector f32[enc_dim]
    ref_codes: np.ndarray | None = None  # [F_ref, 16] int64 (ICL)
    ref_text: str | None = None  # transcript of the reference audio (ICL)

    @property
    def icl(self) -> bool:
        return self.ref_codes is not None


@dataclass
class SynthesisResult:
    samples: np.ndarray  # float32 mono in [-1, 1]
    sample_rate: int
    codes: np.ndarray  # (frames, 16) int64
    times: StageTimes
    total_seconds: float
    stopped_by_eos: bool
    fp16_saturations: int | None = None  # HTP graph calls over the guard threshold (None: not checked)

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
                **({} if self.fp16_saturations is None else {"fp16_saturations": self.fp16_saturations})}


@dataclass
class _Run:
    """One synthesis in progress: its frame loop, prompt and the voice's ICL codes."""

    loop: FrameLoop
    prompt: Prompt
    voice: Voice
    started: float
    codes: list = field(default_factory=list)
    audio: list = field(default_factory=list)  # decoded chunks (pipelined stream)


class TTS:
    """A bundle ready to speak. ``synthesize`` returns everything; ``stream`` yields audio chunks.

    Threads: one ``TTS`` may be shared, but it runs one call at a time (``kztts.call_lock``): its
    runners keep KV caches, IO bindings and decoder history between runs, so ``synthesize``,
    ``generate_codes``, ``stream`` and ``voice_from_wav``/``voice_from_reference`` hold a lock, and a
    second thread waits for it. A ``stream`` holds it from its first chunk until it is exhausted or
    closed: a thread that keeps a stream open blocks the others (close it, or give each thread its
    own ``TTS`` for parallel work); in the stream's own thread a new call is refused meanwhile."""

    def __init__(self, bundle: str | Path | Bundle, *, cp_mode: str = "frame", context: int = DEFAULT_CONTEXT,
                 session_config: SessionConfig | None = None, target: str | None = None, strict: bool = False,
                 placement: "str | LayerPlacement | None" = None, talker=None, pipeline: bool = False,
                 attention: str | None = None):
        """Where each graph runs is decided once, by ``kztts.plan.resolve_plan`` (``self.plan``;
        ``print(tts.plan.table())`` shows it):
        ``target``: a qnn_configs target; the graphs its placement puts on the HTP run there
        (its static graphs, exported with ``kztts export --target``), the others on the CPU.
        ``placement``: where the Talker's layers run (a mode, or a file from ``kztts calibrate``;
        see ``kztts.placement``), overriding the target's Talker placement; a placement that
        decodes on the CPU (``prefill-htp-decode-cpu``, ``all-cpu``) keeps the Code Predictor,
        which runs every frame, on the CPU as well. On a bundle exported with ``--segments``, a
        placement with HTP work runs the per-layer graphs, whose magnitude probes are checked on
        every call (``kztts.saturation``: one warning, or an error when ``strict``; the count is
        ``SynthesisResult.fp16_saturations``). ``talker``: a Talker runner to use as is
        (any object with the ``kztts.talker.Talker`` API; validation and calibration pass theirs).
        Without onnxruntime-qnn they fall back to the CPU EP with one warning, unless ``strict``.
        ``attention``: ``fused`` or ``plain`` CPU graphs (default ``$KZTTS_ATTENTION``, else fused).
        ``pipeline``: ``stream`` decodes on a background thread while the next frames are generated
        (same samples; give the decoder its own thread count, ``SessionConfig.decoder_threads``).
        Only the graphs used are opened: the Talker, the Code Predictor of ``cp_mode`` and one
        decoder graph (``decoder_stream``, which also serves ``synthesize``); the encoders on use."""
        self.bundle = bundle if isinstance(bundle, Bundle) else Bundle.open(bundle, session_config, load_graphs=False)
        self.pipeline = bool(pipeline)
        m = self.bundle.manifest
        self.tables = EmbeddingTables.from_bundle(self.bundle)
        self.tokenizer = TextTokenizer(self.bundle.path)
        self.plan = resolve_plan(self.bundle, target=target, placement=placement, strict=strict, cp_mode=cp_mode,
                                 attention=attention, check_saturation=True)
        self.target = self.plan.target
        log.info("%s", self.plan.table())
        self.talker = talker if talker is not None else self.plan.open_talker(context)
        self.code_predictor = self.plan.open_code_predictor(self.tables)
        self.sample_rate = int(m.data["config"].get("sample_rate", 24000))
        self.speaker_size = int(m.data["config"]["speaker_embedding_size"])
        self._decoder = None
        self._streaming = None
        self.plan.session(self.plan.decoder_graph())  # open (and check) it now, as the other graphs
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
    def _prompt(self, text: str, voice: Voice, language: str | None, streaming_text: bool) -> Prompt:
        ids = self.tokenizer.assistant_ids(text)
        ref_ids = self.tokenizer.ref_ids(voice.ref_text) if voice.icl else None
        return build_prompt(self.tables, ids, special_ids=self.bundle.manifest.special_ids,
                            language_id=language_id(self.bundle.manifest.languages, language),
                            speaker=voice.speaker, mode="icl" if voice.icl else "xvector",
                            non_streaming=not streaming_text, ref_text_ids=ref_ids, ref_codes=voice.ref_codes)

    def _start(self, text: str, voice: Voice, language: str | None, streaming_text: bool, seed: int,
               greedy: bool, max_frames: int | None, settings: GenerationSettings | None) -> _Run:
        started = time.perf_counter()
        if not isinstance(voice, Voice):
            raise KzttsError("a voice is required: the Base model clones one (use voice_from_xvector, "
                             "voice_from_wav or voice_from_reference)")
        s = settings or self.default_settings()
        if greedy:
            s = s.greedy()
        if max_frames is not None:
            s = replace(s, max_frames=int(max_frames))
        s.validate()
        prompt = self._prompt(text, voice, language, streaming_text)
        needed = prompt.embeds.shape[0] + s.max_frames - 1
        if prompt.embeds.shape[0] > self.talker.context:
            raise ContextOverflowError(
                f"the text is too long: its prompt takes {prompt.embeds.shape[0]} positions, the context holds "
                f"{self.talker.context}; split the text into shorter pieces")
        if needed > self.talker.context:
            s = replace(s, max_frames=self.talker.context - prompt.embeds.shape[0] + 1)
            log.info("max frames lowered to %d to fit the context of %d", s.max_frames, self.talker.context)
        loop = FrameLoop(self.talker, self.code_predictor, self.tables, s,
                         int(self.bundle.manifest.special_ids["codec_eos"]), XorShift32(seed))
        loop.times.prompt = time.perf_counter() - started
        return _Run(loop, prompt, voice, started)

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
    def stream(self, text: str, voice: Voice, *, language: str | None = None, streaming_text: bool = False,
               seed: int = 0, greedy: bool = False, max_frames: int | None = None,
               settings: GenerationSettings | None = None, chunk_frames: int = 4,
               result: dict | None = None, pipeline: bool | None = None) -> Iterator[np.ndarray]:
        """Yield float32 audio chunks (``chunk_frames`` frames each, the last may be shorter) as
        frames are produced. If ``result`` is a dict it receives the SynthesisResult at the end.
        ``pipeline`` (default: the constructor's) decodes each chunk on a background thread while
        the next frames are generated; the samples are the same, a chunk is yielded once decoded."""
        if chunk_frames < 1:
            raise KzttsError(f"chunk_frames must be >= 1, got {chunk_frames}")
        run = self._start(text, voice, language, streaming_text, seed, greedy, max_frames, settings)
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
    def generate_codes(self, text: str, voice: Voice, *, language: str | None = None, streaming_text: bool = False,
                       seed: int = 0, greedy: bool = False, max_frames: int | None = None,
                       settings: GenerationSettings | None = None) -> np.ndarray:
        """The frames only ([F, 16] int64), no audio decoding (calibration, code comparisons)."""
        run = self._start(text, voice, language, streaming_text, seed, greedy, max_frames, settings)
        codes = list(run.loop.frames(run.prompt))
        return np.array(codes, dtype=np.int64).reshape(-1, 16)

    @one_call_at_a_time
    def synthesize(self, text: str, voice: Voice, *, language: str | None = None, streaming_text: bool = False,
                   seed: int = 0, greedy: bool = False, max_frames: int | None = None,
                   settings: GenerationSettings | None = None, on_frame=None) -> SynthesisResult:
        """Generate all frames, then decode them (the reference's chunked decode).

        For ICL voices the reference codes are decoded in front of the new ones and
        their samples dropped, as qwen-tts does; kztts drops exactly ``ref frames * 1920``
        samples, where qwen-tts's proportional cut can keep one more sample through
        float rounding. ``on_frame(index)`` is called after each frame (progress)."""
        run = self._start(text, voice, language, streaming_text, seed, greedy, max_frames, settings)
        for frame in run.loop.frames(run.prompt):
            run.codes.append(frame)
            if on_frame is not None:
                on_frame(len(run.codes))
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

    def _result(self, run: _Run, samples: np.ndarray) -> SynthesisResult:
        codes = np.array(run.codes, dtype=np.int64).reshape(-1, 16)
        guard = getattr(self.talker, "guard", None)  # kztts.saturation: probes of the HTP layer graphs
        return SynthesisResult(samples.astype(np.float32, copy=False), self.sample_rate, codes, run.loop.times,
                               time.perf_counter() - run.started, run.loop.stopped_by_eos,
                               None if guard is None else guard.count)
