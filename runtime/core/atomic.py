"""Outputs checked before work starts, and written all-or-nothing, in a way that holds on Windows.

``check_writable`` / ``check_writable_dir`` fail in one line (a ``KzttsError`` naming the path)
when an output cannot be written, so a command refuses before its heavy work instead of after it
(a probe file is created, so a read-only file system is caught for root too).

``atomic_outputs`` gives temporary names next to the final ones (created empty and closed) and
renames them into place with ``os.replace`` only when the block finished without an error: a
reader sees the old file or the new one, never half of one; a failed or interrupted command leaves
no partial file; a group of outputs (``kztts calibrate``'s placement, report and plot) appears all
or none. Writing in place instead would be worse than a torn file where the destination is
memory-mapped (the text embedding table is ``np.load(mmap_mode="r")``): truncating a mapped file
makes the next read of the mapping a SIGBUS on Linux and is refused on Windows.

What happens when the destination is in use: on Linux and macOS the rename succeeds and a process
that has the old file open or mapped keeps reading the old contents (the old inode lives until it
is closed). On Windows a file (or a folder holding one) that is open or memory-mapped cannot be
replaced or moved: :func:`replace` then raises :class:`KzttsError` naming it, instead of a bare
``PermissionError``. The block must close whatever it opened on its temporary paths (Windows
cannot rename an open file).
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator, Sequence, Union

from kztts.core.errors import KzttsError

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


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _check_dir_writable(folder: Path, path: Path, what: str) -> None:
    """``folder`` exists, is a directory, and a file can be created in it (probed, so a read-only
    file system is caught for root too)."""
    if not folder.exists():
        existing = _nearest_existing(folder)
        if existing.is_dir():
            raise KzttsError(f"{path}: cannot write the {what}: directory {folder} does not exist; create it first")
        folder = existing
    if not folder.is_dir():
        raise KzttsError(f"{path}: cannot write the {what}: {folder} is a file, not a directory; fix the path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise KzttsError(f"{path}: cannot write the {what}: permission denied in {folder}; "
                         "choose a location you can write to")
    try:
        fd, probe = tempfile.mkstemp(prefix=".kztts-probe-", dir=folder)
    except OSError as exc:
        raise KzttsError(f"{path}: cannot write the {what}: {exc.strerror or exc} in {folder}; "
                         "choose a location you can write to") from None
    os.close(fd)
    os.unlink(probe)


def check_writable(path: str | os.PathLike, what: str) -> Path:
    """Fail now when the file ``path`` cannot be written (its directory must exist)."""
    path = Path(path)
    if path.is_dir():
        raise KzttsError(f"{path}: is a directory; give a file name for the {what}")
    parent = path.parent if str(path.parent) else Path(".")
    _check_dir_writable(parent, path, what)
    if path.exists() and not os.access(path, os.W_OK):
        raise KzttsError(f"{path}: cannot write the {what}: the file is read-only")
    return path


def check_writable_dir(path: str | os.PathLike, what: str, *, may_exist: bool = True,
                       create_parents: bool = False) -> Path:
    """Fail now when the directory ``path`` cannot be created or written into. ``may_exist``
    False: an existing directory is refused too (pass ``--overwrite``); ``create_parents``: the
    command makes missing parents itself (then the nearest existing ancestor must be writable)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise KzttsError(f"{path}: exists and is a file, not a directory; give another {what} path")
    if path.is_dir():
        if not may_exist:
            raise KzttsError(f"{path}: already exists; pass --overwrite to replace it")
        _check_dir_writable(path, path, what)
        return path
    parent = path.parent if str(path.parent) else Path(".")
    if create_parents and not parent.exists():
        parent = _nearest_existing(parent)
    _check_dir_writable(parent, path, what)
    return path


@contextlib.contextmanager
def atomic_outputs(paths: Sequence[str | os.PathLike]) -> Iterator[list[Path]]:
    """Temporary paths (one per output, in the same directory) to write; on success each is
    renamed onto its output (mode from the umask, as a normal file), on any error all are removed.
    An output the block did not create is left alone."""
    finals = [Path(p) for p in paths]
    temps: list[Path] = []
    try:
        for final in finals:
            parent = final.parent if str(final.parent) else Path(".")
            fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp" + final.suffix, dir=parent)
            os.close(fd)
            temps.append(Path(tmp))
        yield list(temps)
        mode = 0o666 & ~_umask()
        for tmp in temps:
            if tmp.exists():
                os.chmod(tmp, mode)  # mkstemp makes 0600
        for tmp, final in zip(temps, finals):
            if tmp.exists():
                replace(tmp, final)
    finally:
        for tmp in temps:
            with contextlib.suppress(OSError):
                tmp.unlink()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """One output of :func:`atomic_outputs`: a temporary file to write by name, renamed onto
    ``path`` when the block ends, removed when it raises."""
    with atomic_outputs([path]) as (tmp,):
        yield tmp


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)
