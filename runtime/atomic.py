"""Atomic replacement of files and directories that also holds on Windows.

A file is written under a temporary name next to its destination, closed, then renamed onto it
with ``os.replace``, so a reader sees the old file or the new one, never half of one. Writing in
place instead would be worse than a torn file where the destination is memory-mapped (the text
embedding table is ``np.load(mmap_mode="r")``): truncating a mapped file makes the next read of the
mapping a SIGBUS on Linux and is refused on Windows.

What happens when the destination is in use: on Linux and macOS the rename succeeds and a process
that has the old file open or mapped keeps reading the old contents (the old inode lives until it
is closed). On Windows a file (or a folder holding one) that is open or memory-mapped cannot be
replaced or moved: :func:`replace` then raises :class:`KzttsError` naming it, instead of a bare
``PermissionError``.
"""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Union

from kztts.errors import KzttsError

PathLike = Union[str, os.PathLike]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def replace(src: PathLike, dst: PathLike, *, what: PathLike | None = None) -> None:
    """``os.replace(src, dst)``; a file in use (Windows) raises :class:`KzttsError` naming ``what``
    (default ``dst``; the folder being moved aside when that is what fails)."""
    try:
        os.replace(src, dst)
    except PermissionError as exc:
        raise KzttsError(f"cannot replace {what or dst}: {exc.strerror or exc}; on Windows a file (or a folder holding "
                         "one) that a program has open or memory-mapped, e.g. a bundle a TTS session is "
                         "using, cannot be replaced: close that program or session and retry") from exc


@contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """A temporary file next to ``path`` (created empty, closed) for the block to write by name;
    it becomes ``path`` with an ordinary file's mode when the block ends, and is removed when the
    block raises. The block must close whatever it opened on it (Windows cannot rename an open
    file)."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file a normal file's mode
        replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def write_text(path: PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)
