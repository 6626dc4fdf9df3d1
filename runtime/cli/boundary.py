"""The one error boundary every ``kztts`` command runs inside.

A ``KzttsError`` (the user's input) and the operating-system errors a user can fix (permission,
not-a-directory, is-a-directory, exists, no space, read-only file system, missing file) become one
line ``kztts: error: <path>: <what>; <what to do>`` and exit code 2. Anything else is a bug: its
traceback is kept, followed by a line asking to report it.
"""
from __future__ import annotations

import errno
import os
import sys
import traceback
from typing import Callable

from kztts.core.errors import KzttsError

EXIT_USER = 2
EXIT_BUG = 1
EXIT_INTERRUPTED = 130

# errno -> (what happened, what to do)
_OS_ERRORS = {
    errno.EACCES: ("permission denied", "choose a location you can write to, or fix its permissions"),
    errno.EPERM: ("operation not permitted", "choose a location you can write to, or fix its permissions"),
    errno.EROFS: ("read-only file system", "write to a location on a writable file system"),
    errno.ENOTDIR: ("a part of the path is a file, not a directory", "fix the path"),
    errno.EISDIR: ("is a directory", "give a file name"),
    errno.EEXIST: ("already exists", "remove it, choose another name, or pass --overwrite where offered"),
    errno.ENOSPC: ("no space left on the device", "free some space or write elsewhere"),
    errno.EDQUOT: ("disk quota exceeded", "free some space or write elsewhere"),
    errno.ENOENT: ("no such file or directory", "check the path"),
}


def os_error_line(exc: OSError) -> str | None:
    """The one-line message of an expected OS error, or None for any other."""
    known = _OS_ERRORS.get(exc.errno)
    if known is None:
        return None
    what, todo = known
    where = exc.filename if exc.filename is not None else exc.filename2
    where = os.fsdecode(where) + ": " if where is not None else ""
    return f"{where}{what}; {todo}"


def run_command(func: Callable[[], int]) -> int:
    """Run ``func`` and return its exit code, or the boundary's (module docstring)."""
    try:
        return func()
    except KzttsError as exc:
        print(f"kztts: error: {exc}", file=sys.stderr)
        return EXIT_USER
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `kztts ... | head`: the reader left; nothing more to say
        try:
            sys.stdout = open(os.devnull, "w")  # the interpreter's final flush goes here
        except OSError:
            pass
        return EXIT_USER
    except OSError as exc:
        line = os_error_line(exc)
        if line is None:
            return _bug()
        print(f"kztts: error: {line}", file=sys.stderr)
        return EXIT_USER
    except Exception:
        return _bug()


def _bug() -> int:
    traceback.print_exc()
    print("kztts: this is a bug in kztts, not a problem with your input: please report it with the command "
          "you ran and the traceback above", file=sys.stderr)
    return EXIT_BUG
