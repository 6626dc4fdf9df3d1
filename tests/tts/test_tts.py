"""Text to speech end to end: `kztts synth` and `kztts.TTS` against qwen-tts, streaming, bad input."""
from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf

from kztts import TTS, Voice
from kztts.core.audio import synthetic_voice, write_wav
from kztts.core.errors import KzttsError

from support import run_kztts

FRAMES = 40
TEXT = "Hello world, this is a tiny test."
REF_TEXT = "A reference sentence."


@pytest.fixture(scope="module")
def tts(tiny_bundle_dir):
    return TTS(tiny_bundle_dir)


def reference_wav(reference, codes, ref_codes):
    """qwen-tts's decode of generated codes, with its ICL handling (decode ref ++ codes, drop the ref part)."""
    import torch

    full = codes if ref_codes is None else np.concatenate([ref_codes, codes])
    wavs, _ = reference.model.speech_tokenizer.decode([{"audio_codes": torch.as_tensor(full)}])
    wav = wavs[0]
    return wav if ref_codes is None else wav[ref_codes.shape[0] * 1920:]


@pytest.mark.parametrize("mode", ["xvec_nonstream", "xvec_stream", "icl_nonstream", "icl_stream"])
def test_synth_greedy_codes_and_wav_equal_qwen_tts(reference, tiny_bundle_dir, voice_wav, tmp_path, mode):
    from kztts.export.common.reference import reference_run

    wav, sr = sf.read(voice_wav, dtype="float32")
    ref = reference_run(reference, mode, frames=FRAMES, language="English", text=TEXT, ref_text=REF_TEXT,
                        ref_audio=wav, ref_sr=sr)
    assert ref.codes.shape == (FRAMES, 16)
    out, codes_out = tmp_path / "out.wav", tmp_path / "codes.npy"
    voice = ["--speaker-wav", voice_wav] if mode.startswith("xvec") else ["--ref-audio", voice_wav, "--ref-text", REF_TEXT]
    args = ["synth", TEXT, "-o", out, "--bundle", tiny_bundle_dir, "--language", "english", "--greedy",
            "--max-frames", FRAMES, "--codes-out", codes_out, *voice]
    if mode.endswith("_stream"):
        args.append("--streaming-text")
    res = run_kztts(*args)
    assert res.returncode == 0, res.stderr
    codes = np.load(codes_out)
    assert codes.dtype == np.int64 and codes.shape == (FRAMES, 16)
    np.testing.assert_array_equal(codes, ref.codes)
    got, got_sr = sf.read(out, dtype="float32")
    want = reference_wav(reference, ref.codes, ref.ref_codes)
    assert got_sr == 24000 and got.shape == want.shape == (FRAMES * 1920,)
    assert np.abs(got - want).max() <= 1.5e-4  # measured <= 3.3e-5 in all four modes, both variants: 4.5x


def test_stream_concatenated_equals_synthesize(tts):
    voice = tts.voice_from_wav(synthetic_voice(), 24000)
    whole = tts.synthesize(TEXT, voice, seed=5, max_frames=13)
    holder: dict = {}
    chunks = list(tts.stream(TEXT, voice, seed=5, max_frames=13, chunk_frames=3, result=holder))
    assert [len(c) for c in chunks] == [1920, 2 * 1920] + [3 * 1920] * 3 + [1920]  # first chunk 1 frame, growing
    np.testing.assert_array_equal(holder["result"].codes, whole.codes)
    # chunked streaming decoder against the one-pass decoder graph: measured 1.8e-6, 5x margin
    np.testing.assert_allclose(np.concatenate(chunks), whole.samples, atol=1e-5, rtol=0)
    assert holder["result"].times.first_audio < whole.times.first_audio


def test_stream_icl_equals_synthesize(tts):
    wav = synthetic_voice()
    voice = tts.voice_from_reference(wav, 24000, REF_TEXT)
    whole = tts.synthesize(TEXT, voice, greedy=True, max_frames=6)
    chunks = list(tts.stream(TEXT, voice, greedy=True, max_frames=6, chunk_frames=4))
    np.testing.assert_allclose(np.concatenate(chunks), whole.samples, atol=1e-5, rtol=0)  # measured 1.4e-6: 7x


