"""``kztts synth --speaker/--instruct`` and the JSONL keys ``speaker``/``instruct`` on CustomVoice and VoiceDesign
bundles: the same codes as the Python API, each refusal one line with exit 2 and nothing written."""
from __future__ import annotations

import json

import numpy as np
import pytest

from support import kztts_main

TEXT = "Hello there, speaker."


@pytest.fixture(scope="module")
def cv(custom_voice_bundle):
    from kztts import TTS

    return TTS(custom_voice_bundle)


def test_speaker_and_instruct_flags_equal_the_api(cv, custom_voice_bundle, tmp_path, capsys):
    codes = tmp_path / "codes.npy"
    code, out, err = kztts_main(capsys, "synth", TEXT, "-o", tmp_path / "a.wav", "--bundle", custom_voice_bundle,
                                "--speaker", "Eric", "--instruct", "Very happy.", "--language", "auto", "--greedy",
                                "--max-frames", 8, "--codes-out", codes)
    assert code == 0, err
    want = cv.generate_codes(TEXT, speaker="eric", instruct="Very happy.", language="auto", greedy=True, max_frames=8)
    np.testing.assert_array_equal(np.load(codes), want)


def test_jsonl_speaker_and_instruct_keys(cv, custom_voice_bundle, tmp_path, capsys):
    lines = [{"text": TEXT, "speaker": "ryan", "instruct": "Slowly.", "greedy": True, "max_frames": 6, "name": "a"},
             {"text": "你好，世界。", "speaker": "dylan", "language": "chinese", "greedy": True, "max_frames": 6,
              "name": "b"},
             {"text": TEXT, "greedy": True, "max_frames": 6, "name": "c"}]  # the command's --speaker
    jsonl = tmp_path / "r.jsonl"
    jsonl.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    code, out, err = kztts_main(capsys, "synth", "--bundle", custom_voice_bundle, "--file", jsonl, "--out-dir",
                                tmp_path / "out", "--speaker", "aiden", "--batch", 3)
    assert code == 0, err
    frames = {i["name"]: i["frames"] for i in json.loads((tmp_path / "out" / "summary.json").read_text())["items"]}
    assert frames == {"a": 6, "b": 6, "c": 6}
    from kztts.core.audio import read_wav

    alone = cv.synthesize(TEXT, speaker="ryan", instruct="Slowly.", greedy=True, max_frames=6)
    wav, _ = read_wav(tmp_path / "out" / "a.wav")
    assert np.abs(wav - alone.samples).max() < 1 / 32767 + 1e-6  # 16-bit PCM of the same samples


@pytest.mark.parametrize("bundle, args, message", [
    ("custom_voice_bundle", ["--speaker", "bob"], "unknown speaker 'bob'; this bundle's speakers are aiden, dylan"),
    ("custom_voice_bundle", ["--speaker-wav", "VOICE"], "a reference voice cannot be used with this CustomVoice"),
    ("custom_voice_06_bundle", ["--speaker", "ryan", "--instruct", "Happy."], "this CustomVoice 0.6B bundle takes no "
                                                                              "instruction"),
    ("voice_design_bundle", ["--speaker", "ryan"], "this VoiceDesign 1.7B bundle has no preset speakers"),
    ("voice_design_bundle", ["--ref-audio", "VOICE", "--ref-text", "Hi."], "a reference voice cannot be used with "
                                                                           "this VoiceDesign"),
    ("equal_bundle", ["--speaker", "ryan"], "this Base 0.6B bundle has no preset speakers; it clones a voice"),
    ("equal_bundle", ["--speaker-wav", "VOICE", "--instruct", "Happy."], "this Base 0.6B bundle takes no instruction"),
])
def test_refusals_are_one_line_and_write_nothing(request, voice_wav, tmp_path, capsys, bundle, args, message):
    out = tmp_path / "x.wav"
    args = [voice_wav if a == "VOICE" else a for a in args]
    code, stdout, err = kztts_main(capsys, "synth", TEXT, "-o", out, "--bundle", request.getfixturevalue(bundle),
                                   "--max-frames", 3, *args)
    assert code == 2 and message in err and err.count("\n") == 1 and err.startswith("kztts: error: "), err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_bad_jsonl_line_names_itself(custom_voice_bundle, tmp_path, capsys):
    jsonl = tmp_path / "r.jsonl"
    jsonl.write_text(json.dumps({"text": TEXT, "speaker": "ryan"}) + "\n" + json.dumps({"text": TEXT, "speaker": "zed"})
                     + "\n")
    code, out, err = kztts_main(capsys, "synth", "--bundle", custom_voice_bundle, "--file", jsonl, "--out-dir",
                                tmp_path / "out", "--max-frames", 3)
    assert code == 2 and f"{jsonl} line 2: unknown speaker 'zed'" in err, err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
