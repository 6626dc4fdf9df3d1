"""``kztts.TTS``: text in, audio out, from a bundle (no torch). The front door: the bundle and its plan
opened once, voices, a request turned into a run (prompt, settings, frame loop), and the ways to speak
it: whole (``synthesize``), streamed (``stream``, ``kztts.tts.streaming``), a text longer than one
context in pieces (``kztts.tts.long_text``), many requests batched (``kztts.tts.batch_loop``)."""
from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable, Iterator

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
from kztts.runners.codec import SAMPLES_PER_FRAME, Encoder, StaticChunkDecoder
from kztts.runners.protocol import TalkerRunner
from kztts.runners.speaker import SpeakerEncoder, load_xvector
from kztts.runners.talker import DEFAULT_CONTEXT
from kztts.tts.batch_loop import stream_many, synthesize_many
from kztts.tts.duration import runaway_frames
from kztts.tts.frame_loop import FrameLoop
from kztts.tts.long_text import split_for_context, stream_pieces, synthesize_pieces
from kztts.tts.model_kind import ModelKind
from kztts.tts.prompt import Prompt, build_prompt, build_track_prompt, speaker_language_id
from kztts.tts.request import SynthesisRequest, Voice
from kztts.tts.result import Run, SynthesisResult
from kztts.tts.streaming import chunk_sizes, stream_audio
from kztts.tts.text import TextTokenizer
from kztts.tts.text_track import DualTrack, TextTrack
from kztts.tts.voice_file import load_voice, save_voice
from kztts.tts.voice_prefix import VoicePrefixes

log = logging.getLogger(__name__)

