"""kztts.runners.speaker: x-vectors (numpy mel + the ONNX speaker encoder) against qwen-tts, and x-vector files
(audio I/O and resampling: tests/core/test_audio.py)."""
from __future__ import annotations

import numpy as np
import pytest

from kztts.core.audio import synthetic_voice
from kztts.core.errors import KzttsError
from kztts.runners.speaker import SpeakerEncoder, load_xvector, mel_filterbank, mel_spectrogram

from support import cosine


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
        wav = synthetic_voice(seconds, 24000, seed=3)
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
    wav = synthetic_voice(sr=sr)
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