@pytest.mark.parametrize("icl", [False, True], ids=["xvector", "icl"])
@pytest.mark.parametrize("chunk", [1, 3])
def test_pipelined_stream_is_bit_identical(tts, icl, chunk):
    """Decoding on a background thread while frames are generated changes nothing in the output."""
    wav = synthetic_voice()
    voice = tts.voice_from_reference(wav, 24000, REF_TEXT) if icl else tts.voice_from_wav(wav, 24000)
    seq, pip = {}, {}
    a = list(tts.stream(TEXT, voice, seed=5, max_frames=13, chunk_frames=chunk, result=seq, pipeline=False))
    b = list(tts.stream(TEXT, voice, seed=5, max_frames=13, chunk_frames=chunk, result=pip, pipeline=True))
    assert [len(c) for c in b] == [len(c) for c in a]
    np.testing.assert_array_equal(np.concatenate(b), np.concatenate(a))
    np.testing.assert_array_equal(pip["result"].codes, seq["result"].codes)
    np.testing.assert_array_equal(pip["result"].samples, seq["result"].samples)
    times = pip["result"].times
    assert times.decoder > 0 and 0 < times.first_audio <= pip["result"].total_seconds


def _decoder_threads() -> list[str]:
    import threading

    return [t.name for t in threading.enumerate() if t.name == "kztts-decoder"]


def test_pipelined_decoder_error_surfaces_in_the_caller(tts, monkeypatch):
    dec = tts.streaming_decoder()
    real, calls = dec.push, []

    def broken(codes):
        calls.append(len(codes))
        if len(calls) == 2:
            raise KzttsError("decoder broke")
        return real(codes)

    monkeypatch.setattr(dec, "push", broken)
    voice = tts.voice_from_wav(synthetic_voice(), 24000)
    got = []
    with pytest.raises(KzttsError, match="decoder broke"):
        for chunk in tts.stream(TEXT, voice, seed=5, max_frames=12, chunk_frames=2, pipeline=True):
            got.append(chunk)
    assert len(got) == 1 and not _decoder_threads()


def test_pipelined_stream_closed_early_stops_its_thread(tts):
    voice = tts.voice_from_wav(synthetic_voice(), 24000)
    gen = tts.stream(TEXT, voice, seed=5, max_frames=12, chunk_frames=2, pipeline=True)
    assert next(gen).shape == (1920,)  # the first chunk: one frame
    gen.close()
    assert not _decoder_threads()


def test_tts_opens_one_decoder_graph(tiny_bundle_dir):
    fresh = TTS(tiny_bundle_dir)
    assert "decoder_stream" in fresh.bundle._sessions
    xv = np.zeros(fresh.speaker_size, np.float32)  # the voice does not matter here
    fresh.synthesize(TEXT, Voice(xv), greedy=True, max_frames=3)
    list(fresh.stream(TEXT, Voice(xv), greedy=True, max_frames=3))
    opened = set(fresh.bundle._sessions)
    assert "decoder" not in opened and {"encoder", "speaker_encoder"}.isdisjoint(opened), opened


def test_decoder_threads_are_set_per_graph(monkeypatch):
    from kztts.bundle.sessions import SessionConfig

    cfg = SessionConfig(threads=2, decoder_threads=1, graph_threads=(("talker", 3),))
    assert [cfg.threads_for(g) for g in ("talker", "cp_frame", "decoder", "decoder_stream")] == [3, 2, 1, 1]
    monkeypatch.setenv("KZTTS_DECODER_THREADS", "1")
    assert SessionConfig(threads=2).threads_for("decoder_stream") == 1
    monkeypatch.setenv("KZTTS_DECODER_THREADS", "x")
    with pytest.raises(KzttsError, match="KZTTS_DECODER_THREADS='x' is not valid"):
        SessionConfig()


def test_same_seed_same_codes_and_sampling_differs_by_seed(tts):
    voice = tts.voice_from_wav(synthetic_voice(), 24000)
    a = tts.synthesize(TEXT, voice, seed=11, max_frames=12)
    b = tts.synthesize(TEXT, voice, seed=11, max_frames=12)
    c = tts.synthesize(TEXT, voice, seed=12, max_frames=12)
    np.testing.assert_array_equal(a.codes, b.codes)
    assert not np.array_equal(a.codes, c.codes)


