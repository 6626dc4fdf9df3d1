"""Speaker x-vectors (numpy mel + ONNX) against qwen-tts, x-vector files, audio I/O and resampling."""
from __future__ import annotations

import os

import numpy as np
import pytest

from kztts.core import audio
from kztts.core.audio import read_wav, resample, write_wav
from kztts.core.errors import KzttsError
from kztts.runners.speaker import SpeakerEncoder, load_xvector, mel_filterbank, mel_spectrogram


def synthetic_voice(sr: int, seconds: float = 1.3, seed: int = 0) -> np.ndarray:
    return audio.synthetic_voice(seconds, sr, seed)


def cosine(a, b) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def speaker(reference, tmp_path_factory):
    from kztts.bundle.sessions import open_session
    from kztts.export.graphs.speaker_graph import export_speaker_encoder

    out = tmp_path_factory.mktemp("speaker")
    spec = export_speaker_encoder(reference.model, out, "test")["speaker_encoder"]
    return SpeakerEncoder(open_session(out, spec), spec.extra["min_frames"]), spec


# ---------------------------------------------------------------- mel front end
def test_mel_filterbank_equals_librosa():
    librosa = pytest.importorskip("librosa")
    ref = librosa.filters.mel(sr=24000, n_fft=1024, n_mels=128, fmin=0, fmax=12000)
    ours = mel_filterbank()
    assert ours.dtype == ref.dtype == np.float32
    assert np.array_equal(ours, ref)


def test_mel_matches_reference():
    import torch

    from kztts.export.common.qwen_import import import_qwen_tts

    import_qwen_tts()
    from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram as ref_mel

    for seconds in (1.3, 0.37):
        wav = synthetic_voice(24000, seconds, seed=3)
        ref = ref_mel(torch.from_numpy(wav)[None], n_fft=1024, num_mels=128, sampling_rate=24000, hop_size=256,
                      win_size=1024, fmin=0, fmax=12000).transpose(1, 2)[0].numpy()
        ours = mel_spectrogram(wav)
        assert ours.dtype == np.float32 and ours.shape == ref.shape
        # log-mel (values ~1..10, numpy FFT against torch.stft): measured 2.0e-5 (1.3 s), 1.5e-5 (0.37 s): 5x
        assert float(np.max(np.abs(ours - ref))) <= 1e-4


# ---------------------------------------------------------------- x-vectors
def test_speaker_graph_io(speaker, reference):
    _, spec = speaker
    dim = reference.model.config.speaker_encoder_config.enc_dim
    assert [(t.name, t.dtype, t.shape) for t in spec.inputs] == [("mel", "float32", (1, "frames", 128))]
    assert [(t.name, t.dtype, t.shape) for t in spec.outputs] == [("xvector", "float32", (1, dim))]


# 1 - cosine measured (proj, equal): 24 kHz 0 / -1e-7 (max abs 1.9e-6); 16 kHz 1.0e-6 / 1.3e-6; 44.1 kHz
# 3e-7 / 2.4e-6 (numpy resampler vs soxr): bounds 1e-6 (the float32 rounding of a cosine) and 1e-5 (4x)
@pytest.mark.parametrize("sr,max_one_minus_cos", [(24000, 1e-6), (16000, 1e-5), (44100, 1e-5)])
def test_xvector_matches_reference(speaker, reference, sr, max_one_minus_cos):
    enc, _ = speaker
    wav = synthetic_voice(sr)
    items = reference.create_voice_clone_prompt(ref_audio=(wav, sr), ref_text=None, x_vector_only_mode=True)
    ref = items[0].ref_spk_embedding.numpy()
    ours = enc.xvector(wav, sr)
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    assert 1.0 - cosine(ours, ref) <= max_one_minus_cos, 1.0 - cosine(ours, ref)
    if sr == 24000:  # the same samples in: equal to float32 rounding
        assert float(np.max(np.abs(ours - ref))) <= 1e-5  # measured 1.9e-6: 5x


def test_xvector_too_short_is_a_clear_error(speaker):
    enc, _ = speaker
    with pytest.raises(KzttsError, match="too short"):
        enc.xvector(np.full(300, 0.1, np.float32), 24000)
    with pytest.raises(KzttsError, match="too short"):
        enc.xvector(np.full(1000, 0.1, np.float32), 24000)  # 4 mel frames < 5


# ---------------------------------------------------------------- x-vector files
def test_load_xvector_npy_and_raw(tmp_path):
    vec = np.random.default_rng(0).standard_normal(1024).astype(np.float32)
    np.save(tmp_path / "a.npy", vec)
    np.save(tmp_path / "b.npy", vec[None].astype(np.float64))
    vec.astype("<f4").tofile(tmp_path / "c.bin")
    vec.astype("<f4").tofile(tmp_path / "seed_xvector")  # an earlier port shipped its x-vector as raw f32, no extension
    for name in ("a.npy", "b.npy", "c.bin", "seed_xvector"):
        got = load_xvector(tmp_path / name, 1024)
        assert got.dtype == np.float32 and got.shape == (1024,)
        np.testing.assert_array_equal(got, vec)


def test_load_xvector_errors(tmp_path):
    raw = tmp_path / "x.bin"
    np.zeros(1000, "<f4").tofile(raw)
    with pytest.raises(KzttsError) as e:
        load_xvector(raw, 1024)
    assert str(raw) in str(e.value) and "1000" in str(e.value) and "1024" in str(e.value)
    npy = tmp_path / "x.npy"
    np.save(npy, np.zeros(2048, np.float32))
    with pytest.raises(KzttsError) as e:
        load_xvector(npy, 1024)
    assert str(npy) in str(e.value) and "2048" in str(e.value) and "1024" in str(e.value)
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\0" * 4097)
    with pytest.raises(KzttsError, match="4097 bytes"):
        load_xvector(odd, 1024)
    with pytest.raises(KzttsError, match="no such x-vector file"):
        load_xvector(tmp_path / "missing.bin", 1024)
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"not numpy")
    with pytest.raises(KzttsError, match="bad.npy"):
        load_xvector(bad, 1024)
    nan = tmp_path / "nan.bin"
    np.full(8, np.nan, "<f4").tofile(nan)
    with pytest.raises(KzttsError, match="NaN"):
        load_xvector(nan, 8)


# ---------------------------------------------------------------- audio files
def test_read_wav_mixes_down_and_round_trips(tmp_path):
    import soundfile as sf

    stereo = np.stack([synthetic_voice(16000), 0.5 * synthetic_voice(16000, seed=1)], axis=1)
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
        write_wav(tmp_path / "out.mp3", np.zeros(100, np.float32), 24000)
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
    voice = synthetic_voice(sr)  # broadband: differs only in the 0.913..1.0 Nyquist transition band
    ref, ours = librosa.resample(voice, orig_sr=sr, target_sr=24000), resample(voice, sr, 24000)
    assert np.sqrt(np.mean((ours - ref) ** 2) / np.mean(ref ** 2)) <= 2e-3  # measured <= 4.9e-4: 4x


def test_written_wav_has_a_normal_file_mode(tmp_path):
    old = os.umask(0o022)
    try:
        out = write_wav(tmp_path / "a.wav", np.zeros(100, np.float32) + 0.1, 24000)
    finally:
        os.umask(old)
    assert (out.stat().st_mode & 0o777) == 0o644
