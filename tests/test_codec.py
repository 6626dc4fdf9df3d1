"""Speech-tokenizer graphs against qwen-tts: full decode, streaming decode, encoder (ICL ref codes).

The tiny "proj" and "equal" checkpoints share one speech tokenizer, so these run on "proj" only.
"""
from __future__ import annotations

import numpy as np
import pytest

from kztts import audio
from kztts.codec import Decoder, Encoder, StreamingDecoder, check_codes
from kztts.errors import KzttsError

on_proj = pytest.mark.parametrize("variant", ["proj"], indirect=True)
FRAMES = 310  # crosses qwen-tts's 300-frame decode segment (left context 25)


def synthetic_voice(sr: int, seconds: float = 1.3, seed: int = 0) -> np.ndarray:
    return audio.synthetic_voice(seconds, sr, seed)


@pytest.fixture(scope="module")
def codec(reference, tmp_path_factory):
    from kztts.export.codec_graphs import export_decoder, export_encoder
    from kztts.sessions import open_session

    out = tmp_path_factory.mktemp("codec")
    specs = export_decoder(reference.model, out, "test")
    specs.update(export_encoder(reference.model, out, "test"))
    return {name: (open_session(out, spec), spec) for name, spec in specs.items()}


@pytest.fixture(scope="module")
def codes():
    return np.random.default_rng(7).integers(0, 2048, (FRAMES, 16), dtype=np.int64)


@pytest.fixture(scope="module")
def reference_wav(reference, codes):
    """qwen-tts's own decode of ``codes`` (Qwen3TTSTokenizer.decode: clamp, chunked_decode(300, 25), trim)."""
    wavs, sr = reference.model.speech_tokenizer.decode([{"audio_codes": codes}])
    assert sr == 24000
    return wavs[0]


@pytest.fixture(scope="module")
def full_wav(codec, codes):
    return Decoder(codec["decoder"][0]).decode(codes)


@on_proj
def test_graph_io(codec):
    spec = codec["decoder"][1]
    assert [(t.name, t.dtype, t.shape) for t in spec.inputs] == [("codes", "int64", (1, "frames", 16))]
    assert [(t.name, t.dtype, t.shape) for t in spec.outputs] == [("wav", "float32", (1, "samples"))]
    stream = codec["decoder_stream"][1]
    assert [t.name for t in stream.inputs[:2]] == ["codes", "position"]
    for i, o in zip(stream.inputs[2:], stream.outputs[1:]):  # fixed-size state, same order in and out
        assert o.name == "new_" + i.name and o.shape == i.shape and all(isinstance(d, int) for d in i.shape)
    enc = codec["encoder"][1]
    assert [(t.name, t.dtype, t.shape) for t in enc.inputs] == [("wav", "float32", (1, "samples"))]
    assert [(t.name, t.dtype, t.shape) for t in enc.outputs] == [("codes", "int64", (1, "frames", 16))]


@on_proj
def test_full_decode_matches_reference(full_wav, reference_wav):
    assert full_wav.dtype == np.float32 and full_wav.shape == (FRAMES * 1920,)
    err = float(np.max(np.abs(full_wav - reference_wav)))
    assert err <= 1e-3, err  # measured ~4e-6


@on_proj
def test_decoder_runs_on_the_stream_graph_too(codec, codes, full_wav):
    wav = Decoder(codec["decoder_stream"][0]).decode(codes)
    assert float(np.max(np.abs(wav - full_wav))) <= 1e-4


@on_proj
def test_decode_without_segments_is_one_causal_pass(codec, reference, codes):
    import torch

    n = 40
    with torch.no_grad():
        ref = reference.model.speech_tokenizer.model.decoder(torch.from_numpy(codes[:n].T[None]))[0, 0].numpy()
    wav = Decoder(codec["decoder"][0], chunk_size=None).decode(codes[:n])
    assert float(np.max(np.abs(wav - ref))) <= 1e-4


@on_proj
@pytest.mark.parametrize("sizes", [[1], [3], [7], [5, 1, 13, 2, 64, 29, 1, 150, 45]],
                         ids=["one", "three", "seven", "uneven"])
def test_streaming_equals_full_decode(codec, codes, full_wav, reference_wav, sizes):
    dec = StreamingDecoder(codec["decoder_stream"][0])
    pieces, pos, k = [], 0, 0
    while pos < FRAMES:
        n = sizes[k % len(sizes)]
        out = dec.push(codes[pos:pos + n])
        assert out.shape == (min(n, FRAMES - pos) * 1920,)
        pieces.append(out)
        pos += n
        k += 1
    wav = np.concatenate(pieces)
    assert dec.frames == FRAMES
    assert float(np.max(np.abs(wav - full_wav))) <= 1e-4  # measured ~4e-6
    assert float(np.max(np.abs(wav - reference_wav))) <= 1e-3


@on_proj
def test_streaming_reset_and_empty_push(codec, codes, full_wav):
    dec = StreamingDecoder(codec["decoder_stream"][0])
    dec.push(codes[:9])
    dec.reset()
    assert dec.push(np.zeros((0, 16), np.int64)).shape == (0,)
    wav = np.concatenate([dec.push(codes[:20]), dec.push(codes[20:40])])
    assert float(np.max(np.abs(wav - full_wav[:40 * 1920]))) <= 1e-4


@on_proj
@pytest.mark.parametrize("sr,seconds", [(24000, 1.3), (24000, 11.0), (16000, 1.3)])
def test_encoder_matches_reference_ref_code(codec, reference, sr, seconds):
    wav = synthetic_voice(sr, seconds)
    if seconds > 10:  # odd length, > 250 encoder frames (Mimi's sliding_window is not applied)
        wav = wav[:-77]
    items = reference.create_voice_clone_prompt(ref_audio=(wav, sr), ref_text="A reference sentence.",
                                                x_vector_only_mode=False)
    ref = items[0].ref_code.numpy()
    codes = Encoder(codec["encoder"][0]).encode(wav, sr)
    assert codes.dtype == np.int64 and codes.shape == ref.shape
    match = float(np.mean(codes == ref))
    if sr == 24000:
        assert match == 1.0, match
    else:  # numpy resampler vs librosa's soxr: not bit-identical input
        assert match >= 0.9, match


def test_codes_are_checked():
    ok = check_codes(np.zeros((3, 16), np.int32))
    assert ok.dtype == np.int64 and ok.shape == (3, 16)
    with pytest.raises(KzttsError, match=r"shape \[frames, 16\], got \[3, 8\]"):
        check_codes(np.zeros((3, 8), np.int64))
    with pytest.raises(KzttsError, match=r"0\.\.2047, got values -1\.\.5"):
        check_codes(np.array([[5] * 15 + [-1]]))
    with pytest.raises(KzttsError, match="integers"):
        check_codes(np.zeros((2, 16), np.float32))
