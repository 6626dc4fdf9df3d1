"""One voice rule on every command-line route (``TTS.default_voice``): a route given no voice speaks with the
bundle's default (Base: the built-in voice, the x-vector of ``synthetic_voice()``, the samples of the ``voice_wav``
file; CustomVoice: its first preset speaker), exactly as the same route given that voice: ``synth TEXT`` with a
bundle, ``synth --file`` with the demo, ``chat --speak``. The library's methods: tests/tts/test_default_voice.py."""
from __future__ import annotations

import json

import numpy as np
import soundfile as sf

from tests.support import kztts_main, run_kztts

TEXT = "One rule for every route."
FLAGS = ("--greedy", "--max-frames", 6)


def wav16(path) -> np.ndarray:
    return sf.read(path, dtype="int16")[0]


def test_synth_with_a_base_bundle_and_no_voice_speaks_the_built_in_voice(equal_bundle, voice_wav, tmp_path, capsys):
    code, _, err = kztts_main(capsys, "synth", TEXT, "-o", tmp_path / "none.wav", "--bundle", equal_bundle, *FLAGS)
    assert code == 0, err
    assert "no voice given: the built-in voice speaks" in err  # said, since the bundle is not the demo
    code, _, err = kztts_main(capsys, "synth", TEXT, "-o", tmp_path / "given.wav", "--bundle", equal_bundle,
                              "--speaker-wav", voice_wav, *FLAGS)
    assert code == 0, err
    assert np.array_equal(wav16(tmp_path / "none.wav"), wav16(tmp_path / "given.wav"))


def test_synth_file_with_the_demo_and_no_voice_speaks_like_synth_text(equal_bundle, voice_wav, tmp_path, capsys):
    lines = tmp_path / "texts.jsonl"
    lines.write_text(json.dumps({"text": TEXT, "name": "a"}) + "\n")
    code, _, err = kztts_main(capsys, "synth", "--file", lines, "--out-dir", tmp_path / "out", *FLAGS)
    assert code == 0, err
    code, _, err = kztts_main(capsys, "synth", TEXT, "-o", tmp_path / "one.wav", "--bundle", equal_bundle,
                              "--speaker-wav", voice_wav, *FLAGS)
    assert code == 0, err
    assert np.array_equal(wav16(tmp_path / "out" / "a.wav"), wav16(tmp_path / "one.wav"))


def test_synth_with_a_custom_voice_bundle_and_no_speaker_speaks_the_first_preset(custom_voice_bundle, tmp_path,
                                                                                 capsys):
    code, _, err = kztts_main(capsys, "synth", TEXT, "-o", tmp_path / "none.wav", "--bundle", custom_voice_bundle,
                              *FLAGS)
    assert code == 0, err
    assert "no --speaker given: the first preset speaker, aiden, speaks" in err
    code, _, err = kztts_main(capsys, "synth", TEXT, "-o", tmp_path / "aiden.wav", "--bundle", custom_voice_bundle,
                              "--speaker", "aiden", *FLAGS)
    assert code == 0, err
    assert np.array_equal(wav16(tmp_path / "none.wav"), wav16(tmp_path / "aiden.wav"))


def test_chat_speak_without_a_voice_speaks_the_built_in_voice(chat_bundle, equal_bundle, voice_wav, tmp_path):
    common = ("chat", chat_bundle, "--speak", equal_bundle, "--greedy", "--max-new-tokens", 8, "--seed", 1)
    none = run_kztts(*common, "--speak-out", tmp_path / "none", input="Hello there.\n")
    assert none.returncode == 0, none.stderr[-2000:]
    given = run_kztts(*common, "--speaker-wav", voice_wav, "--speak-out", tmp_path / "given", input="Hello there.\n")
    assert given.returncode == 0, given.stderr[-2000:]
    spoken = wav16(tmp_path / "none" / "reply-01.wav")
    assert spoken.size > 0 and np.array_equal(spoken, wav16(tmp_path / "given" / "reply-01.wav"))
