"""Speaker x-vectors: the numpy mel front end + the ``speaker_encoder`` graph, and x-vector files.

The front end reproduces qwen-tts's ``mel_spectrogram`` (modeling_qwen3_tts.py) as
``extract_speaker_embedding`` calls it: 24 kHz input, reflect padding of
(n_fft - hop) / 2 = 384 samples on each side, frames of 1024 every 256 samples
(center=False), periodic Hann window, magnitude sqrt(re^2 + im^2 + 1e-9), a
128-band Slaney mel filter bank over 0..12 kHz (``librosa.filters.mel`` defaults:
Slaney mel scale, Slaney area normalisation, built in float32 exactly as librosa
builds it), then log(max(x, 1e-5)). Other sample rates are first resampled to
24 kHz (kztts.core.audio.resample), as qwen-tts does with ``librosa.resample``.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnxruntime as ort

from kztts.core.audio import resample
from kztts.core.errors import BundleError, KzttsError

SAMPLE_RATE = 24000
N_FFT = 1024
HOP = 256
WIN = 1024
N_MELS = 128
FMIN = 0.0
FMAX = 12000.0
DEFAULT_MIN_FRAMES = 5  # ECAPA reflect pads: widest is dilation 4 * (3 - 1) / 2 = 4 frames


# ---------------------------------------------------------------- mel filter bank (librosa-exact)
def hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney mel scale (librosa.hz_to_mel, htk=False)."""
    f = np.asanyarray(f, dtype=np.float64)
    f_sp = 200.0 / 3
    mels = f / f_sp
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-300) / min_log_hz) / logstep, mels)


def mel_to_hz(m: np.ndarray) -> np.ndarray:
    """Inverse Slaney mel scale (librosa.mel_to_hz, htk=False)."""
    m = np.asanyarray(m, dtype=np.float64)
    f_sp = 200.0 / 3
    freqs = f_sp * m
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), freqs)


def mel_filterbank(sr: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS,
                   fmin: float = FMIN, fmax: float = FMAX) -> np.ndarray:
    """[n_mels, 1 + n_fft // 2] float32, equal to ``librosa.filters.mel(sr=, n_fft=, n_mels=, fmin=, fmax=)``."""
    weights = np.zeros((n_mels, 1 + n_fft // 2), dtype=np.float32)
    fftfreqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)
    mel_f = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = np.subtract.outer(mel_f, fftfreqs)
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0, np.minimum(lower, upper))
    enorm = 2.0 / (mel_f[2:n_mels + 2] - mel_f[:n_mels])
    weights *= enorm[:, np.newaxis]
    return weights


_FILTERS: dict[tuple, np.ndarray] = {}


def _filters() -> np.ndarray:
    key = (SAMPLE_RATE, N_FFT, N_MELS, FMIN, FMAX)
    if key not in _FILTERS:
        _FILTERS[key] = mel_filterbank(*key)
    return _FILTERS[key]


def _hann(n: int) -> np.ndarray:
    """Periodic Hann window (torch.hann_window default)."""
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / n)


def mel_spectrogram(wav: np.ndarray) -> np.ndarray:
    """Log-mel features [n_frames, 128] float32 of 24 kHz mono ``wav`` (qwen-tts ``mel_spectrogram``)."""
    y = np.asarray(wav, dtype=np.float32)
    if y.ndim != 1:
        raise ValueError(f"mel_spectrogram expects 1-D samples, got shape {list(y.shape)}")
    pad = (N_FFT - HOP) // 2
    if len(y) <= pad:
        raise KzttsError(f"reference audio too short for the speaker encoder: {len(y)} samples at "
                         f"{SAMPLE_RATE} Hz (needs more than {pad})")
    y = np.pad(y.astype(np.float64), (pad, pad), mode="reflect")
    n_frames = 1 + (len(y) - N_FFT) // HOP
    frames = np.lib.stride_tricks.sliding_window_view(y, N_FFT)[::HOP][:n_frames]
    spec = np.fft.rfft(frames * _hann(WIN), axis=-1)  # [n_frames, 513]
    mag = np.sqrt(spec.real ** 2 + spec.imag ** 2 + 1e-9)
    mel = mag @ _filters().T.astype(np.float64)
    return np.log(np.maximum(mel, 1e-5)).astype(np.float32)


