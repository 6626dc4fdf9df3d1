"""Bad input is refused before any work: exit 2, one line naming the file or variable, no traceback,
nothing left behind. Most cases run in-process through ``kztts.cli.main.main``."""
from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from kztts.cli import export as cli_export
from kztts.cli import main as cli
from kztts.core.audio import synthetic_voice

from support import kztts_main


def assert_refused(rc: int, err: str, *names: str) -> str:
    """Exit 2, exactly one stderr line ``kztts: error: ...`` naming each of ``names``, no traceback."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, err
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("kztts: error: "), err
    for name in names:
        assert str(name) in lines[0], err
    return lines[0]


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# ------------------------------------------------------------------ environment variables
@pytest.mark.parametrize("name, value", [
    ("KZTTS_THREADS", "999999"), ("KZTTS_THREADS", "-1"), ("KZTTS_THREADS", "many"),
    ("KZTTS_DECODER_THREADS", "999999"), ("KZTTS_DISABLE_QNN", "maybe"), ("KZTTS_SPIN", "2"),
    ("KZTTS_ATTENTION", "maybe"), ("KZTTS_TEMP", "hot"),
])
def test_bad_variable_is_refused_before_work(capsys, monkeypatch, tmp_path, name, value):
    monkeypatch.setenv(name, value)
    rc, _, err = kztts_main(capsys, "synth", "hello", "-o", tmp_path / "a.wav")
    assert_refused(rc, err, name)
    assert listing(tmp_path) == []


def test_huge_thread_count_returns_at_once(tmp_path):
    """The issue's hang: a fresh process with KZTTS_THREADS=999999 must answer in under 5 s."""
    env = {**os.environ, "KZTTS_THREADS": "999999"}
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "kztts.cli.main", "synth", "hello", "-o", str(tmp_path / "a.wav")],
                         capture_output=True, text=True, env=env, timeout=60)
    elapsed = time.monotonic() - start
    line = assert_refused(res.returncode, res.stderr, "KZTTS_THREADS", "999999")
    assert "out of range" in line
    assert elapsed < 5.0, f"{elapsed:.1f} s"
    assert listing(tmp_path) == []


@pytest.mark.parametrize("argv, name", [
    (["synth", "hello", "--decoder-threads", "999999"], "--decoder-threads"),
    (["bench", "--threads", "1,999999"], "--threads"),
])
def test_thread_flags_share_the_bound(capsys, tmp_path, argv, name):
    out = ["-o", tmp_path / "a.wav"] if argv[0] == "synth" else ["--out", tmp_path / "res"]
    rc, _, err = kztts_main(capsys, *argv, *out)
    assert_refused(rc, err, name, "999999")
    assert listing(tmp_path) == []


# ------------------------------------------------------------------ every subcommand, unwritable output
# subcommand -> argv; {loc} is the location under test. Commands that write put their output there;
# those that only read (validate, inspect) read their bundle from there. Another helper's commands
# that take no path are listed with None.
SUBCOMMANDS = {
    "make-tiny": ["make-tiny", "{loc}/model"],
    "export": ["export", "{tmp}/no-model", "-o", "{loc}/bundle"],
    "pack": ["pack", "{tmp}/no-bundle", "--target", "x-elite", "-o", "{loc}/device"],
    "synth": ["synth", "hello", "-o", "{loc}/a.wav"],
    "voice": ["voice", "create", "{tmp}/no-recording.wav", "-o", "{loc}/a.voice"],
    "bench": ["bench", "--out", "{loc}/results"],
    "calibrate": ["calibrate", "{tmp}/no-bundle", "-o", "{loc}/p.json"],
    "validate": ["validate", "{loc}/bundle", "--reference", "{tmp}/no-model"],
    "inspect": ["inspect", "{loc}/bundle"],
    "generate": ["generate", "{loc}/bundle", "hi"],
    "chat": ["chat", "{loc}/bundle"],
    "fetch-lm": ["fetch-lm", "--dir", "{loc}/checkpoints"],
    "serve": ["serve", "{loc}/bundle"],
    "devices": None,
}


def _subcommands() -> list[str]:
    import argparse

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


