"""``kztts synth --file texts.jsonl`` (``kztts.cli.synth_many``): a WAV per line and a summary through the batched
frame loop, a bad line refused naming its number and key, the flags of a single utterance refused."""
from __future__ import annotations

import json

import numpy as np
import pytest

from support import kztts_main


@pytest.fixture(scope="module")
def tts(eos_bundle):
    from kztts.tts.tts import TTS

    return TTS(eos_bundle)


def test_synth_file_writes_a_wav_per_line_and_a_summary(tts, eos_bundle, tmp_path, capsys, monkeypatch):
    import kztts.cli.synth
    from kztts.core.audio import read_wav

    monkeypatch.setattr(kztts.cli.synth, "TTS", lambda bundle, **kw: tts)  # the module's opened TTS
    xv = tmp_path / "voice.npy"
    np.save(xv, np.random.default_rng(1).standard_normal(tts.speaker_size).astype(np.float32))
    lines = [{"text": "Hello there.", "language": "english", "seed": 5, "name": "hello"},
             {"text": "Bonjour.", "language": "french", "greedy": True, "max_frames": 3},
             {"text": "Third one.", "seed": 9, "cp_top_k": 5, "xvector": "voice.npy"}]
    jsonl = tmp_path / "texts.jsonl"
    jsonl.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    out = tmp_path / "out"
    code, stdout, err = kztts_main(capsys, "synth", "--bundle", eos_bundle, "--xvector", xv, "--file", jsonl,
                             "--out-dir", out, "--batch", 2)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert [i["wav"] for i in summary["items"]] == ["hello.wav", "0002.wav", "0003.wav"]
    assert summary["batch"] == 2 and summary["frames"] == sum(i["frames"] for i in summary["items"])
    alone = tts.synthesize("Bonjour.", tts.voice_from_xvector(xv), language="french", greedy=True, max_frames=3)
    wav, sr = read_wav(out / "0002.wav")
    assert sr == 24000 and wav.shape == alone.samples.shape and summary["items"][1]["frames"] == 3
    assert "3 WAVs" in stdout


@pytest.mark.parametrize("line, message", [
    ('{"text": "ok"}\nnot json', "line 2: not valid JSON"),
    ('{"text": "ok"}\n\n{"text": "x", "sed": 1}', "line 3: unknown key 'sed'"),
    ('{"text": "x", "seed": "one"}', "line 1: key 'seed' must be int"),
    ('{"language": "english"}', "line 1: key 'text' is missing"),
    ('{"text": "x", "cp_top_k": -2}', "line 1: key 'cp_top_k'"),
    ('{"text": "a", "name": "n"}\n{"text": "b", "name": "n"}', "line 2: key 'name' 'n' is already used by line 1"),
])
def test_a_bad_jsonl_line_names_its_number_and_key(tmp_path, capsys, line, message):
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text(line + "\n")
    code, _, err = kztts_main(capsys, "synth", "--bundle", tmp_path / "none", "--file", jsonl, "--out-dir", tmp_path / "o")
    assert code == 2 and message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("extra, message", [
    (["-o", "x.wav"], "it does not take -o/--output"),
    (["--stream"], "it does not take --stream"),
    (["--batch", "0"], "--batch must be >= 1"),
])
def test_synth_file_refuses_single_output_flags(tmp_path, capsys, extra, message):
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"text": "ok"}\n')
    code, _, err = kztts_main(capsys, "synth", "--bundle", tmp_path / "none", "--file", jsonl, "--out-dir", tmp_path / "o",
                        *extra)
    assert code == 2 and message in err, err
    code, _, err = kztts_main(capsys, "synth", "--bundle", tmp_path / "none")
    assert code == 2 and "synth needs TEXT and -o/--output (or --file" in err


def test_read_lines_checks_each_line_into_its_keys_and_overrides(tmp_path):
    """``read_lines`` directly: blank lines skipped, a line's number as its default name, the sampling keys as the
    environment's overrides; the voice keys' rules and an empty file refused naming the line or the file."""
    from kztts.cli.synth_many import Line, read_lines
    from kztts.core.errors import KzttsError

    path = tmp_path / "t.jsonl"
    path.write_text('{"text": "one", "seed": 2, "temperature": 0.5, "cp_top_k": 3}\n\n'
                    '{"text": "two", "name": "b", "xvector": "v.npy", "language": "french"}\n')
    assert read_lines(path) == [Line(1, "0001", {"text": "one", "seed": 2}, {"KZTTS_TEMP": 0.5, "KZTTS_CP_TOPK": 3}),
                                Line(3, "b", {"text": "two", "xvector": "v.npy", "language": "french"}, {})]
    for text, words in (('{"text": "x", "ref_audio": "a.wav"}', "line 1: an ICL voice needs both keys"),
                        ('{"text": "x", "xvector": "a.npy", "speaker_wav": "b.wav"}', "line 1: give one voice"),
                        ('[1]', "line 1: must be a JSON object with a 'text' key, got list"),
                        ("\n\n", "no requests (one JSON object per line")):
        path.write_text(text + "\n")
        with pytest.raises(KzttsError) as info:
            read_lines(path)
        assert words in str(info.value)
    with pytest.raises(KzttsError, match="cannot read the request file"):
        read_lines(tmp_path / "missing.jsonl")