# What ``TTS.warm_up`` speaks: a sentence of common length, so the prefill's arenas fit most prompts
WARM_UP_TEXT = "This short sentence warms up every graph before the first request arrives."


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
                 talker: TalkerRunner | None = None, pipeline: bool = False, attention: str | None = None,
                 voice_prefix: bool = False):
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
        ``voice_prefix``: keep each voice's prompt prefix in the Talker's cache between runs
        (``kztts.tts.voice_prefix``; the dynamic CPU Talker only). Off by default: the prompt is then
        prefilled in two runs, which int4/int8 kernels round differently from one (greedy codes of the
        random-weight 0.6B int4 bundle diverged; benchmarks/ttfa), while fp32 gave identical logits.
        Only the graphs used are opened: the Talker, the Code Predictor of ``cp_mode`` and one
        decoder graph (``decoder_stream``, which also serves ``synthesize``); the encoders on use."""
        self.bundle = bundle if isinstance(bundle, Bundle) else Bundle.open(bundle, session_config, load_graphs=False)
        self.pipeline = bool(pipeline)
        m = self.bundle.manifest
        if m.kind != "tts":  # an LM bundle (kztts.lm.lm)
            raise BundleError(f"{m.path}: a causal-LM bundle, not a TTS one; use `kztts generate` / `kztts chat`")
        self.kind = ModelKind.of(m)  # what its requests may hold: a voice, a preset speaker, an instruction
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
        self.voice_prefixes = (VoicePrefixes(self.talker) if voice_prefix and VoicePrefixes.supports(self.talker)
                               else None)

    # ------------------------------------------------------------ voices
    def voice_from_speaker(self, name: str) -> Voice:
        """A CustomVoice bundle's preset speaker (case-insensitive; ``kztts inspect`` lists them)."""
        speaker = self.kind.speaker(name)
        return Voice(np.array(self.tables.codec([speaker.id])[0], dtype=np.float32), preset=speaker.name)

    def voice_from_file(self, path: str | Path) -> Voice:
        """A saved voice (``kztts voice create``, ``save_voice``), checked against this bundle; no encoder runs."""
        return load_voice(path, self.bundle.manifest)

    def save_voice(self, voice: Voice, path: str | Path) -> Path:
        """Write ``voice`` (from ``voice_from_wav`` or ``voice_from_reference``) to ``path`` (``kztts.tts.voice_file``)."""
        return save_voice(path, voice, self.bundle.manifest)

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

    # ------------------------------------------------------------ a request becomes a run
    def prompt(self, text: str | SynthesisRequest, voice: Voice | None = None, **options) -> Prompt:
        """The Talker prompt a request is spoken from (prefill embeddings and trailing text), as
        qwen-tts builds it; benchmarks and validation teacher-force from it."""
        return self._prompt(SynthesisRequest.make(text, voice, options))

    def _voice(self, r: SynthesisRequest) -> Voice | None:
        """Who speaks ``r`` (checked against the bundle's kind): its voice, its preset speaker's, or None."""
        self.kind.check(r)
        return self.voice_from_speaker(r.speaker) if r.speaker is not None else r.voice

    def _language_id(self, r: SynthesisRequest, voice: Voice | None) -> int | None:
        """The codec language id of the prompt (a dialect speaker's for Chinese or auto, as qwen-tts)."""
        dialect = self.kind.speaker(voice.preset).dialect if voice is not None and voice.preset else None
        return speaker_language_id(self.bundle.manifest.languages, r.language, dialect)

    def _prompt(self, r: SynthesisRequest) -> Prompt:
        voice = self._voice(r)
        ids = self.tokenizer.assistant_ids(r.text)
        icl = voice is not None and voice.icl
        ref_ids = self.tokenizer.ref_ids(voice.ref_text) if icl else None
        instruct_ids = self.tokenizer.instruct_ids(r.instruct) if r.instruct else None
        return build_prompt(self.tables, ids, special_ids=self.bundle.manifest.special_ids,
                            language_id=self._language_id(r, voice), speaker=None if voice is None else voice.speaker,
                            mode="icl" if icl else "xvector", non_streaming=not r.streaming_text,
                            ref_text_ids=ref_ids, ref_codes=voice.ref_codes if icl else None,
                            instruct_ids=instruct_ids)

    def _settings(self, r: SynthesisRequest) -> GenerationSettings:
        """The request's settings: its own or the checkpoint's, greedy and ``max_frames`` applied."""
        s = r.settings or self.default_settings()
        if r.greedy:
            s = s.greedy()
        if r.max_frames is not None:
            s = replace(s, max_frames=int(r.max_frames))
        return s.validate()

    def _start(self, r: SynthesisRequest, label: str = "the text") -> Run:
        """One utterance ready to run: its prompt, its settings with the frame cap that fits, its frame loop."""
        started = time.perf_counter()
        self.kind.check(r)
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
            limited_by = "context"  # said (warning, result.limits) only if it cuts the speech: Run.limit
            log.info("max frames lowered to %d to fit the context of %d", s.max_frames, self.talker.context)
        loop = FrameLoop(self.talker, self.code_predictor, self.tables, s,
                         int(self.bundle.manifest.special_ids["codec_eos"]), XorShift32(r.seed),
                         prefixes=self.voice_prefixes)
        loop.times.prompt = time.perf_counter() - started
        return Run(loop, prompt, r, started, limited_by, label)

    def _start_track(self, r: SynthesisRequest, pieces: Iterable[str]) -> Run:
        """``_start`` for a text still arriving (``stream_text``): the prompt waits for the text its prefill
        holds, and the frame cap from the text's expected duration is decided as the text arrives."""
        started = time.perf_counter()
        voice = self._voice(r)
        s = self._settings(r)
        track = TextTrack(self.tokenizer, pieces)
        icl = voice is not None and voice.icl
        dual = DualTrack(self.tables, track, self.tokenizer.ref_body(self.tokenizer.ref_ids(voice.ref_text))
                         if icl else None)
        instruct_ids = self.tokenizer.instruct_ids(r.instruct) if r.instruct else None
        prompt = build_track_prompt(self.tables, dual, special_ids=self.bundle.manifest.special_ids,
                                    language_id=self._language_id(r, voice),
                                    speaker=None if voice is None else voice.speaker,
                                    mode="icl" if icl else "xvector", ref_codes=voice.ref_codes if icl else None,
                                    instruct_ids=instruct_ids)
        if prompt.embeds.shape[0] > self.talker.context:
            raise ContextOverflowError(
                f"the prompt takes {prompt.embeds.shape[0]} positions, the context holds {self.talker.context}; "
                "use a shorter reference recording")
        fit = self.talker.context - prompt.embeds.shape[0] + 1
        limited_by = "max_frames"
        if fit < s.max_frames:
            s = replace(s, max_frames=fit)
            limited_by = "context"
        capped = None
        if r.max_frames is None:  # a model that fails to stop ends at 3x the text's expected duration
            capped = _DurationCap(track, r.language)
        loop = FrameLoop(self.talker, self.code_predictor, self.tables, s,
                         int(self.bundle.manifest.special_ids["codec_eos"]), XorShift32(r.seed),
                         prefixes=self.voice_prefixes, capped=capped)
        loop.times.prompt = time.perf_counter() - started
        return Run(loop, prompt, r, started, limited_by, "the text", track=dual)

    def pieces(self, text: str | SynthesisRequest, voice: Voice | None = None, **options) -> list[str]:
        """The utterances ``synthesize``/``stream`` speak a request's text in: ``[text]`` itself when its
        prompt plus the frames it is expected to need fit in the Talker's context, else pieces cut
        at sentence, clause, word, then character boundaries (``kztts.tts.text_split``) that each do.

        Expected frames: ``kztts.tts.text_split.frames_per_token`` (an upper estimate for the language)
        times the text tokens, at most the utterance's ``max_frames``; the bound is
        ``prompt + frames - 1 <= context``."""
        r = SynthesisRequest.make(text, voice, options)
        who = self._voice(r)
        if not isinstance(r.text, str) or not r.text.strip():
            return [r.text]  # _start rejects it with its usual message
        s = r.settings or self.default_settings()
        max_frames = int(r.max_frames) if r.max_frames is not None else s.max_frames
        language_tag = self._language_id(r, who) is not None
        instruct_tokens = len(self.tokenizer.instruct_ids(r.instruct)) if r.instruct else 0
        return split_for_context(r, who, max_frames, tokenizer=self.tokenizer, language_tag=language_tag,
                                 context=self.talker.context, instruct_tokens=instruct_tokens)

    # ------------------------------------------------------------ decoders, opened on first use
    def _streaming_decoder(self):
        if self._streaming is None:
            self._streaming = self.plan.open_streaming_decoder()
        return self._streaming

    def _full_decoder(self):
        """The whole-utterance decoder, on the graph the stream uses (one copy of the weights)."""
        if self._decoder is None:
            self._decoder = self.plan.open_decoder()
        return self._decoder

    # ------------------------------------------------------------ speaking
    @one_call_at_a_time
    def generate_codes(self, text: str | SynthesisRequest, voice: Voice | None = None, **options) -> np.ndarray:
        """The frames only ([F, 16] int64), no audio decoding (calibration, code comparisons); one
        utterance, never split; a cut by the context is a warning (``max_frames`` is the caller's own
        choice here: calibration and comparisons ask for a fixed number of frames)."""
        run = self._start(SynthesisRequest.make(text, voice, options))
        run.codes.extend(run.loop.frames(run.prompt))
        limit = run.limit()
        if limit and run.limited_by == "context":
            log.warning("%s", limit)
        return run.code_array()

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
            return synthesize_pieces(self, texts, request, on_frame)
        return self._synthesize_run(self._start(request), on_frame)

    def _synthesize_run(self, run: Run, on_frame) -> SynthesisResult:
        """``synthesize`` of one utterance (one piece)."""
        for frame in run.loop.frames(run.prompt):
            run.codes.append(frame)
            if on_frame is not None:
                on_frame(len(run.codes))
        return self._decoded_result(run)

    def _decoded_result(self, run: Run) -> SynthesisResult:
        """The result of a run whose frames are all in ``run.codes``: the whole-utterance decode."""
        decoder = self._full_decoder()
        t = time.perf_counter()
        codes = run.code_array()
        ref = run.reference_codes
        if ref is not None:
            samples = decoder.decode(np.concatenate([ref, codes]))[ref.shape[0] * SAMPLES_PER_FRAME:]
        else:
            samples = decoder.decode(codes) if len(codes) else np.zeros(0, np.float32)
        run.loop.times.decoder += time.perf_counter() - t
        run.loop.times.first_audio = time.perf_counter() - run.started
        return self._result(run, samples)

    def _result(self, run: Run, samples: np.ndarray) -> SynthesisResult:
        """``run``'s result; a limit that cut it short is logged (one warning per utterance)."""
        result = run.result(samples, self.sample_rate)
        if result.pieces[0].limit:
            log.warning("%s", result.pieces[0].limit)
        return result

    @one_call_at_a_time
    def stream(self, text: str | SynthesisRequest, voice: Voice | None = None, *, chunk_frames: int = 4,
               first_chunk: int = 1, result: dict | None = None, pipeline: bool | None = None,
               **options) -> Iterator[np.ndarray]:
        """Yield float32 audio chunks as frames are produced: ``first_chunk`` frames, then twice as many
        each time up to ``chunk_frames`` (1, 2, 4, 4, ...; the last may be shorter), so the first
        audio waits for one frame; ``first_chunk=chunk_frames`` gives equal chunks. The chunking
        changes no code and the samples only by float rounding. ``text``, ``voice`` and ``options`` (language, seed, greedy, settings,
        max_frames, streaming_text) make a :class:`SynthesisRequest`, or pass one instead.
        If ``result`` is a dict it receives the SynthesisResult at the end.
        ``pipeline`` (default: the constructor's) decodes each chunk on a background thread while
        the next frames are generated; the samples are the same, a chunk is yielded once decoded.
        A text longer than one context is streamed piece by piece (``pieces``)."""
        chunk_sizes(first_chunk, chunk_frames)  # checks both
        request = SynthesisRequest.make(text, voice, options)
        texts = self.pieces(request)
        if len(texts) > 1:
            yield from stream_pieces(self, texts, request, chunk_frames, result, pipeline, first_chunk)
            return
        yield from self._stream_run(self._start(request), chunk_frames, result, pipeline, first_chunk)

    def _stream_run(self, run: Run, chunk_frames: int, result: dict | None,
                    pipeline: bool | None, first_chunk: int = 1) -> Iterator[np.ndarray]:
        """``stream`` of one utterance (one piece)."""
        dec = self._streaming_decoder()
        dec.reset()
        pipelined = self.pipeline if pipeline is None else pipeline
        if pipelined and isinstance(dec, StaticChunkDecoder):
            raise KzttsError(f"the pipelined stream decodes on a CPU thread, but target {self.target.name} "
                             "places the decoder on the HTP; stream without --pipeline")
        yield from stream_audio(run, dec, chunk_frames, pipelined=pipelined, first_chunk=first_chunk)
        if result is not None:
            samples = np.concatenate(run.audio) if run.audio else np.zeros(0, np.float32)
            result["result"] = self._result(run, samples)

    @one_call_at_a_time
    def stream_text(self, pieces: Iterable[str], voice: Voice | None = None, *, chunk_frames: int = 4,
                    first_chunk: int = 1, result: dict | None = None, pipeline: bool | None = None,
                    **options) -> Iterator[np.ndarray]:
        """Speak a text while it is written: ``pieces`` is any iterable of text pieces of any size (an LM's
        tokens, characters, lines), pulled as the frames need them; audio chunks are yielded as ``stream``
        yields them. Qwen3-TTS's streaming text mode reads one text token per frame: the speech starts once
        the first token is known, and a frame whose token has not arrived waits for it (``kztts.tts.text_track``).
        The codes and samples equal ``synthesize(whole_text, streaming_text=True)`` (and ``stream``'s) however
        the text was cut and however slowly it came. ``options`` are ``stream``'s but ``text``; a failing source
        ends the speech after the audio of the frames it allowed, with one ``TextSourceError``."""
        chunk_sizes(first_chunk, chunk_frames)  # checks both
        if options.get("streaming_text") is False:
            raise KzttsError("stream_text speaks in the streaming text mode (streaming_text=True); "
                             "for the other mode, give the whole text to synthesize or stream")
        options["streaming_text"] = True
        request = SynthesisRequest.make("", voice, options)
        self.kind.check(request)
        run = self._start_track(request, pieces)
        try:
            yield from self._stream_run(run, chunk_frames, None, pipeline, first_chunk)
        finally:
            run.request = replace(run.request, text=run.track.track.text)
        if isinstance(run.loop.capped, _DurationCap) and run.loop.capped.stopped:
            run.limited_by = "expected duration"
        if result is not None:
            samples = np.concatenate(run.audio) if run.audio else np.zeros(0, np.float32)
            result["result"] = self._result(run, samples)

    def warm_up(self, voice: Voice | None = None, *, language: str | None = None, frames: int = 2) -> float:
        """Run every graph a stream runs once, before the first request: ONNX Runtime sizes its memory
        arenas and prepares its kernels on a session's first runs, which otherwise land in the first
        request's time to first audio. With ``voice``, its prompt prefix is kept too
        (``voice_prefix``). No result is kept; the decoder starts afresh at the next stream.
        Returns the seconds it took."""
        started = time.perf_counter()
        if voice is None and self.kind.speakers:  # CustomVoice: a preset speaker, as its requests name one
            voice = self.voice_from_speaker(next(iter(self.kind.speakers)))
        elif voice is None and self.kind.kind == "base":  # VoiceDesign takes no voice: the instruction is optional
            voice = Voice(np.zeros(self.speaker_size, np.float32))
        settings = replace(self.default_settings().greedy(), min_new_tokens=frames)
        for _ in self.stream(WARM_UP_TEXT, voice, language=language, settings=settings, max_frames=frames,
                             first_chunk=1, chunk_frames=max(1, frames - 1)):
            pass
        took = time.perf_counter() - started
        log.info("warmed up in %.0f ms", took * 1e3)
        return took

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


class _DurationCap:
    """The frame cap of a text still arriving whose caller set none: 3x its expected duration
    (``kztts.tts.duration.runaway_frames``), decided only once the text known so far allows more frames
    or the text has ended, so that it equals the whole text's cap."""

    def __init__(self, track: TextTrack, language: str | None):
        self.track, self.language = track, language
        self._known = (-1, 0)  # (characters, cap) of the text known when last computed
        self.stopped = False

    def __call__(self, n: int) -> bool:
        while True:
            if self._known[0] != len(self.track.text):
                self._known = (len(self.track.text), runaway_frames(self.track.text, self.language))
            if self._known[1] > n:
                return False
            if self.track.closed:
                self.stopped = True
                return True
            self.track._pull()
