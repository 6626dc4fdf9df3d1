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
from kztts.bundle.manifest import BUILTIN_VOICE_KEY
from kztts.bundle.sessions import SessionConfig
from kztts.core.audio import synthetic_voice
from kztts.core.call_lock import CallLock, one_call_at_a_time
from kztts.core.errors import BundleError, KzttsError
from kztts.generation.settings import GenerationSettings, reference_settings, with_environment
from kztts.htp.placement import LayerPlacement
from kztts.htp.targets import Target
from kztts.plan.resolve import resolve_plan, warn_unvalidated
from kztts.runners.codec import Encoder, StaticChunkDecoder
from kztts.runners.protocol import TalkerRunner
from kztts.runners.speaker import SpeakerEncoder, load_xvector
from kztts.runners.talker import DEFAULT_CONTEXT
from kztts.tts.audio_join import OpenJoiner
from kztts.tts.batch_loop import stream_many, synthesize_many
from kztts.tts.long_text import stream_pieces, synthesize_pieces
from kztts.tts.model_kind import KindError, ModelKind
from kztts.tts.prepared import PreparedSpeech, as_prepared
from kztts.tts.prompt import Prompt
from kztts.tts.request import SynthesisRequest, Voice
from kztts.tts.result import SynthesisResult, joined
from kztts.tts.text.track import TextSourceError
from kztts.tts.streaming import chunk_sizes, stream_audio
from kztts.tts.text.tokenizer import TextTokenizer
from kztts.tts.utterance import Utterance
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
        warn_unvalidated(self.plan)
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
        self._default: tuple[Voice | None] | None = None  # default_voice(), once computed
        self.voice_prefixes = (VoicePrefixes(self.talker) if voice_prefix and VoicePrefixes.supports(self.talker)
                               else None)

    # ------------------------------------------------------------ voices
    def voice_from_speaker(self, name: str) -> Voice:
        """A CustomVoice bundle's preset speaker (case-insensitive; ``kztts inspect`` lists them)."""
        speaker = self.kind.speaker(name)
        return Voice(np.array(self.tables.codec([speaker.id])[0], dtype=np.float32), preset=speaker.name)

    def default_voice(self) -> Voice | None:
        """Who speaks a request that names no one: the one rule every route applies (``synthesize``, ``stream``,
        ``stream_text``, ``kztts synth`` and ``--file``, ``chat --speak``, the server's ``default`` voice). Base: the
        built-in voice, the x-vector of ``kztts.core.audio.synthetic_voice()`` (the demo's voice); CustomVoice: its
        first preset speaker (``ModelKind.default_speaker``); VoiceDesign: None, the instruction (optional) makes
        the voice. Computed once."""
        if self._default is None:
            if self.kind.kind == "custom_voice":
                voice = self.voice_from_speaker(self.kind.default_speaker)
            elif self.kind.kind == "base" and BUILTIN_VOICE_KEY in self.bundle.manifest.data:
                # a device bundle keeps the built-in voice's x-vector, not the encoder that made it (kztts pack)
                stored = self.bundle.manifest.data[BUILTIN_VOICE_KEY]
                voice = Voice(load_xvector(self.bundle.path / stored["file"], self.speaker_size))
            elif self.kind.kind == "base":
                try:
                    voice = self.voice_from_wav(synthetic_voice(), 24000)
                except BundleError as exc:  # no speaker encoder: no built-in voice
                    raise KindError(f"{exc}; or give a voice that needs no encoder: a saved voice (--voice F.voice) "
                                    "or an x-vector (--xvector F)", "voice") from None
            else:
                voice = None
            self._default = (voice,)
        return self._default[0]

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

    # ------------------------------------------------------------ a request, checked once
    def prepare(self, text: str | SynthesisRequest, voice: Voice | None = None, **options) -> PreparedSpeech:
        """A request checked against this bundle (one line naming what is wrong), its text tokenized and cut
        into the pieces that fit one Talker context (``kztts.tts.prepared``). Every speaking method takes one
        in place of the text; a server prepares a request when it arrives and speaks it when its turn comes."""
        return PreparedSpeech(self, SynthesisRequest.make(text, voice, options))

    def prompt(self, text: str | SynthesisRequest, voice: Voice | None = None, **options) -> Prompt:
        """The Talker prompt a request is spoken from (prefill embeddings and trailing text), as
        qwen-tts builds it, for its whole text; benchmarks and validation teacher-force from it."""
        return self.prepare(text, voice, **options).prompt()

    def pieces(self, text: str | SynthesisRequest, voice: Voice | None = None, **options) -> list[str]:
        """The utterances ``synthesize``/``stream`` speak a request's text in: ``[text]`` itself when its
        prompt plus the frames it is expected to need fit in the Talker's context, else pieces cut
        at sentence, clause, word, then character boundaries (``kztts.tts.text.split``) that each do
        (``PreparedSpeech``)."""
        return list(as_prepared(self, text, voice, options).texts)

    # ------------------------------------------------------------ decoders, opened on first use
    def streaming_decoder(self):
        """The stateful decoder ``stream`` pushes frames through (``decoder_stream``, or the HTP's chunks)."""
        if self._streaming is None:
            self._streaming = self.plan.open_streaming_decoder()
        return self._streaming

    def whole_decoder(self):
        """The whole-utterance decoder, on the graph the stream uses (one copy of the weights)."""
        if self._decoder is None:
            self._decoder = self.plan.open_decoder()
        return self._decoder

    # ------------------------------------------------------------ speaking
    @one_call_at_a_time
    def generate_codes(self, text: str | SynthesisRequest | PreparedSpeech, voice: Voice | None = None,
                       **options) -> np.ndarray:
        """The frames only ([F, 16] int64), no audio decoding (calibration, code comparisons); one
        utterance, never split; a cut by the context is a warning (``max_frames`` is the caller's own
        choice here: calibration and comparisons ask for a fixed number of frames)."""
        prepared = as_prepared(self, text, voice, options)
        prepared.texts = [prepared.request.text]  # one utterance, however long
        utterance = prepared.utterance(0)
        for _ in utterance.frames():
            pass
        limit = utterance.limit()
        if limit and utterance.limited_by == "context":
            log.warning("%s", limit)
        return utterance.code_array()

    @one_call_at_a_time
    def synthesize(self, text: str | SynthesisRequest | PreparedSpeech, voice: Voice | None = None, *,
                   on_frame: Callable[[int], object] | None = None, **options) -> SynthesisResult:
        """Generate all frames, then decode them (the reference's chunked decode). ``text``,
        ``voice`` and ``options`` (language, seed, greedy, settings, max_frames, streaming_text)
        make a :class:`SynthesisRequest`, or pass one (or a ``prepare``d one) instead.

        For ICL voices the reference codes are decoded in front of the new ones and
        their samples dropped, as qwen-tts does; kztts drops exactly ``ref frames * 1920``
        samples, where qwen-tts's proportional cut can keep one more sample through
        float rounding. ``on_frame(index)`` is called after each frame (progress).

        A text longer than one context is spoken in pieces (``pieces``; ``result.pieces``), each
        as its own ``synthesize`` call would, their audio joined by ``kztts.tts.audio_join``."""
        prepared = as_prepared(self, text, voice, options)
        if len(prepared.texts) > 1:
            return synthesize_pieces(self, prepared, on_frame)
        return self.speak_whole(prepared.utterance(0), on_frame)

    def speak_whole(self, utterance: Utterance, on_frame: Callable[[int], object] | None = None) -> SynthesisResult:
        """All of ``utterance``'s frames, then their whole-utterance decode."""
        for frame in utterance.frames():
            if on_frame is not None:
                on_frame(len(utterance.codes))
        return utterance.decode(self.whole_decoder(), self.sample_rate)

    @one_call_at_a_time
    def stream(self, text: str | SynthesisRequest | PreparedSpeech, voice: Voice | None = None, *,
               chunk_frames: int = 4, first_chunk: int = 1, result: dict | None = None,
               pipeline: bool | None = None, **options) -> Iterator[np.ndarray]:
        """Yield float32 audio chunks as frames are produced: ``first_chunk`` frames, then twice as many
        each time up to ``chunk_frames`` (1, 2, 4, 4, ...; the last may be shorter), so the first
        audio waits for one frame; ``first_chunk=chunk_frames`` gives equal chunks. The chunking
        changes no code and the samples only by float rounding. ``text``, ``voice`` and ``options`` (language, seed, greedy, settings,
        max_frames, streaming_text) make a :class:`SynthesisRequest`, or pass one (or a ``prepare``d one) instead.
        If ``result`` is a dict it receives the SynthesisResult at the end.
        ``pipeline`` (default: the constructor's) decodes each chunk on a background thread while
        the next frames are generated; the samples are the same, a chunk is yielded once decoded.
        A text longer than one context is streamed piece by piece (``pieces``)."""
        chunk_sizes(first_chunk, chunk_frames)  # checks both
        prepared = as_prepared(self, text, voice, options)
        if len(prepared.texts) > 1:
            yield from stream_pieces(self, prepared, chunk_frames, result, pipeline, first_chunk)
            return
        yield from self.speak_streamed(prepared.utterance(0), chunk_frames, result, pipeline, first_chunk)

    def speak_streamed(self, utterance: Utterance, chunk_frames: int = 4, result: dict | None = None,
                       pipeline: bool | None = None, first_chunk: int = 1) -> Iterator[np.ndarray]:
        """``utterance``'s audio chunks as its frames are produced (``stream``); ``result`` (a dict) receives its
        ``SynthesisResult`` at the end."""
        dec = self.streaming_decoder()
        dec.reset()
        pipelined = self.pipeline if pipeline is None else pipeline
        if pipelined and isinstance(dec, StaticChunkDecoder):
            raise KzttsError(f"the pipelined stream decodes on a CPU thread, but target {self.target.name} "
                             "places the decoder on the HTP; stream without --pipeline")
        yield from stream_audio(utterance, dec, chunk_frames, pipelined=pipelined, first_chunk=first_chunk)
        if result is not None:
            result["result"] = utterance.finish(utterance.streamed_samples(), self.sample_rate)

    @one_call_at_a_time
    def stream_text(self, pieces: Iterable[str], voice: Voice | None = None, *, chunk_frames: int = 4,
                    first_chunk: int = 1, result: dict | None = None, pipeline: bool | None = None,
                    **options) -> Iterator[np.ndarray]:
        """Speak a text while it is written: ``pieces`` is any iterable of text pieces of any size (an LM's
        tokens, characters, lines), pulled as the frames need them; audio chunks are yielded as ``stream``
        yields them. Qwen3-TTS's streaming text mode reads one text token per frame: the speech starts once
        the first token is known, and a frame whose token has not arrived waits for it (``kztts.tts.text.track``).
        The codes and samples equal ``synthesize(whole_text, streaming_text=True)`` (and ``stream``'s) however
        the text was cut and however slowly it came. ``options`` are ``stream``'s but ``text``; a failing source
        ends the speech after the audio of the frames it allowed, with one ``TextSourceError``."""
        chunk_sizes(first_chunk, chunk_frames)  # checks both
        if options.get("streaming_text") is False:
            raise KzttsError("stream_text speaks in the streaming text mode (streaming_text=True); "
                             "for the other mode, give the whole text to synthesize or stream")
        options["streaming_text"] = True
        prepared = PreparedSpeech(self, SynthesisRequest.make("", voice, options), written=True)
        started = time.perf_counter()
        joiner = OpenJoiner(self.sample_rate)  # a long text's pieces, joined as synthesize joins them
        results: list[SynthesisResult] = []
        out: list[np.ndarray] = []
        first_audio = None
        try:
            for utterance in prepared.written_utterances(pieces, guess=True):
                for chunk in self.speak_streamed(utterance, chunk_frames, None, pipeline, first_chunk):
                    audio = joiner.push(chunk)
                    if audio.shape[0]:
                        first_audio = first_audio or time.perf_counter() - started
                        out.append(audio)
                        yield audio
                utterance.request = replace(utterance.request, text=utterance.piece_text())
                results.append(utterance.finish(utterance.streamed_samples(), self.sample_rate))
                joiner.end_piece()
        except TextSourceError:
            tail = joiner.finish()  # the audio made so far, all of it, then the error
            if tail.shape[0]:
                yield tail
            raise
        tail = joiner.finish()
        if tail.shape[0]:
            out.append(tail)
            yield tail
        if result is not None:
            samples = np.concatenate(out) if out else np.zeros(0, np.float32)
            result["result"] = (results[0] if len(results) == 1 else
                                joined(results, samples, self.sample_rate, started, first_audio))

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
    def synthesize_many(self, requests: list, *, batch: int = 4, names: list[str] | None = None) -> list[SynthesisResult]:
        """``synthesize`` of each request (a :class:`SynthesisRequest` or a dict of its fields), ``batch`` at a time
        through the batched graphs (continuous batching, ``kztts.tts.batch_loop``); each result equals
        that request's ``synthesize`` alone (bit for bit with fp32 weights; int8/int4 weights may differ
        in the last bits, see docs/DESIGN.md "Continuous batching"). Results in request order. ``names``: how
        warnings and errors name each request (default ``request I``, its index in the list)."""
        return synthesize_many(self, requests, batch, names)

    @one_call_at_a_time
    def stream_many(self, requests: list, *, batch: int = 4, chunk_frames: int = 4,
                    results: dict | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(request index, audio chunk)`` as each request's chunks are ready (its chunks are
        those of its ``stream`` alone); ``results`` receives each ``SynthesisResult`` by index."""
        yield from stream_many(self, requests, batch, chunk_frames, results)
