"""Exports and crashes: a destination has one writer at a time (the second fails at once,
in one line), staging folders of killed runs are removed by the next run, and a published
directory has the mode of any new directory (umask), not mkdtemp's 0o700."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kztts.core.build_cache import build_once, exclusive_output, output_lock_path, remove_stale_stages, staged_dir
from kztts.core.errors import KzttsError

# A writer that stages ``out`` under its lock, says "ready", and holds both until stdin closes.
_HOLDER = """
import sys
from pathlib import Path
from kztts.core.build_cache import exclusive_output, staged_dir

out = Path(sys.argv[1])
with exclusive_output(out), staged_dir(out) as work:
    print("ready", flush=True)
    sys.stdin.read()
    (work / "kztts.json").write_text("{}")
"""


@pytest.fixture
def holder(tmp_path):
    """A second process writing ``tmp_path/bundle``; yields (out, process)."""
    out = tmp_path / "bundle"
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(out)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield out, proc
    finally:
        if proc.poll() is None:
            proc.stdin.close()
            proc.wait(timeout=30)


def _dead_pid() -> int:
    """The pid of a process that has exited (reused only after the pid space wraps)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_second_writer_fails_at_once_naming_the_lock_and_the_process(holder):
    out, proc = holder
    started = time.perf_counter()
    with pytest.raises(KzttsError) as err:
        with exclusive_output(out):
            pytest.fail("the lock was taken twice")
    msg = str(err.value)
    assert time.perf_counter() - started < 2 and "\n" not in msg
    assert str(output_lock_path(out)) in msg and f"pid {proc.pid}" in msg
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    assert (out / "kztts.json").is_file()  # the first writer finished undisturbed
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no lock or staging folder beside it
    with exclusive_output(out):  # and the lock is free again
        pass


def test_cli_export_to_a_destination_being_written_fails_before_any_work(holder, capsys):
    from kztts.cli.main import main
    from kztts.export.tts.tiny import cached_tiny

    pytest.importorskip("torch", reason="kztts export needs the export extra")
    out, proc = holder
    model = cached_tiny("proj")
    started = time.perf_counter()
    assert main(["-q", "export", str(model), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert time.perf_counter() - started < 20, "the refusal came after the export's work"
    assert err.startswith("kztts: error: ") and "\n" not in err
    assert str(output_lock_path(out)) in err and f"pid {proc.pid}" in err
    assert main(["export", str(model), "-o", str(out), "--weights", "int8"]) == 2  # the variant path too
    assert f"pid {proc.pid}" in capsys.readouterr().err


def test_staging_folders_of_dead_processes_are_removed_by_the_next_run(tmp_path, holder):
    out, proc = holder  # a live writer of ``out``: its staging folder must stay
    live = [p for p in tmp_path.iterdir() if p.name.startswith(f".{out.name}.tmp-{proc.pid}-")]
    assert len(live) == 1
    dead = tmp_path / f".{out.name}.tmp-{_dead_pid()}-abcd1234"
    (dead / out.name).mkdir(parents=True)
    (dead / out.name / "talker.onnx").write_bytes(b"x" * 1000)
    other = tmp_path / f".other.tmp-{_dead_pid()}-abcd1234"  # another destination's: not ours to judge
    other.mkdir()

    assert remove_stale_stages(out) == [dead]
    assert not dead.exists() and live[0].is_dir() and other.is_dir()
    # staging a destination sweeps its stale folders first
    mine = tmp_path / "mine"
    dead_mine = tmp_path / f".mine.tmp-{_dead_pid()}-zz"
    dead_mine.mkdir()
    with staged_dir(mine) as work:
        assert not dead_mine.exists()
        (work / "kztts.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".mine.")) == []


@pytest.mark.parametrize("mask", [0o022, 0o027], ids=["umask022", "umask027"])
def test_published_directories_have_the_mode_of_a_new_directory(tmp_path, mask):
    old = os.umask(mask)
    try:
        with staged_dir(tmp_path / "staged") as work:
            (work / "graphs").mkdir()
            (work / "kztts.json").write_text("{}")
        built = build_once(tmp_path / "cache" / "built", lambda w: (w / "kztts.json").write_text("{}"))
    finally:
        os.umask(old)
    expected = 0o777 & ~mask
    for d in (tmp_path / "staged", tmp_path / "staged" / "graphs", built):
        assert d.stat().st_mode & 0o777 == expected, f"{d}: {oct(d.stat().st_mode & 0o777)}"


@pytest.mark.slow
def test_two_exports_to_one_destination_one_succeeds_the_other_fails_in_one_line(tmp_path):
    """Two real ``kztts export`` of the tiny checkpoint started together: one writes a complete,
    working bundle with a normal mode, the other exits 2 with one line naming the lock."""
    import numpy as np

    from kztts import TTS, Voice
    from kztts.export.tts.tiny import cached_tiny

    model, out = cached_tiny("proj"), tmp_path / "bundle"
    cli = Path(sys.executable).with_name("kztts")
    procs = [subprocess.Popen([str(cli), "export", str(model), "-o", str(out)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = sorted((p.wait(timeout=900), p.communicate()[1]) for p in procs)
    (ok, _), (refused, err) = results
    assert (ok, refused) == (0, 2)
    lines = [line for line in err.splitlines() if line.startswith("kztts: error: ")]
    assert len(lines) == 1 and str(output_lock_path(out)) in lines[0], err
    assert out.stat().st_mode & 0o777 == 0o777 & ~_umask()
    assert [p.name for p in tmp_path.iterdir()] == ["bundle"]  # no lock or staging folder beside it
    tts = TTS(out)
    res = tts.synthesize("Hello.", Voice(np.ones(tts.speaker_size, np.float32)), max_frames=4)
    assert res.frames > 0


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
