"""Audio files and sample-rate conversion (numpy + soundfile only).

``read_wav`` reads any format libsndfile knows (WAV, FLAC, OGG, ...), mixes down to
mono float32 like qwen-tts (``librosa.load(path, sr=None, mono=True)`` = mean over
channels of soundfile's float32 samples). ``write_wav`` writes through a temporary
file in the target directory and renames it into place, so an error never leaves
a partial output file. ``resample`` is a linear-phase Kaiser-windowed-sinc
resampler (polyphase, exact rational ratio) shaped like qwen-tts's resampler
(``librosa.resample``'s default, soxr "HQ": flat to 0.913 of the lower Nyquist
frequency, stopband from 1.0, delay compensated). Length as librosa returns it:
soxr's round(n * sr_to / sr_from) samples, zero-padded to ``ceil(n * (sr_to /
sr_from))`` computed in float64.
"""
from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import numpy as np

from kztts.core.atomic import atomic_path
from kztts.core.errors import KzttsError

log = logging.getLogger(__name__)

# Below one 16-bit LSB everywhere: nothing for a speaker encoder or codec to hear.
SILENCE_PEAK = 1.0 / 32768


def read_wav(path: str | os.PathLike) -> tuple[np.ndarray, int]:
    """(mono float32 samples, sample rate) of an audio file; KzttsError naming the file if unusable."""
    import soundfile as sf

    path = Path(path)
    if not path.is_file():
        raise KzttsError(f"{path}: no such audio file")
    try:
        data, sr = sf.read(str(path), dtype="float32", always_2d=True)
    except Exception as exc:  # soundfile raises LibsndfileError/RuntimeError/TypeError for bad files
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise KzttsError(f"{path}: cannot read audio ({msg}); give a WAV, FLAC or OGG file") from exc
    if data.shape[0] == 0:
        raise KzttsError(f"{path}: the file holds no audio samples")
    mono = data.mean(axis=1, dtype=np.float32) if data.shape[1] > 1 else data[:, 0]
    mono = np.ascontiguousarray(mono, dtype=np.float32)
    if not np.all(np.isfinite(mono)):
        raise KzttsError(f"{path}: the audio holds NaN or infinite samples")
    peak = float(np.max(np.abs(mono)))
    if peak < SILENCE_PEAK:
        raise KzttsError(f"{path}: the audio is silent (peak amplitude {peak:.2g}); "
                         "give a recording of the voice")
    return mono, int(sr)


# libsndfile >= 1.1 writes MP3 (the soundfile wheels bundle 1.2; kztts serve encodes its mp3 the same way)
_FORMATS = {".wav": "WAV", ".flac": "FLAC", ".ogg": "OGG", ".mp3": "MP3"}


# A voice recording (--speaker-wav, --ref-audio): long enough for a speaker embedding, short
# enough to encode in seconds; any rate in range is resampled to 24 kHz, any channels mixed down.
VOICE_SECONDS = (1.0, 60.0)
VOICE_RATES = (8000, 192000)
VOICE_RATE = 24000


def read_voice(path: str | os.PathLike) -> tuple[np.ndarray, int]:
    """A voice recording as ``read_wav`` returns it, refused (one line naming the file and the
    accepted range) outside ``VOICE_SECONDS`` / ``VOICE_RATES`` before its samples are read; a
    one-line note says when it is mixed down to mono or will be resampled to 24 kHz."""
    import soundfile as sf

    path = Path(path)
    if not path.is_file():
        raise KzttsError(f"{path}: no such audio file")
    try:
        info = sf.info(str(path))
    except Exception:  # unreadable: read_wav words the error
        return read_wav(path)
    seconds = info.frames / info.samplerate if info.samplerate else 0.0
    lo, hi = VOICE_SECONDS
    if info.frames and not lo <= seconds <= hi:
        raise KzttsError(f"{path}: the voice recording lasts {seconds:.2f} s; give {lo:g} to {hi:g} s of speech "
                         f"(cut it with any audio editor)")
    if not VOICE_RATES[0] <= info.samplerate <= VOICE_RATES[1]:
        raise KzttsError(f"{path}: sample rate {info.samplerate} Hz is outside {VOICE_RATES[0]}..{VOICE_RATES[1]} Hz; "
                         "give a normal recording")
    samples, sr = read_wav(path)
    done = ([f"mixed {info.channels} channels down to mono"] if info.channels > 1 else []) + \
        ([f"resampled {sr} Hz -> {VOICE_RATE} Hz"] if sr != VOICE_RATE else [])
    if done:
        log.warning("%s: %s (%.2f s)", path, ", ".join(done), seconds)
    return samples, sr




def check_output_extension(path: str | os.PathLike) -> Path:
    """``path`` if its extension names a format ``write_wav`` writes, else a KzttsError listing them."""
    path = Path(path)
    if path.suffix.lower() not in _FORMATS:
        raise KzttsError(f"{path}: unsupported output extension {path.suffix!r}; use one of "
                         f"{', '.join(sorted(_FORMATS))}")
    return path


