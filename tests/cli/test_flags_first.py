"""Flags checked before the work: each refusal is one line naming the flag or file and what to do, given before a
model loads (the model's constructor is replaced by one that fails the test), and it leaves nothing behind;
``synth --file`` names a request by its 1-based line in warnings as in ``summary.json``."""
from __future__ import annotations

import json
import logging

import pytest

from kztts.core.audio import synthetic_voice, write_wav

from support import kztts_main


def one_line(rc: int, err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("kztts: error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def no_model(monkeypatch):
    import kztts.cli.synth

    def opened(*a, **kw):
        raise AssertionError("a model was opened before the flags were checked")

    monkeypatch.setattr(kztts.cli.synth, "TTS", opened)


@pytest.mark.parametrize("value", ["0", "-3"])
def test_max_frames_below_one_is_refused_before_the_model_loads(capsys, tmp_path, no_model, value):
    rc, _, err = kztts_main(capsys, "synth", "Hello.", "-o", tmp_path / "x.wav", "--max-frames", value)
    line = one_line(rc, err)
    assert f"--max-frames must be >= 1" in line and f"got {value}" in line and "leave it out" in line
    assert list(tmp_path.iterdir()) == []


def test_voice_create_refuses_an_existing_file_unless_overwrite(capsys, tmp_path, equal_bundle):
    rec = write_wav(tmp_path / "rec.wav", synthetic_voice(), 24000)
    out = tmp_path / "a.voice"
    out.write_bytes(b"keep me")
    rc, _, err = kztts_main(capsys, "voice", "create", rec, "-o", out, "--bundle", equal_bundle)
    assert "already exists; give --overwrite" in one_line(rc, err) and out.read_bytes() == b"keep me"
    rc, _, err = kztts_main(capsys, "voice", "create", rec, "-o", out, "--bundle", equal_bundle, "--overwrite")
    assert rc == 0, err
    assert out.read_bytes() != b"keep me"


def test_export_refuses_a_full_folder_before_loading_the_export_extra(capsys, tmp_path, monkeypatch):
    from kztts.cli import export as cli_export

    def loaded():
        raise AssertionError("the export extra was loaded before the output folder was checked")

    monkeypatch.setattr(cli_export, "need_export_extra", loaded)
    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "kztts.json").write_text("{}")
    rc, out, err = kztts_main(capsys, "export", tmp_path / "model", "-o", tmp_path / "bundle")
    line = one_line(rc, err)
    assert "exists and is not empty" in line and "--overwrite" in line and "exporting" not in out + err


def test_a_recording_given_as_a_saved_voice_says_to_use_speaker_wav(capsys, tmp_path, equal_bundle):
    rec = write_wav(tmp_path / "rec.wav", synthetic_voice(), 24000)
    rc, _, err = kztts_main(capsys, "synth", "Hello.", "-o", tmp_path / "x.wav", "--bundle", equal_bundle,
                            "--voice", rec)
    line = one_line(rc, err)
    assert f"{rec}: a recording, not a saved voice; give it as --speaker-wav {rec}" in line
    assert "allow_pickle" not in line and not (tmp_path / "x.wav").exists()


def test_synth_file_warnings_name_the_line_as_summary_json_does(capsys, caplog, tmp_path, equal_bundle):
    texts = tmp_path / "texts.jsonl"
    # line 2 (line 1 is blank); its max_frames cuts it before its end of speech: a warning naming it
    texts.write_text("\n" + json.dumps({"text": "Hello there.", "max_frames": 5}) + "\n")
    with caplog.at_level(logging.WARNING):
        rc, _, err = kztts_main(capsys, "synth", "--file", texts, "--out-dir", tmp_path / "out", "--bundle",
                                equal_bundle)
    assert rc == 0, err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [i["line"] for i in summary["items"]] == [2]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] + err.splitlines()
    assert any(f"{texts} line 2" in w for w in warned) and not any("request 0" in w for w in warned), warned
