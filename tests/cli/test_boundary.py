"""kztts.cli.boundary: the one error boundary around every command. A ``KzttsError`` and the OS errors a user can
fix are one line and exit 2, Ctrl-C exits 130, a reader that left (``| head``) is quiet, anything else is a bug:
its traceback, a line asking for a report, exit 1 (through the commands: tests/cli/test_bad_input.py)."""
from __future__ import annotations

import errno
import os
import sys

import pytest

from kztts.cli.boundary import EXIT_BUG, EXIT_INTERRUPTED, EXIT_USER, os_error_line, run_command
from kztts.core.errors import KzttsError


def raising(exc: BaseException):
    def command() -> int:
        raise exc
    return command


def test_a_command_returns_its_own_exit_code():
    assert run_command(lambda: 0) == 0 and run_command(lambda: 3) == 3


def test_a_users_error_is_one_line_and_exit_2(capsys):
    assert run_command(raising(KzttsError("model.json: not a bundle; export one"))) == EXIT_USER == 2
    assert capsys.readouterr().err == "kztts: error: model.json: not a bundle; export one\n"


@pytest.mark.parametrize("code, words", [
    (errno.EACCES, "permission denied; choose a location you can write to, or fix its permissions"),
    (errno.EROFS, "read-only file system; write to a location on a writable file system"),
    (errno.ENOSPC, "no space left on the device; free some space or write elsewhere"),
    (errno.EEXIST, "already exists; remove it, choose another name, or pass --overwrite where offered"),
    (errno.ENOENT, "no such file or directory; check the path"),
])
def test_an_os_error_a_user_can_fix_names_the_path_and_what_to_do(capsys, code, words):
    exc = OSError(code, os.strerror(code), "/data/out.wav")
    assert os_error_line(exc) == f"/data/out.wav: {words}"
    assert run_command(raising(exc)) == EXIT_USER
    assert capsys.readouterr().err == f"kztts: error: /data/out.wav: {words}\n"
    second = OSError(code, "x")
    second.filename2 = "/second/path"
    assert os_error_line(second) == f"/second/path: {words}"
    assert os_error_line(OSError(code, "x")) == words  # no path: the words alone


def test_anything_else_is_a_bug_with_its_traceback(capsys):
    assert os_error_line(OSError(errno.EIO, "I/O error")) is None
    for exc in (RuntimeError("an invariant broke"), OSError(errno.EIO, "I/O error")):
        assert run_command(raising(exc)) == EXIT_BUG == 1
        err = capsys.readouterr().err
        assert "Traceback" in err and type(exc).__name__ in err
        assert err.splitlines()[-1].startswith("kztts: this is a bug in kztts, not a problem with your input")


def test_ctrl_c_and_a_reader_that_left(capsys, monkeypatch):
    assert run_command(raising(KeyboardInterrupt())) == EXIT_INTERRUPTED == 130
    monkeypatch.setattr("sys.stdout", None)  # replaced by the boundary: the interpreter's last flush goes nowhere
    assert run_command(raising(BrokenPipeError(errno.EPIPE, "Broken pipe"))) == EXIT_USER
    assert sys.stdout is not None and sys.stdout.name == os.devnull
    sys.stdout.close()
    assert capsys.readouterr().err == ""
