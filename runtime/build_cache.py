"""Build-once directories: a key from the code that builds them, and a locked, staged, atomic build.

Cached artifacts (tiny models, bundles, precision variants, HTP bundles) are directories named
after what they are built from, including :func:`code_key` of the code that builds them, so a
code change builds a new one. :func:`build_once` builds such a directory at most once: other
processes (or threads) asking for the same one wait on a file lock next to it, then reuse it.
A directory is written through :func:`staged_dir`, so it is either complete or absent.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterator, Optional, Union

from filelock import FileLock

from kztts.atomic import replace
from kztts.errors import KzttsError
from kztts.progress import phase

log = logging.getLogger(__name__)

Source = Union[str, os.PathLike, ModuleType]


def code_key(*sources: Source, extra: bytes = b"", length: int = 12) -> str:
    """The first ``length`` hex digits of the sha256 of the ``sources`` files' bytes (a module
    stands for its file), in order, then ``extra`` (options that shape the build)."""
    h = hashlib.sha256()
    for src in sources:
        h.update(Path(src.__file__ if isinstance(src, ModuleType) else src).read_bytes())
    h.update(extra)
    return h.hexdigest()[:length]


@contextmanager
def staged_dir(out: Path) -> Iterator[Path]:
    """An empty directory to write ``out`` into, renamed to ``out`` (replacing it) when the block
    ends and removed when it raises, so ``out`` is never left half written.

    It is ``out.name`` inside a private ``.<name>.tmp-*`` directory next to ``out`` (same file
    system, so the rename is atomic); whatever a builder stages inside it goes with it."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        work = stage / out.name
        work.mkdir()  # (not the 0700 of mkdtemp: the published directory is an ordinary one)
        yield work
        if out.exists():
            # move the old one aside first: ``out`` is never missing while the new one has no name.
            # On Windows this fails while a file in it is open or mapped: a one-line KzttsError.
            replace(out, stage / ".replaced", what=out)
        replace(work, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def build_once(dest: Path, build: Callable[[Path], object], *, marker: str = "kztts.json",
               replaces: Optional[str] = None) -> Path:
    """``dest``, built by ``build(work)`` unless it is already complete (holds ``marker``).

    ``build`` writes into ``work``, an empty staging directory that becomes ``dest`` only when
    ``build`` returns and ``work/marker`` exists; if it raises, nothing is left. A file lock
    ``.<name>.lock`` next to ``dest`` makes a concurrent caller wait and then reuse the result.
    ``replaces``, a glob in ``dest``'s directory, names older builds (other code keys) of the
    same thing, removed before building."""
    dest = Path(dest)
    if (dest / marker).is_file():
        return dest
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(dest.parent / f".{dest.name}.lock"))
        lock.acquire()
    except OSError as exc:
        raise KzttsError(f"cannot write to the cache directory {dest.parent}: {exc.strerror or exc}") from exc
    try:
        if (dest / marker).is_file():  # built by whoever held the lock before us
            return dest
        stale = list(dest.parent.glob(f".{dest.name}.tmp-*"))  # left by a killed build
        stale += [p for p in dest.parent.glob(replaces) if p != dest] if replaces else []
        for old in stale:
            log.info("removing %s", old)
            shutil.rmtree(old, ignore_errors=True)
        phase("building %s (once: later runs reuse it from %s)", dest.name, dest.parent)
        start = time.monotonic()
        with staged_dir(dest) as work:
            build(work)
            if not (work / marker).is_file():
                raise RuntimeError(f"building {dest} did not write {marker}")
        phase("built %s in %.0f s", dest.name, time.monotonic() - start)
    finally:
        lock.release()
    return dest
