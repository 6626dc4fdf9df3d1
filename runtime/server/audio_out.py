"""Audio bytes for the responses: whole files through soundfile (the bytes ``kztts synth -o`` writes for
a WAV), and the streamed forms (raw 16-bit PCM; a WAV whose header leaves the length open).

Samples are clipped to [-1, 1] and converted by libsndfile, as ``kztts.core.audio.write_wav`` does, so a
streamed chunk's 16-bit samples are those of the same samples in a written WAV."""
from __future__ import annotations

import io
import struct

import numpy as np

from kztts.server.bodies import AUDIO_FORMATS

_OPEN_LENGTH = 0xFFFFFFFF  # a streamed WAV's sizes: unknown until the end (players read to the end)


def encode(samples: np.ndarray, sample_rate: int, response_format: str) -> bytes:
    """A whole audio file (or, for ``pcm``, the raw samples) of ``samples``."""
    import soundfile as sf

    fmt, subtype, _ = AUDIO_FORMATS[response_format]
    x = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0)
    if fmt == "RAW":
        return pcm16(x)
    if subtype == "PCM_16":  # libsndfile's FLAC writer rounds floats its own way: give it the WAV's integers
        x = np.frombuffer(pcm16(x), "<i2")
    buf = io.BytesIO()
    sf.write(buf, x, int(sample_rate), format=fmt, subtype=subtype)
    return buf.getvalue()


def pcm16(samples: np.ndarray) -> bytes:
    """16-bit little-endian PCM of float samples (libsndfile's conversion, as in a 16-bit WAV)."""
    import soundfile as sf

    x = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0)
    if not x.shape[0]:
        return b""
    buf = io.BytesIO()
    sf.write(buf, x, 24000, format="RAW", subtype="PCM_16", endian="LITTLE")
    return buf.getvalue()


def wav_stream_header(sample_rate: int) -> bytes:
    """The 44-byte header of a streamed 16-bit mono WAV (RIFF and data sizes left open)."""
    return (b"RIFF" + struct.pack("<I", _OPEN_LENGTH) + b"WAVEfmt " +
            struct.pack("<IHHIIHH", 16, 1, 1, int(sample_rate), int(sample_rate) * 2, 2, 16) +
            b"data" + struct.pack("<I", _OPEN_LENGTH))


def media_type(response_format: str) -> str:
    return AUDIO_FORMATS[response_format][2]
