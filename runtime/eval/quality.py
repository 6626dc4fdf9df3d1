"""Per-utterance measures of sampled speech and their aggregate over seeds (numpy only).

What a listener would notice first, measured without a reference recording:

- **Duration against the text.** ``kztts.tts.duration.expected_seconds(text, language)`` counts
  syllables and divides by a typical speaking rate of read speech (the rates, their source and the
  counting rule are in that module). The estimate excludes pauses, so a sentence-final pause or a slow
  voice lengthens real audio: the duration is "in band" when audio / expected lies in
  ``DURATION_BAND`` = 0.65..1.6 (speaker-to-speaker rate spread of about +-25% in that study, plus
  room for pauses at punctuation).
- **Silence.** 80 ms windows (one codec frame: 1920 samples at 24 kHz) at a 20 ms hop; a window is
  silent when its RMS is more than ``SILENCE_DB`` = 40 dB below the utterance's 95th-percentile
  window RMS (its loud speech, robust to a single click), and the silence is the union of the
  silent windows, so a pause must last a whole frame to count and its edges are placed to 20 ms.
  40 dB because weak consonants (/f/, /θ/, /h/) sit some 20-30 dB below vowel peaks and an 80 ms
  window mixes them with neighbouring phones, so speech stays above it, while the pauses of a
  neural codec decode to a floor 50 dB or more below speech. The share of silent time and the
  longest silent stretch are reported.
- **Clipping.** The share of samples with ``|x| >= CLIP_LEVEL`` = 0.999 (full scale within 0.01 dB:
  written audio is clipped to [-1, 1] by ``kztts.core.audio.write_wav``, and 16-bit full scale
  32767/32768 is above it, so decoder output at or past full scale is what a listener hears clip).
- **Natural stop.** Whether every piece ended by emitting end-of-speech (``stopped_by_eos`` of the
  synthesis result) rather than at the frame limit.

``aggregate`` summarises the utterances of one configuration (seeds x prompts); ``departures``
flags a configuration whose natural-EOS rate or silence share is off the fp32-CPU row by more than
``EOS_MARGIN`` / ``SILENCE_MARGIN_PCT``. On random weights every number here is meaningless as
quality; it only shows that the measuring works.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from kztts.tts.duration import expected_seconds

FRAME_SECONDS = 0.08  # one codec frame (kztts.runners.codec.SAMPLES_PER_FRAME = 1920 samples at 24 kHz)
SILENCE_DB = 40.0
LOUD_PERCENTILE = 95.0
CLIP_LEVEL = 0.999
DURATION_BAND = (0.65, 1.6)
# Flag margins against the fp32-CPU row: EOS rate is a fraction of utterances; more than 0.2 is more
# than one seed in five. Silence in percentage points: an earlier port's healthy tablet runs spread
# over 25-36% (11 points), so a departure beyond 10 points is outside what healthy runs showed.
EOS_MARGIN = 0.2
SILENCE_MARGIN_PCT = 10.0

def as_dict(measures: "UtteranceQuality | QualitySummary") -> dict:
    """The measures as a JSON-ready dict (floats rounded to 4 decimals)."""
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(measures).items()}


@dataclass(frozen=True)
class UtteranceQuality:
    """The measures of one synthesised utterance (seconds, percentages 0-100)."""

    frames: int
    seconds: float
    expected_seconds: float
    duration_ratio: float  # seconds / expected_seconds
    duration_in_band: bool
    silence_pct: float
    longest_silence_s: float
    clipping_pct: float
    stopped_by_eos: bool


@dataclass(frozen=True)
class QualitySummary:
    """One configuration's utterances summarised (means over seeds x prompts)."""

    utterances: int
    natural_eos_rate: float  # fraction 0-1
    mean_seconds: float
    mean_duration_ratio: float
    duration_in_band_rate: float
    mean_silence_pct: float
    max_longest_silence_s: float
    mean_clipping_pct: float


HOP_DIVISOR = 4  # 80 ms windows at a 20 ms hop: silence edges located to 20 ms


