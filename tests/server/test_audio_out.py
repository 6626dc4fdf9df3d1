"""kztts.server.audio_out: the bytes of a speech response. A whole WAV is the file ``kztts synth -o`` writes, raw
PCM is that file's samples, a streamed WAV's header leaves its length open, FLAC is lossless."""
from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import soundfile as sf

from kztts.core.audio import synthetic_voice, write_wav
from kztts.server.audio_out import encode, media_type, pcm16, wav_stream_header
from kztts.server.bodies import AUDIO_FORMATS

SR = 24000


@pytest.fixture(scope="module")
def samples() -> np.ndarray:
    x = synthetic_voice(seconds=0.5) * 3.0  # loud: some samples past full scale, which every form clips
    assert np.abs(x).max() > 1.0
    return x


def test_a_whole_wav_is_the_file_kztts_synth_writes(samples, tmp_path):
    written = write_wav(tmp_path / "synth.wav", samples, SR).read_bytes()
    assert encode(samples, SR, "wav") == written
    assert encode(samples, SR, "pcm") == pcm16(samples) == written[44:]  # the data chunk of that file


def test_pcm16_is_clipped_little_endian_16_bit():
    x = np.array([2.0, -2.0, 1.0, -1.0, 0.5, 0.0], np.float32)
    assert np.frombuffer(pcm16(x), "<i2").tolist() == [32767, -32768, 32767, -32768, 16384, 0]
    assert pcm16(np.zeros(0, np.float32)) == b""


def test_flac_is_lossless_and_mp3_and_opus_decode(samples):
    want = np.frombuffer(pcm16(samples), "<i2")
    got, sr = sf.read(io.BytesIO(encode(samples, SR, "flac")), dtype="int16")
    assert sr == SR and np.array_equal(got, want)
    for fmt in ("mp3", "opus"):
        x, sr = sf.read(io.BytesIO(encode(samples, SR, fmt)), dtype="float32")
        assert sr == SR and abs(len(x) - len(want)) < 0.1 * len(want) and np.abs(x).max() > 0.1, fmt


def test_a_streamed_wav_header_leaves_its_sizes_open():
    header = wav_stream_header(SR)
    assert len(header) == 44 and header[:4] == b"RIFF" and header[8:16] == b"WAVEfmt " and header[36:40] == b"data"
    riff_size, = struct.unpack("<I", header[4:8])
    fmt_size, tag, channels, rate, byte_rate, align, bits = struct.unpack("<IHHIIHH", header[16:36])
    data_size, = struct.unpack("<I", header[40:44])
    assert riff_size == data_size == 0xFFFFFFFF  # unknown until the end: players read to the end
    assert (fmt_size, tag, channels, rate, byte_rate, align, bits) == (16, 1, 1, SR, 2 * SR, 2, 16)
    # the same header fields a written 16-bit mono WAV has
    written = encode(np.zeros(10, np.float32), SR, "wav")
    assert written[12:36] == header[12:36]


def test_media_types():
    assert {f: media_type(f) for f in AUDIO_FORMATS} == {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac",
                                                        "mp3": "audio/mpeg", "opus": "audio/ogg"}