def test_the_walk_covers_every_subcommand():
    missing = [c for c in _subcommands() if c not in SUBCOMMANDS]
    assert missing == [], f"add these subcommands to SUBCOMMANDS: {missing}"


@pytest.fixture
def read_only_dir(tmp_path, monkeypatch):
    """A directory nobody may write: mode 0555, and (since root ignores modes, and CI runs as root)
    os.access reports it unwritable as it does for a read-only mount."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    real_access = os.access

    def access(path, mode, *a, **kw):
        if mode & os.W_OK and Path(path).resolve() == ro.resolve():
            return False
        return real_access(path, mode, *a, **kw)

    monkeypatch.setattr(os, "access", access)
    yield ro
    ro.chmod(0o755)


@pytest.mark.parametrize("where", ["read-only", "file-as-directory"])
@pytest.mark.parametrize("command", [c for c, argv in SUBCOMMANDS.items() if argv])
def test_every_subcommand_refuses_an_unusable_location(capsys, tmp_path, read_only_dir, where, command):
    if command not in _subcommands():
        pytest.skip(f"{command} is not a subcommand on this branch")
    if where == "read-only":
        loc = read_only_dir
    else:
        loc = tmp_path / "a-file"
        loc.write_text("not a directory\n")
    argv = [a.format(loc=loc, tmp=tmp_path) for a in SUBCOMMANDS[command]]
    named = next(a for a in argv if a.startswith(str(loc)))
    before = listing(tmp_path)
    start = time.monotonic()
    rc, _, err = kztts_main(capsys, *argv)
    assert_refused(rc, err, named)
    assert listing(tmp_path) == before
    assert time.monotonic() - start < 10, "the check must fire before the command's work"


@pytest.mark.skipif(not Path("/sys").is_dir(), reason="no /sys on this system")
def test_a_really_unwritable_location(capsys, tmp_path):
    """No mock: /sys refuses new files even to root (EACCES, or EROFS where it is mounted read-only)."""
    try:
        Path("/sys/kztts-probe").mkdir()
    except OSError:
        pass
    else:
        Path("/sys/kztts-probe").rmdir()
        pytest.skip("/sys is writable here")
    for argv in (["bench", "--out", "/sys/kztts-results"], ["synth", "hi", "-o", "/sys/a.wav"],
                 ["export", tmp_path / "m", "-o", "/sys/kztts-bundle"]):
        rc, _, err = kztts_main(capsys, *argv)
        assert_refused(rc, err, "/sys")


def test_export_onto_an_existing_file(capsys, tmp_path):
    (tmp_path / "bundle").write_text("a file\n")
    rc, _, err = kztts_main(capsys, "export", tmp_path / "no-model", "-o", tmp_path / "bundle")
    assert_refused(rc, err, str(tmp_path / "bundle"), "is a file")
    assert listing(tmp_path) == ["bundle"]


def test_bench_out_onto_a_file(capsys, tmp_path):
    (tmp_path / "results").write_text("a file\n")
    rc, _, err = kztts_main(capsys, "bench", "--out", tmp_path / "results")
    assert_refused(rc, err, str(tmp_path / "results"))
    assert listing(tmp_path) == ["results"]


# ------------------------------------------------------------------ the boundary itself
@pytest.mark.parametrize("code, words", [
    (errno.EACCES, "permission denied"), (errno.EROFS, "read-only file system"),
    (errno.ENOSPC, "no space left"), (errno.ENOTDIR, "not a directory"), (errno.EISDIR, "is a directory"),
    (errno.EEXIST, "already exists"),
])
def test_expected_os_errors_are_one_line(capsys, monkeypatch, tmp_path, code, words):
    def fail(args):
        raise OSError(code, os.strerror(code), str(tmp_path / "out" / "x.onnx"))

    monkeypatch.setattr(cli_export, "cmd_export", fail)
    rc, _, err = kztts_main(capsys, "export", tmp_path, "-o", tmp_path / "out")
    line = assert_refused(rc, err, str(tmp_path / "out" / "x.onnx"), words)
    assert "; " in line.split(words, 1)[1]  # and what to do


def test_a_bug_keeps_its_traceback_and_asks_for_a_report(capsys, monkeypatch, tmp_path):
    def fail(args):
        raise RuntimeError("an internal invariant broke")

    monkeypatch.setattr(cli_export, "cmd_export", fail)
    rc, _, err = kztts_main(capsys, "export", tmp_path, "-o", tmp_path / "out")
    assert rc == 1
    assert "Traceback" in err and "RuntimeError: an internal invariant broke" in err
    assert "please report it with the command" in err.splitlines()[-1]


# ------------------------------------------------------------------ outputs: all or none
def test_atomic_outputs_all_or_none(tmp_path):
    from kztts.core.atomic import atomic_outputs

    finals = [tmp_path / "p.json", tmp_path / "p.report.json", tmp_path / "p.png"]
    with pytest.raises(ValueError):
        with atomic_outputs(finals) as temps:
            temps[0].write_text("{}")
            temps[1].write_text("{}")
            raise ValueError("the plot failed")
    assert listing(tmp_path) == []
    with atomic_outputs(finals) as temps:
        for t in temps:
            t.write_text("x")
    assert listing(tmp_path) == ["p.json", "p.png", "p.report.json"]
    mask = os.umask(0)
    os.umask(mask)
    assert all((p.stat().st_mode & 0o777) == (0o666 & ~mask) for p in finals)


def test_calibrate_plot_into_a_missing_folder_leaves_nothing(capsys, tmp_path):
    rc, _, err = kztts_main(capsys, "calibrate", tmp_path / "no-bundle", "-o", tmp_path / "p.json",
                     "--plot", tmp_path / "missing" / "dir" / "x.png")
    assert_refused(rc, err, str(tmp_path / "missing" / "dir" / "x.png"), "does not exist")
    assert listing(tmp_path) == []


def test_synth_refuses_aac_before_synthesis(capsys, monkeypatch, tmp_path):
    import kztts.cli.synth

    def no_synthesis(*a, **kw):
        raise AssertionError("the model was opened before the output was checked")

    monkeypatch.setattr(kztts.cli.synth, "TTS", no_synthesis)
    rc, _, err = kztts_main(capsys, "synth", "hello", "-o", tmp_path / "out.aac")
    line = assert_refused(rc, err, str(tmp_path / "out.aac"), "'.aac'")
    assert ".flac, .mp3, .ogg, .wav" in line
    assert listing(tmp_path) == []


# ------------------------------------------------------------------ validate
def test_validate_frames_zero_is_refused_at_once(capsys, tmp_path):
    start = time.monotonic()
    rc, _, err = kztts_main(capsys, "validate", tmp_path / "b", "--reference", tmp_path / "m", "--frames", "0")
    assert_refused(rc, err, "--frames=0")
    assert time.monotonic() - start < 2


@pytest.mark.parametrize("variant", ["equal"], indirect=True)
def test_validate_refuses_another_checkpoint_before_any_replay(capsys, monkeypatch, tmp_path, tiny_model_dir,
                                                               tiny_bundle_dir):
    """Another checkpoint (here: the same files but one setting changed, so another sha256) is
    named in one line; the qwen-tts reference is never loaded."""
    import kztts.export.validate.tts as validate

    other = tmp_path / "other"
    for p in Path(tiny_model_dir).rglob("*"):
        if p.is_file():
            (other / p.relative_to(tiny_model_dir)).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(p, other / p.relative_to(tiny_model_dir))
    (other / "generation_config.json").unlink()
    (other / "generation_config.json").write_text(
        (Path(tiny_model_dir) / "generation_config.json").read_text().replace("{", '{"note": "retrained",', 1))

    def no_replay(*a, **kw):
        raise AssertionError("the reference was loaded")

    monkeypatch.setattr(validate, "load_reference", no_replay)
    rc, _, err = kztts_main(capsys, "-q", "validate", tiny_bundle_dir, "--reference", other, "--frames", "2")
    line = assert_refused(rc, err, str(other), "not the checkpoint this bundle was exported from")
    assert str(Path(tiny_model_dir).resolve()) in line


# ------------------------------------------------------------------ inspect
@pytest.mark.parametrize("variant", ["equal"], indirect=True)
def test_inspect_without_target_shows_the_cpu_plan(capsys, tiny_bundle_dir):
    rc, out, err = kztts_main(capsys, "inspect", tiny_bundle_dir)
    assert rc == 0, err
    assert out.startswith("no target (CPU only)")
    graph_table = out.split("\n\n")[0].splitlines()[2:]
    rows = {ln.split()[0]: ln.split() for ln in graph_table}
    assert rows["talker_gqa"][2] == "fused" and rows["talker"][2] == "plain" and rows["decoder"][2] == "-"
    assert re.search(r"talker_gqa\s+\S+\s+fused\s+[\d.]+ [kM]B", out)
    assert "execution plan: target none (CPU only)" in out
    assert re.search(r"talker_decode\s+talker_gqa\s+cpu", out)


# ------------------------------------------------------------------ speaker audio
def _voice(path: Path, seconds: float, sr: int, channels: int = 1) -> Path:
    mono = synthetic_voice(seconds, sr)
    sf.write(path, np.stack([mono] * channels, axis=1) if channels > 1 else mono, sr)
    return path


@pytest.mark.parametrize("seconds, sr, words", [(0.1, 24000, "lasts 0.10 s"), (600.0, 8000, "lasts 600.00 s"),
                                               (2.0, 4000, "sample rate 4000 Hz")])
def test_voice_recording_out_of_range_is_refused(capsys, monkeypatch, tmp_path, seconds, sr, words):
    import kztts.cli.synth

    voice = _voice(tmp_path / "voice.wav", seconds, sr)

    def no_synthesis(*a, **kw):
        raise AssertionError("the model was opened before the voice was checked")

    monkeypatch.setattr(kztts.cli.synth, "TTS", no_synthesis)
    for flag in (["--speaker-wav", voice], ["--ref-audio", voice, "--ref-text", "hello"]):
        rc, _, err = kztts_main(capsys, "synth", "hello", "-o", tmp_path / "a.wav", *flag)
        assert_refused(rc, err, str(voice), words)
    assert listing(tmp_path) == ["voice.wav"]


def test_voice_recording_in_range_is_noted(tmp_path, caplog):
    from kztts.core.audio import read_voice

    voice = _voice(tmp_path / "v.wav", 2.0, 48000, channels=2)
    with caplog.at_level("WARNING", logger="kztts.core.audio"):
        samples, sr = read_voice(voice)
    assert sr == 48000 and samples.ndim == 1 and len(samples) == 96000
    notes = [r.getMessage() for r in caplog.records]
    assert notes == [f"{voice}: mixed 2 channels down to mono, resampled 48000 Hz -> 24000 Hz (2.00 s)"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="kztts.core.audio"):
        read_voice(_voice(tmp_path / "plain.wav", 2.0, 24000))
    assert caplog.records == []


@pytest.mark.parametrize("variant", ["equal"], indirect=True)
def test_stereo_48k_voice_synthesises_with_a_note(tmp_path, tiny_bundle_dir):
    voice = _voice(tmp_path / "v.wav", 2.0, 48000, channels=2)
    res = subprocess.run([sys.executable, "-m", "kztts.cli.main", "synth", "hello", "-o", str(tmp_path / "a.wav"),
                          "--bundle", str(tiny_bundle_dir), "--speaker-wav", str(voice), "--max-frames", "2"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "mixed 2 channels down to mono, resampled 48000 Hz -> 24000 Hz" in res.stderr
    assert "Traceback" not in res.stderr


# ------------------------------------------------------------------ progress and quiet
def test_progress_lines_and_quiet(capsys, tmp_path, monkeypatch):
    from kztts.core import progress
    from kztts.core.build_cache import build_once

    def build(work):
        (work / "kztts.json").write_text("{}")

    progress.configure(quiet=False)
    build_once(tmp_path / "a", build)
    err = capsys.readouterr().err
    assert re.search(r"^kztts: building a \(once", err, re.M) and re.search(r"^kztts: built a in \d+ s", err, re.M)
    progress.configure(quiet=True)
    build_once(tmp_path / "b", build)
    assert capsys.readouterr().err == ""
    progress.configure(quiet=False)
