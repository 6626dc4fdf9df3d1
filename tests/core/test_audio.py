"""kztts.core.audio: reading a voice recording (mixed down, errors naming the file), writing a WAV whole
or not at all (with a normal file mode), and resampling against librosa."""
from __future__ import annotations

import os

import numpy as np
import pytest

from kztts.core.audio import read_wav, resample, synthetic_voice, write_wav
from kztts.core.errors import KzttsError


# ---------------------------------------------------------------- reading and writing
def test_read_wav_mixes_down_and_round_trips(tmp_path):
    import soundfile as sf

    stereo = np.stack([synthetic_voice(sr=16000), 0.5 * synthetic_voice(sr=16000, seed=1)], axis=1)
    sf.write(tmp_path / "st.wav", stereo, 16000, subtype="FLOAT")
    mono, sr = read_wav(tmp_path / "st.wav")
    assert sr == 16000 and mono.dtype == np.float32 and mono.ndim == 1
    np.testing.assert_allclose(mono, stereo.mean(axis=1), atol=1e-7)
    out = write_wav(tmp_path / "o.wav", mono, sr)
    back, sr2 = read_wav(out)
    assert sr2 == 16000 and back.shape == mono.shape
    assert float(np.max(np.abs(back - mono))) <= 1.0 / 32768 + 1e-7  # 16-bit PCM
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_read_wav_errors_name_the_file(tmp_path):
    import soundfile as sf

    junk = tmp_path / "junk.wav"
    junk.write_bytes(b"RIFF this is not audio at all" * 10)
    with pytest.raises(KzttsError, match="junk.wav: cannot read audio"):
        read_wav(junk)
    silent = tmp_path / "silent.wav"
    sf.write(silent, np.zeros(24000, np.float32), 24000)
    with pytest.raises(KzttsError, match="silent.wav: the audio is silent"):
        read_wav(silent)
    empty = tmp_path / "empty.wav"
    sf.write(empty, np.zeros(0, np.float32), 24000)
    with pytest.raises(KzttsError, match="empty.wav"):
        read_wav(empty)
    with pytest.raises(KzttsError, match="nope.wav: no such audio file"):
        read_wav(tmp_path / "nope.wav")


def test_write_wav_leaves_no_partial_file(tmp_path, monkeypatch):
    import soundfile as sf

    target = tmp_path / "out.wav"

    def broken_write(path, *a, **kw):
        with open(path, "wb") as f:
            f.write(b"RIFF partial")
        raise RuntimeError("disk full")

    monkeypatch.setattr(sf, "write", broken_write)
    with pytest.raises(KzttsError, match="out.wav.*disk full"):
        write_wav(target, np.zeros(100, np.float32), 24000)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    with pytest.raises(KzttsError, match="unsupported output extension"):
        write_wav(tmp_path / "out.aiff", np.zeros(100, np.float32), 24000)
    with pytest.raises(KzttsError, match="does not exist"):
        write_wav(tmp_path / "no" / "out.wav", np.zeros(100, np.float32), 24000)
    with pytest.raises(KzttsError, match="NaN"):
        write_wav(target, np.full(100, np.nan, np.float32), 24000)
    assert list(tmp_path.iterdir()) == []
    # an existing file is replaced only by a complete one
    write_wav(target, np.full(100, 0.25, np.float32), 24000)
    assert os.path.getsize(target) > 44


# ---------------------------------------------------------------- resampling
@pytest.mark.parametrize("sr", [16000, 44100, 22050, 48000])
def test_resample_matches_librosa(sr):
    librosa = pytest.importorskip("librosa")
    t = np.arange(int(1.3 * sr)) / sr
    tones = (0.3 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 3000 * t)).astype(np.float32)
    ref = librosa.resample(tones, orig_sr=sr, target_sr=24000)
    ours = resample(tones, sr, 24000)
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    assert float(np.max(np.abs(ours - ref)[200:-200])) <= 1e-6  # passband: measured <= 2.7e-7: 3.7x
    voice = synthetic_voice(sr=sr)  # broadband: differs only in the 0.913..1.0 Nyquist transition band
    ref, ours = librosa.resample(voice, orig_sr=sr, target_sr=24000), resample(voice, sr, 24000)
    assert np.sqrt(np.mean((ours - ref) ** 2) / np.mean(ref ** 2)) <= 2e-3  # measured <= 4.9e-4: 4x


def test_written_wav_has_a_normal_file_mode(tmp_path):
    old = os.umask(0o022)
    try:
        out = write_wav(tmp_path / "a.wav", np.zeros(100, np.float32) + 0.1, 24000)
    finally:
        os.umask(old)
    assert (out.stat().st_mode & 0o777) == 0o644
