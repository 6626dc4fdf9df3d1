"""kztts.server.voices: a speech server's voices, read once from ``--voices DIR`` (recordings through the speaker
encoder, x-vector files as they are) and looked up by name; the default voice; bad folders refused at start."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from kztts.core.audio import read_voice, synthetic_voice, write_wav
from kztts.core.errors import KzttsError
from kztts.server.errors import ApiError
from kztts.server.voices import VoiceBook, offer


@pytest.fixture(scope="module")
def folder(tts, tmp_path_factory):
    d = tmp_path_factory.mktemp("voices")
    write_wav(d / "alice.wav", synthetic_voice(seed=1), 24000)
    np.save(d / "bob.npy", np.random.default_rng(2).standard_normal(tts.speaker_size).astype(np.float32))
    (d / "notes.txt").write_text("not a voice")
    (d / ".DS_Store").write_bytes(b"")  # a hidden file: skipped without a word
    (d / "sub").mkdir()
    return d


def same(a, b) -> bool:
    return np.array_equal(a.speaker, b.speaker) and a.ref_codes is b.ref_codes is None


def test_a_folder_of_recordings_and_xvectors(tts, folder, caplog):
    with caplog.at_level(logging.INFO, logger="kztts.server.voices"):
        book = VoiceBook.load(tts, folder)
    assert same(book.get("alice"), tts.voice_from_wav(*read_voice(folder / "alice.wav")))
    assert same(book.get("bob"), tts.voice_from_xvector(folder / "bob.npy"))
    assert same(book.get("default"), tts.voice_from_wav(synthetic_voice(), 24000))  # the demo's voice
    assert book.listing() == [
        {"id": "alice", "object": "voice", "name": "alice", "source": "recording", "default": False},
        {"id": "bob", "object": "voice", "name": "bob", "source": "xvector", "default": False},
        {"id": "default", "object": "voice", "name": "default", "source": "builtin", "default": True}]
    logged = [r.getMessage() for r in caplog.records]
    assert any("notes.txt: not a voice" in m for m in logged) and not any(".DS_Store" in m for m in logged)
    assert "voices: alice (recording), bob (xvector), default (builtin)" in logged


def test_an_unknown_name_is_a_404_listing_the_voices(tts, folder):
    book = VoiceBook.load(tts, folder)
    with pytest.raises(ApiError) as info:
        book.get("../alice")  # a name is a key, never a path
    error = info.value
    assert (error.status, error.code, error.param) == (404, "voice_not_found", "voice")
    assert "the voices are: alice, bob, default" in error.message


def test_the_folders_default_voice_and_no_folder(tts, tmp_path):
    np.save(tmp_path / "default.npy", np.ones(tts.speaker_size, np.float32))
    book = VoiceBook.load(tts, tmp_path)
    assert book.listing() == [{"id": "default", "object": "voice", "name": "default", "source": "xvector",
                               "default": True}]
    assert np.array_equal(book.get("default").speaker, np.ones(tts.speaker_size, np.float32))
    assert [v["id"] for v in VoiceBook.load(tts, None).listing()] == ["default"]


def test_bad_folders_are_refused_at_start(tts, tmp_path):
    with pytest.raises(KzttsError, match="--voices must be a folder"):
        VoiceBook.load(tts, tmp_path / "missing")
    bad = tmp_path / "bad"
    bad.mkdir()
    np.save(bad / "-dash.npy", np.ones(tts.speaker_size, np.float32))
    with pytest.raises(KzttsError, match=r"-dash\.npy: a voice name is the file stem"):
        VoiceBook.load(tts, bad)
    twice = tmp_path / "twice"
    twice.mkdir()
    np.save(twice / "carol.npy", np.ones(tts.speaker_size, np.float32))
    write_wav(twice / "carol.wav", synthetic_voice(), 24000)
    with pytest.raises(KzttsError, match="voice 'carol' is given twice"):
        VoiceBook.load(tts, twice)
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    np.save(wrong / "dave.npy", np.ones(tts.speaker_size + 1, np.float32))
    with pytest.raises(KzttsError, match="dave.npy"):
        VoiceBook.load(tts, wrong)


def test_offer_says_what_each_kind_takes(tts, custom_voice_bundle, custom_voice_06_bundle, voice_design_bundle):
    from kztts.bundle.bundle import Bundle
    from kztts.tts.model_kind import ModelKind

    def of(bundle) -> dict:
        return offer(ModelKind.of(Bundle.open(bundle, load_graphs=False).manifest))

    assert offer(tts.kind) == {"kind": "base", "label": tts.kind.label, "takes_instruction": False}
    assert of(custom_voice_bundle) == {"kind": "custom_voice", "label": "CustomVoice 1.7B", "takes_instruction": True}
    # qwen-tts drops a 0.6B CustomVoice instruction: kztts refuses one, so a client shows no field for it
    assert of(custom_voice_06_bundle) == {"kind": "custom_voice", "label": "CustomVoice 0.6B",
                                          "takes_instruction": False}
    assert of(voice_design_bundle) == {"kind": "voice_design", "label": "VoiceDesign 1.7B", "takes_instruction": True}
