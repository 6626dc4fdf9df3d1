"""Saved voices (``kztts.tts.voice_file``): a voice computed once from a recording, saved and loaded without any
encoder, gives bit-identical audio to the voice computed from the WAV (x-vector and ICL; ``synth --voice`` and
``kztts voice create``); a file from another bundle, of other shapes, of another version or not a voice is refused."""
from __future__ import annotations

import json

import numpy as np
import pytest

from kztts import TTS
from kztts.core.audio import read_voice, synthetic_voice
from kztts.core.errors import KzttsError
from kztts.tts import voice_file

from support import kztts_main

TEXT = "Hello from a saved voice."
REF_TEXT = "A reference sentence."


@pytest.fixture(scope="module")
def tts(equal_bundle):
    return TTS(equal_bundle)


@pytest.mark.parametrize("icl", [False, True], ids=["xvector", "icl"])
def test_saved_voice_is_bit_identical_and_runs_no_encoder(tts, equal_bundle, tmp_path, monkeypatch, icl):
    wav = synthetic_voice()
    voice = tts.voice_from_reference(wav, 24000, REF_TEXT) if icl else tts.voice_from_wav(wav, 24000)
    path = tts.save_voice(voice, tmp_path / "alice.voice")
    fresh = TTS(equal_bundle)
    for opener in ("open_speaker_encoder", "open_speech_encoder"):
        monkeypatch.setattr(fresh.plan, opener, lambda *a, **k: pytest.fail("an encoder ran"))
    loaded = fresh.voice_from_file(path)
    assert loaded.icl == icl and loaded.ref_text == (REF_TEXT if icl else None)
    np.testing.assert_array_equal(loaded.speaker, voice.speaker)
    a = tts.synthesize(TEXT, voice, seed=3, max_frames=9)
    b = fresh.synthesize(TEXT, loaded, seed=3, max_frames=9)
    np.testing.assert_array_equal(b.codes, a.codes)
    np.testing.assert_array_equal(b.samples, a.samples)


def test_voice_create_then_synth_voice_equals_the_wav(equal_bundle, voice_wav, tmp_path, capsys):
    out = tmp_path / "alice.voice"
    code, stdout, err = kztts_main(capsys, "voice", "create", voice_wav, "-o", out, "--ref-text", REF_TEXT,
                                   "--bundle", equal_bundle)
    assert code == 0 and out.is_file() and "ICL" in stdout, err
    common = ["synth", TEXT, "--bundle", equal_bundle, "--seed", 4, "--max-frames", 7]
    assert kztts_main(capsys, *common, "-o", tmp_path / "a.wav", "--voice", out)[0] == 0
    assert kztts_main(capsys, *common, "-o", tmp_path / "b.wav", "--ref-audio", voice_wav, "--ref-text", REF_TEXT)[0] == 0
    assert (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes()


def _rewrite(path, out, meta_change=None, arrays_change=None):
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays["meta"].tobytes())
    (meta_change or (lambda m: None))(meta)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    (arrays_change or (lambda a: None))(arrays)
    with open(out, "wb") as f:
        np.savez(f, **arrays)
    return out


def test_refusals(tts, proj_bundle, custom_voice_bundle, tmp_path):
    good = tts.save_voice(tts.voice_from_wav(synthetic_voice(), 24000), tmp_path / "good.voice")
    cases = {
        "another bundle": (lambda: TTS(proj_bundle).voice_from_file(good), "made by another model (checkpoint"),
        "other shapes": (lambda: tts.voice_from_file(_rewrite(
            good, tmp_path / "wide.voice", lambda m: m["model"].update(speaker_embedding_size=2048),
            lambda a: a.update(xvector=np.zeros(2048, np.float32)))), "made for speaker_embedding_size 2048, this "
                                                                     f"bundle has {tts.speaker_size}"),
        "version": (lambda: tts.voice_from_file(_rewrite(good, tmp_path / "v2.voice", lambda m: m.update(version=2))),
                    "voice file version 2; this kztts reads version 1"),
        "not a voice": (lambda: tts.voice_from_file(tmp_path / "x.voice"), "not a kztts voice file"),
        "custom voice": (lambda: TTS(custom_voice_bundle).voice_from_file(good),
                         "a saved voice clones a voice, which a custom_voice bundle does not do"),
        "missing": (lambda: tts.voice_from_file(tmp_path / "none.voice"), "no such voice file"),
    }
    (tmp_path / "x.voice").write_bytes(b"RIFF....not a zip")
    for name, (call, message) in cases.items():
        with pytest.raises(KzttsError) as err:
            call()
        remedy = "name a preset speaker" if name == "custom voice" else "kztts voice create"
        assert message in str(err.value) and remedy in str(err.value) and "\n" not in str(err.value), name


def test_voice_create_refuses_a_custom_voice_bundle(custom_voice_bundle, voice_wav, tmp_path, capsys):
    out = tmp_path / "a.voice"
    code, _, err = kztts_main(capsys, "voice", "create", voice_wav, "-o", out, "--bundle", custom_voice_bundle)
    assert code == 2 and "clones no voice; saved voices are for Base bundles" in err and not out.exists()


def test_format_is_documented_in_the_module():
    assert voice_file.FORMAT == "kztts-voice" and voice_file.VERSION == 1 and voice_file.SUFFIX == ".voice"
    assert read_voice  # the CLI's reader of the recording