def write_wav(path: str | os.PathLike, samples: np.ndarray, sr: int, subtype: str | None = None) -> Path:
    """Write ``samples`` (1-D, or [n, channels]) at ``sr`` to ``path`` atomically.

    The format follows the extension (.wav: 16-bit PCM unless ``subtype`` says
    otherwise, .flac, .ogg (Vorbis), .mp3). Samples are clipped to [-1, 1]. The data goes to a
    temporary file next to ``path`` that is renamed into place only when complete.
    """
    import soundfile as sf

    path = check_output_extension(path)
    fmt = _FORMATS[path.suffix.lower()]
    x = np.asarray(samples, dtype=np.float32)
    if x.ndim not in (1, 2) or x.shape[0] == 0:
        raise KzttsError(f"{path}: nothing to write (samples of shape {list(x.shape)})")
    if not np.all(np.isfinite(x)):
        raise KzttsError(f"{path}: refusing to write NaN or infinite samples")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise KzttsError(f"cannot write {path}: directory {parent} does not exist")
    try:
        with atomic_path(path) as tmp:
            sf.write(str(tmp), np.clip(x, -1.0, 1.0), int(sr), format=fmt, subtype=subtype)
    except KzttsError:
        raise
    except OSError as exc:
        raise KzttsError(f"cannot write {path}: {exc.strerror or exc}") from exc
    except Exception as exc:
        raise KzttsError(f"cannot write {path}: {exc}") from exc
    return path


# ---------------------------------------------------------------- resampling
# Kaiser-windowed sinc, parameters chosen to mimic soxr HQ (measured: -0.008 dB at
# 0.913, -2.9 dB at 0.95, -18 dB at 0.97, -60 dB at 0.99 of the lower Nyquist).
_CUTOFF = 0.958       # -6 dB point, fraction of the lower Nyquist frequency
_HALF_WIDTH = 100     # filter half length, in periods of the lower sample rate
_BETA = 13.0          # Kaiser beta
_MAX_TABLE_PHASES = 4096
_CHUNK = 4096         # output samples per vectorised block


def _kernel(t: np.ndarray, fc: float, half: float) -> np.ndarray:
    """Windowed-sinc impulse response at offsets t (input samples); fc in cycles per input sample."""
    w = np.zeros_like(t)
    inside = np.abs(t) < half
    r = t[inside] / half
    w[inside] = np.i0(_BETA * np.sqrt(1.0 - r * r)) / np.i0(_BETA)
    return 2.0 * fc * np.sinc(2.0 * fc * t) * w


def resample(x: np.ndarray, sr_from: int, sr_to: int) -> np.ndarray:
    """Resample 1-D ``x`` from ``sr_from`` to ``sr_to`` Hz; float32 out, ``ceil(n * (sr_to / sr_from))`` samples."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 1:
        raise ValueError(f"resample expects 1-D samples, got shape {list(x.shape)}")
    sr_from, sr_to = int(sr_from), int(sr_to)
    if sr_from <= 0 or sr_to <= 0:
        raise KzttsError(f"sample rates must be positive (got {sr_from} -> {sr_to})")
    if sr_from == sr_to:
        return x.copy()
    g = math.gcd(sr_from, sr_to)
    up, down = sr_to // g, sr_from // g
    # librosa's float formula (it can round up one more than the exact ceil, e.g. 57330 @ 44.1k)
    n_out = int(np.ceil(len(x) * (float(sr_to) / sr_from)))
    # soxr itself returns round-half-up(n * ratio) samples; librosa pads the rest with zeros
    n_signal = min(n_out, (2 * len(x) * sr_to + sr_from) // (2 * sr_from))
    fc = 0.5 * _CUTOFF * min(1.0, up / down)          # cycles per input sample
    half = _HALF_WIDTH * max(1.0, down / up)          # input samples
    k = int(math.ceil(half))
    offsets = np.arange(-k + 1, k + 1, dtype=np.int64)  # taps k0 + j, k0 = floor(t_n)
    table = None
    if up <= _MAX_TABLE_PHASES:
        phases = np.arange(up, dtype=np.float64) / up
        table = _kernel(phases[:, None] - offsets[None, :], fc, half)  # [up, 2k]
    xp = np.concatenate([np.zeros(k, np.float64), x.astype(np.float64), np.zeros(k + 1, np.float64)])
    out = np.empty(n_out, dtype=np.float32)
    for start in range(0, n_out, _CHUNK):
        n = np.arange(start, min(start + _CHUNK, n_out), dtype=np.int64)
        num = n * down
        k0, ph = num // up, num % up
        if table is not None:
            taps = table[ph]
        else:
            taps = _kernel((ph / up)[:, None] - offsets[None, :], fc, half)
        idx = k0[:, None] + offsets[None, :] + k  # into the zero-padded signal
        out[start:start + len(n)] = np.einsum("ij,ij->i", xp[idx], taps)
    out[n_signal:] = 0.0
    return out


def synthetic_voice(seconds: float = 1.3, sr: int = 24000, seed: int = 0) -> np.ndarray:
    """A deterministic voiced-like signal (a modulated 180 Hz tone in light noise):
    the demo's voice, and the reference audio of the tests."""
    t = np.arange(int(seconds * sr)) / sr
    rng = np.random.default_rng(seed)
    return (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
            + 0.02 * rng.standard_normal(t.shape)).astype(np.float32)