@pytest.mark.parametrize("variant", ["equal"], indirect=True)
def test_stop_path_on_a_model_that_emits_eos(tmp_path, variant):
    """A checkpoint biased to EOS: generation stops there, like qwen-tts, and the audio is that long."""
    from kztts.export.common.checkpoint import load_reference
    from kztts.export.common.reference import reference_run
    from kztts.export.tts.bundle_writer import cached_bundle
    from kztts.export.tts.tiny import cached_tiny

    model_dir = cached_tiny(variant, eos_bias=True)
    ref = reference_run(load_reference(model_dir), "xvec_nonstream", frames=60, language="English", text=TEXT)
    assert 2 <= len(ref.codes) < 60, "the EOS-biased test model must stop by itself"
    tts = TTS(cached_bundle(model_dir))
    voice = tts.voice_from_wav(synthetic_voice(), 24000)
    result = tts.synthesize(TEXT, voice, language="english", greedy=True, max_frames=60)
    assert result.stopped_by_eos
    np.testing.assert_array_equal(result.codes, ref.codes)
    assert result.samples.shape == (len(ref.codes) * 1920,)


def test_settings_env_override_error_names_the_variable(tts, monkeypatch):
    monkeypatch.setenv("KZTTS_CP_TOPP", "1.5")
    with pytest.raises(KzttsError, match=r"KZTTS_CP_TOPP='1.5' is out of range: expected a number in \(0, 1\]"):
        tts.default_settings()


# ------------------------------------------------------------------ bad input from the command line
@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory, tiny_bundle_dir):
    d = tmp_path_factory.mktemp("bad")
    write_wav(d / "silent.wav", np.zeros(24000, np.float32), 24000)
    (d / "garbage.wav").write_bytes(b"RIFF not really a wav")
    np.save(d / "short.npy", np.zeros(7, np.float32))
    write_wav(d / "voice.wav", synthetic_voice(), 24000)
    return d


@pytest.mark.parametrize("variant", ["proj"], indirect=True)
@pytest.mark.parametrize("case, extra, message", [
    ("empty", ["", ], "the text is empty"),
    ("blank", ["   \n ", ], "the text is empty"),
    ("language", [TEXT, "--language", "klingon", "--speaker-wav", "{d}/voice.wav"],
     "unknown language 'klingon'; known: auto, chinese"),
    ("unreadable", [TEXT, "--speaker-wav", "{d}/garbage.wav"], "garbage.wav: cannot read audio"),
    ("silent", [TEXT, "--speaker-wav", "{d}/silent.wav"], "silent.wav: the audio is silent"),
    ("xvector", [TEXT, "--xvector", "{d}/short.npy"], "short.npy: x-vector has shape [7] (7 values), expected 64"),
    ("unwritable", [TEXT, "--xvector", "{d}/short.npy", "-o", "/nonexistent/dir/x.wav"],
     "directory /nonexistent/dir does not exist"),
    ("bad-flag", [TEXT, "--top-p", "0"], "--top-p='0' is out of range: expected a number in (0, 1]"),
])
def test_bad_input_is_one_line_exit_2_and_no_output(bad_inputs, tiny_bundle_dir, tmp_path, variant, case, extra,
                                                    message):
    out = tmp_path / "out.wav"
    args = [a.format(d=bad_inputs) if isinstance(a, str) else a for a in extra]
    if "-o" not in args:
        args += ["-o", out]
    if case == "bad-flag":
        args += ["--speaker-wav", bad_inputs / "silent.wav"]
    res = run_kztts("synth", *args, "--bundle", tiny_bundle_dir, "--max-frames", 3)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, res.stderr
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert not out.exists() and not list(tmp_path.iterdir())


def test_summary_is_printed(tiny_bundle_dir, voice_wav, tmp_path):
    res = run_kztts("synth", TEXT, "-o", tmp_path / "a.wav", "--bundle", tiny_bundle_dir, "--speaker-wav", voice_wav,
                "--max-frames", 5, "--stream")
    assert res.returncode == 0, res.stderr
    assert "5 frames, 0.40 s of audio" in res.stdout
    assert "time to first audio" in res.stdout and "code_predictor" in res.stdout
    info = json.dumps(res.stdout)
    assert "real-time factor" in info