def silent_slots(samples: np.ndarray, sample_rate: int,
                 threshold_db: float = SILENCE_DB) -> tuple[np.ndarray, np.ndarray]:
    """(silent flag, seconds) per 20 ms slot. A slot is silent when some 80 ms window (one codec
    frame) containing it has an RMS more than ``threshold_db`` below the 95th-percentile window RMS:
    a pause must last a whole frame to count, and its edges are found to within one 20 ms hop."""
    x = np.asarray(samples, dtype=np.float64)
    hop = max(1, int(round(FRAME_SECONDS * sample_rate)) // HOP_DIVISOR)
    n_slots = math.ceil(len(x) / hop)
    if n_slots == 0:
        return np.zeros(0, dtype=bool), np.zeros(0)
    padded = np.zeros(n_slots * hop)
    padded[:len(x)] = x
    energy = (padded.reshape(n_slots, hop) ** 2).sum(axis=1)
    sizes = np.full(n_slots, hop, dtype=np.float64)
    sizes[-1] = len(x) - (n_slots - 1) * hop
    width = min(HOP_DIVISOR, n_slots)
    kernel = np.ones(width)
    rms = np.sqrt(np.convolve(energy, kernel, "valid") / np.convolve(sizes, kernel, "valid"))  # window k: slots k..k+width-1
    loud = float(np.percentile(rms, LOUD_PERCENTILE))
    quiet = np.ones_like(rms, dtype=bool) if loud <= 0.0 else rms < loud * 10.0 ** (-threshold_db / 20.0)
    silent = np.zeros(n_slots, dtype=bool)
    for offset in range(width):  # a slot is covered by the windows starting up to width-1 slots before it
        silent[offset:offset + len(quiet)] |= quiet
    return silent, sizes / sample_rate


def silence(samples: np.ndarray, sample_rate: int, threshold_db: float = SILENCE_DB) -> tuple[float, float]:
    """(silence share in percent of the audio's time, longest silence in seconds)."""
    silent, seconds = silent_slots(samples, sample_rate, threshold_db)
    if silent.size == 0:
        return 0.0, 0.0
    share = 100.0 * float(seconds[silent].sum() / seconds.sum())
    # longest run summed in samples, so a whole-silent clip reports exactly its length
    samples_per_slot = np.rint(seconds * sample_rate).astype(np.int64)
    longest = run = 0
    for is_silent, n in zip(silent, samples_per_slot):
        run = run + int(n) if is_silent else 0
        longest = max(longest, run)
    return share, longest / sample_rate


def clipping_pct(samples: np.ndarray, level: float = CLIP_LEVEL) -> float:
    """Percent of samples at or beyond ``level`` in magnitude."""
    x = np.asarray(samples)
    return 100.0 * float(np.count_nonzero(np.abs(x) >= level)) / x.size if x.size else 0.0


def measure(samples: np.ndarray, sample_rate: int, text: str, language: str | None, stopped_by_eos: bool,
            frames: int | None = None) -> UtteranceQuality:
    """The measures of one utterance; ``frames`` defaults to the 80 ms frames the audio spans."""
    n = int(np.asarray(samples).shape[0])
    seconds = n / sample_rate
    expected = expected_seconds(text, language)
    ratio = seconds / expected if expected > 0 else float("inf")
    share, longest = silence(samples, sample_rate)
    return UtteranceQuality(
        frames=int(frames if frames is not None else math.ceil(seconds / FRAME_SECONDS - 1e-9)),
        seconds=seconds, expected_seconds=expected, duration_ratio=ratio,
        duration_in_band=DURATION_BAND[0] <= ratio <= DURATION_BAND[1],
        silence_pct=share, longest_silence_s=longest, clipping_pct=clipping_pct(samples),
        stopped_by_eos=bool(stopped_by_eos))


def measure_result(result, text: str, language: str | None) -> UtteranceQuality:
    """``measure`` of a ``kztts.tts.result.SynthesisResult`` (samples, sample_rate, frames, stopped_by_eos)."""
    return measure(result.samples, result.sample_rate, text, language, result.stopped_by_eos, result.frames)


def aggregate(utterances: list[UtteranceQuality]) -> QualitySummary:
    """Means (and the natural-EOS rate) over one configuration's utterances."""
    if not utterances:
        raise ValueError("aggregate needs at least one utterance")

    def mean(key: str) -> float:
        return float(np.mean([float(getattr(u, key)) for u in utterances]))

    return QualitySummary(
        utterances=len(utterances), natural_eos_rate=mean("stopped_by_eos"), mean_seconds=mean("seconds"),
        mean_duration_ratio=mean("duration_ratio"), duration_in_band_rate=mean("duration_in_band"),
        mean_silence_pct=mean("silence_pct"), max_longest_silence_s=max(u.longest_silence_s for u in utterances),
        mean_clipping_pct=mean("clipping_pct"))


def departures(row: QualitySummary, fp32_cpu: QualitySummary, eos_margin: float = EOS_MARGIN,
               silence_margin_pct: float = SILENCE_MARGIN_PCT) -> list[str]:
    """Why ``row`` departs from the fp32-CPU reference row (empty when it does not): natural-EOS rate
    off by more than ``eos_margin``, or silence share by more than ``silence_margin_pct`` points."""
    out = []
    d_eos = row.natural_eos_rate - fp32_cpu.natural_eos_rate
    if abs(d_eos) > eos_margin + 1e-9:
        out.append(f"natural-EOS rate {row.natural_eos_rate:.0%} vs {fp32_cpu.natural_eos_rate:.0%} on fp32 CPU "
                   f"(margin {eos_margin:.0%})")
    d_sil = row.mean_silence_pct - fp32_cpu.mean_silence_pct
    if abs(d_sil) > silence_margin_pct + 1e-9:
        out.append(f"silence {row.mean_silence_pct:.1f}% vs {fp32_cpu.mean_silence_pct:.1f}% on fp32 CPU "
                   f"(margin {silence_margin_pct:g} points)")
    return out