# ---------------------------------------------------------------- encoder
class SpeakerEncoder:
    """x-vector of a voice sample: numpy log-mel -> ``speaker_encoder`` graph."""

    def __init__(self, session: ort.InferenceSession, min_frames: int = DEFAULT_MIN_FRAMES):
        self.session = session
        out = session.get_outputs()[0]
        self.size = out.shape[-1] if isinstance(out.shape[-1], int) else None
        self.min_frames = int(min_frames)

    @classmethod
    def from_bundle(cls, bundle, session=None) -> "SpeakerEncoder":
        """The bundle's ``speaker_encoder`` (``session``: one already opened for it, e.g. by the plan)."""
        spec = bundle.manifest.graphs.get("speaker_encoder")
        if spec is None:
            raise BundleError(f"{bundle.path}: the bundle has no speaker_encoder graph; re-export it")
        return cls(session or bundle.session("speaker_encoder"), int(spec.extra.get("min_frames", DEFAULT_MIN_FRAMES)))

    def mel(self, wav: np.ndarray, sr: int) -> np.ndarray:
        """Log-mel [n_frames, 128] of ``wav`` at ``sr`` Hz (resampled to 24 kHz first)."""
        wav = np.asarray(wav, dtype=np.float32)
        if wav.ndim == 2:  # [n, channels] -> mono, as qwen-tts does
            wav = wav.mean(axis=-1, dtype=np.float32)
        if wav.ndim != 1 or wav.size == 0:
            raise KzttsError(f"reference audio must be 1-D samples, got shape {list(wav.shape)}")
        if int(sr) != SAMPLE_RATE:
            wav = resample(wav, int(sr), SAMPLE_RATE)
        return mel_spectrogram(wav)

    def xvector(self, wav: np.ndarray, sr: int) -> np.ndarray:
        """Speaker embedding f32[enc_dim] of mono ``wav`` sampled at ``sr`` Hz."""
        mel = self.mel(wav, sr)
        if mel.shape[0] < self.min_frames:
            need = (self.min_frames - 1) * HOP + HOP
            raise KzttsError(f"reference audio too short for the speaker encoder: {mel.shape[0]} mel frames "
                             f"(needs {self.min_frames}, about {need / SAMPLE_RATE:.3f} s)")
        out = self.session.run(None, {"mel": mel[None]})[0]
        return np.ascontiguousarray(out[0], dtype=np.float32)


# ---------------------------------------------------------------- x-vector files
def load_xvector(path: str | os.PathLike, expected_size: int) -> np.ndarray:
    """An x-vector f32[expected_size] from ``.npy`` (shape [n] or [1, n]) or a raw little-endian float32 file."""
    path = Path(path)
    if not path.is_file():
        raise KzttsError(f"{path}: no such x-vector file")
    if path.suffix.lower() == ".npy":
        try:
            arr = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise KzttsError(f"{path}: not a readable .npy file ({exc})") from exc
        if arr.dtype.kind != "f":
            raise KzttsError(f"{path}: x-vector dtype is {arr.dtype}, expected float32")
        if arr.ndim == 2 and arr.shape[0] == 1:
            arr = arr[0]
        if arr.ndim != 1 or arr.size != expected_size:
            raise KzttsError(f"{path}: x-vector has shape {list(arr.shape)} ({arr.size} values), expected "
                             f"{expected_size} values for this model")
        vec = arr.astype(np.float32)
    else:
        nbytes = path.stat().st_size
        if nbytes % 4:
            raise KzttsError(f"{path}: {nbytes} bytes is not a whole number of float32 values; expected a raw "
                             f"little-endian float32 file of {expected_size} values ({4 * expected_size} bytes)")
        if nbytes // 4 != expected_size:
            raise KzttsError(f"{path}: x-vector has {nbytes // 4} float32 values ({nbytes} bytes), expected "
                             f"{expected_size} values ({4 * expected_size} bytes) for this model")
        vec = np.fromfile(path, dtype="<f4").astype(np.float32)
    if not np.all(np.isfinite(vec)):
        raise KzttsError(f"{path}: x-vector holds NaN or infinite values")
    return vec
