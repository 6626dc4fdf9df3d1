"""What a server serves: one bundle (a TTS or an LM), opened once, its engine and scheduler, voices,
limits and metrics. ``Service.open`` does all the slow and fallible work before the port is bound."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from kztts.bundle.bundle import Bundle
from kztts.bundle.manifest import KIND_LM
from kztts.core.errors import KzttsError
from kztts.generation.settings import GenerationSettings, preset, with_environment
from kztts.lm.lm import LM
from kztts.server.bodies import Limits
from kztts.server.chat import open_chat_engine
from kztts.server.metrics import Metrics
from kztts.server.scheduler import Scheduler
from kztts.server.speech import open_speech_engine
from kztts.server.errors import ApiError
from kztts.server.spoken_chat import SpokenChatEngine
from kztts.server.voices import VOICE_DEFAULT, VoiceBook
from kztts.tts.tts import TTS

log = logging.getLogger(__name__)


@dataclass
class ServeOptions:
    """``kztts serve``'s choices (the flags)."""

    bundle: Path
    host: str = "127.0.0.1"
    port: int = 8000
    voices: Path | None = None
    batch: int = 4
    queue: int = 16
    api_key: str | None = None
    target: str | None = None
    placement: str | None = None
    limits: Limits = field(default_factory=Limits)
    model_name: str | None = None  # the id clients name in "model" (default: the bundle folder's name)
    context: int | None = None  # Talker positions per request (None: the runtime's default)
    tts: Path | None = None  # with an LM bundle: the TTS bundle that speaks replies (spoken chat completions)

    def check(self) -> ServeOptions:
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise KzttsError(f"--batch must be an integer >= 1, got {self.batch!r}")
        if isinstance(self.queue, bool) or not isinstance(self.queue, int) or self.queue < 0:
            raise KzttsError(f"--queue must be an integer >= 0, got {self.queue!r}")
        if not 0 <= int(self.port) <= 65535:
            raise KzttsError(f"--port must be 0..65535 (0: any free port), got {self.port}")
        if self.api_key is not None and not self.api_key.strip():
            raise KzttsError("the API key is empty; give --api-key KEY (or $KZTTS_API_KEY), or neither")
        for name in ("max_input_chars", "max_frames", "max_tokens", "max_body_bytes"):
            if getattr(self.limits, name) < 1:
                raise KzttsError(f"limit {name} must be >= 1, got {getattr(self.limits, name)}")
        if self.context is not None and (isinstance(self.context, bool) or self.context < 16):
            raise KzttsError(f"--context must be an integer >= 16, got {self.context!r}")
        if self.tts is not None and not Path(self.tts).is_dir():
            raise KzttsError(f"--tts {self.tts}: no such bundle folder; give a TTS bundle (kztts export ... -o BUNDLE)")
        if self.voices is not None and not Path(self.voices).is_dir():
            raise KzttsError(f"{self.voices}: --voices must be a folder of .wav (recordings), .npy (x-vectors) or .voice "
                             "(saved voices)")
        return self


def warm_up(tts: TTS, voices: VoiceBook) -> None:
    """Every graph run once before the port opens, so the first request does not pay ONNX Runtime's
    first-run costs (``TTS.warm_up``), with the default voice when there is one."""
    try:
        voice = voices.get(VOICE_DEFAULT)
    except ApiError:
        voice = None
    log.info("warmed up in %.0f ms", tts.warm_up(voice) * 1e3)


class Service:
    """The opened model and everything the app needs to answer."""

    def __init__(self, options: ServeOptions, kind: str, model, engine, voices=None,
                 settings: GenerationSettings | None = None, tts: TTS | None = None):
        self.options = options
        self.kind = kind  # "tts" or "lm"
        self.model = model  # kztts.TTS or kztts.LM
        self.engine = engine
        self.voices = voices  # kztts.server.voices.VoiceBook (speech)
        self.settings = settings  # the base sampling settings of speech requests
        self.tts = tts if tts is not None else (model if kind == "tts" else None)  # what speaks (a TTS or None)
        self.limits = options.limits
        self.model_id = options.model_name or Path(options.bundle).resolve().name
        self.metrics = Metrics()
        self.scheduler = Scheduler(engine, options.queue, self.metrics)

    @classmethod
    def open(cls, options: ServeOptions) -> Service:
        """Open the bundle's graphs, the voices and the engine (errors are ``KzttsError``s)."""
        bundle = Bundle.open(options.bundle, load_graphs=False)
        if bundle.manifest.kind == KIND_LM:
            if options.voices is not None and options.tts is None:
                raise KzttsError(f"{options.bundle} is an LM bundle: it speaks no voices (drop --voices, or give "
                                 "--tts TTS_BUNDLE to speak replies)")
            lm = LM(bundle, target=options.target, placement=options.placement, context=options.context)
            if options.tts is None:
                return cls(options, "lm", lm, open_chat_engine(lm, options.batch))
            tts = TTS(options.tts)
            if tts.bundle.manifest.kind == KIND_LM:
                raise KzttsError(f"--tts {options.tts}: an LM bundle; give a TTS bundle")
            voices = VoiceBook.load(tts, options.voices)
            warm_up(tts, voices)
            settings = with_environment(preset("reference", tts.bundle.manifest.generation))
            engine = SpokenChatEngine(open_chat_engine(lm, options.batch), open_speech_engine(tts, options.batch))
            return cls(options, "lm", lm, engine, voices, settings, tts=tts)
        if options.tts is not None:
            raise KzttsError(f"{options.bundle} is a TTS bundle; --tts goes with an LM bundle (kztts serve LM --tts TTS)")
        tts = TTS(bundle, target=options.target, placement=options.placement,
                  **({} if options.context is None else {"context": options.context}))
        voices = VoiceBook.load(tts, options.voices)
        warm_up(tts, voices)
        settings = with_environment(preset("reference", bundle.manifest.generation))
        return cls(options, "tts", tts, open_speech_engine(tts, options.batch), voices, settings)

    def start(self) -> None:
        self.scheduler.start()
        log.info("%s: %s bundle served as %r; %s", self.options.bundle, self.kind, self.model_id, self.engine.mode)

    def close(self) -> None:
        self.scheduler.stop()
        self.model.plan.close()

    @property
    def ready(self) -> bool:
        return self.scheduler.alive and not self.scheduler.draining
