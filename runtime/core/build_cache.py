"""Build-once directories: a key from the code that builds them, and a locked, staged, atomic build.

Cached artifacts (tiny models, bundles, precision variants, HTP bundles) are directories named
after what they are built from, including :func:`code_key` of the code that builds them, so a
code change builds a new one. :func:`build_once` builds such a directory at most once: other
processes (or threads) asking for the same one wait on a file lock next to it, then reuse it.
A directory is written through :func:`staged_dir`, so it is either complete or absent; its
staging folders are named ``.<name>.tmp-<pid>-<random>``, so the next run removes those of a
process that was killed (:func:`remove_stale_stages`). :func:`exclusive_output` is the lock of a
user's destination (``kztts export -o``, ``kztts pack -o``): a second writer fails at once instead of waiting;
:func:`check_output` refuses a full one, :func:`disk_bytes` counts what one holds.
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

from filelock import FileLock, Timeout

from kztts.core.atomic import replace
from kztts.core.cache import cache_dir
from kztts.core.errors import KzttsError
from kztts.core.progress import phase

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


def lock_path(dest: Path) -> Path:
    """The lock file of a cached ``dest``: ``.<name>.lock`` next to it (kept after use: deleting
    a lock file another process has opened would let a third one take a second lock)."""
    dest = Path(dest)
    return dest.parent / f".{dest.name}.lock"


def output_lock_path(out: Path) -> Path:
    """The lock of a user's destination ``out``: in the cache (``locks/<name>-<hash of its real
    path>.lock``), not next to ``out``, so nothing is left beside what the user asked for."""
    real = os.path.normcase(str(Path(out).resolve()))
    return cache_dir() / "locks" / f"{Path(out).name}-{hashlib.sha256(real.encode()).hexdigest()[:16]}.lock"


def _stage_prefix(out: Path) -> str:
    return f".{out.name}.tmp-"


def _stage_pid(stage: Path, out: Path) -> int | None:
    """The pid in a staging folder's name ``.<name>.tmp-<pid>-<random>`` (None: another name)."""
    pid, sep, _ = stage.name[len(_stage_prefix(out)):].partition("-")
    return int(pid) if sep and pid.isdigit() else None


def _alive(pid: int) -> bool:
    import psutil  # portable (os.kill(pid, 0) is not a probe on Windows)

    return pid == os.getpid() or psutil.pid_exists(pid)


def remove_stale_stages(out: Path) -> list[Path]:
    """Remove the staging folders of ``out`` whose process is no longer alive; the removed ones."""
    out = Path(out)
    stale = [p for p in out.parent.glob(f"{_stage_prefix(out)}*")
             if p.is_dir() and (pid := _stage_pid(p, out)) is not None and not _alive(pid)]
    for old in stale:
        log.info("removing %s (left by process %s, which is gone)", old, _stage_pid(old, out))
        shutil.rmtree(old, ignore_errors=True)
    return stale


def writers_of(out: Path) -> list[int]:
    """The live processes other than this one that are staging ``out`` (their pids)."""
    out = Path(out)
    pids = {_stage_pid(p, out) for p in out.parent.glob(f"{_stage_prefix(out)}*")}
    return sorted(p for p in pids if p is not None and p != os.getpid() and _alive(p))


def check_output(out_dir: Path, overwrite: bool) -> None:
    """Refuse to replace a non-empty ``out_dir`` (or a file in its place) unless ``overwrite`` (``--overwrite``)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())) and not overwrite:
        raise KzttsError(f"{out_dir}: exists and is not empty; choose another -o or pass --overwrite")


def disk_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder``, each hard-linked file once (a variant links its base's files)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for f in Path(folder).rglob("*"):
        st = f.stat()
        if f.is_file() and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


@contextmanager
def scratch_dir(out: Path) -> Iterator[Path]:
    """A private folder ``.<name>.tmp-<pid>-<random>`` next to ``out`` (same file system), removed
    when the block ends; the stale ones of ``out`` are removed first."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_stages(out)
    stage = Path(tempfile.mkdtemp(prefix=f"{_stage_prefix(out)}{os.getpid()}-", dir=out.parent))
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


@contextmanager
def exclusive_output(out: Path) -> Iterator[None]:
    """Hold the lock of ``out`` (:func:`output_lock_path`) for the block. If another process holds
    it, fail at once with a ``KzttsError`` naming the lock and that process: two writers of one
    destination would otherwise replace each other's result without a word."""
    out = Path(out)
    path = output_lock_path(out)
    lock = FileLock(str(path), timeout=0)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except Timeout:
        who = ", ".join(f"pid {p}" for p in writers_of(out)) or "another process"
        raise KzttsError(f"{out}: {who} is writing it (lock {path}); wait until it has finished, "
                         "or write elsewhere") from None
    except OSError as exc:
        raise KzttsError(f"{path}: cannot create the lock of {out}: {exc.strerror or exc}; set $KZTTS_CACHE "
                         "to a writable directory") from exc
    try:
        yield
    finally:
        lock.release()


@contextmanager
def staged_dir(out: Path) -> Iterator[Path]:
    """An empty directory to write ``out`` into, renamed to ``out`` (replacing it) when the block
    ends and removed when it raises, so ``out`` is never left half written.

    It is ``out.name`` inside a :func:`scratch_dir` next to ``out`` (same file system, so the
    rename is atomic); whatever a builder stages inside it goes with it. The published directory
    has the mode of any new directory (0o777 & ~umask), not the 0o700 of the scratch folder."""
    out = Path(out)
    with scratch_dir(out) as stage:
        work = stage / out.name
        work.mkdir()
        yield work
        if out.exists():
            # move the old one aside first: ``out`` is never missing while the new one has no name.
            # On Windows this fails while a file in it is open or mapped: a one-line KzttsError.
            replace(out, stage / ".replaced", what=out)
        replace(work, out)


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
        lock = FileLock(str(lock_path(dest)))
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
