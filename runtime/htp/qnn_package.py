"""What the installed onnxruntime-qnn package offers: its folder, version, HTP backend
library and the Hexagon skels it ships (one per HTP architecture it can drive).

The win_arm64 wheel ships ``libQnnHtpV68Skel.so``, ``libQnnHtpV73Skel.so`` and
``libQnnHtpV81Skel.so`` (Hexagon binaries loaded onto the NPU; the same names on
Windows) next to ``QnnHtp.dll`` and the ``QnnHtpV<NN>Stub.dll`` files; a target whose
``htp_arch`` has no skel there cannot run on that machine's HTP. The linux x86_64 wheel
ships no skel: its ``libQnnHtp.so`` is a host simulator, which runs every arch, so
nothing is refused there.

Nothing here loads a library: the package is found with ``importlib`` and its folder
listed. ``$KZTTS_QNN_PACKAGE_DIR`` names another folder to inspect instead (a copied
package, or a test's fake one); it changes what this module reports, not which
library ``kztts.htp.qnn`` loads.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from kztts.htp.targets import Target, TargetError

log = logging.getLogger(__name__)

PACKAGE_ENV = "KZTTS_QNN_PACKAGE_DIR"
_SKEL = re.compile(r"^(?:lib)?QnnHtpV(\d+)Skel\.so$", re.IGNORECASE)

_warned: set[tuple[str, int]] = set()  # (package folder, arch) already warned about in this process
_warned_lock = threading.Lock()


class MissingSkelError(TargetError):
    """Strict mode: the installed QNN package has no HTP skel for the target's architecture."""


@dataclass(frozen=True)
class QnnPackage:
    """The QNN libraries a kztts process would use."""

    path: Path  # the folder holding the libraries
    version: str | None  # onnxruntime-qnn version
    qnn_sdk: str | None  # QAIRT/QNN SDK version it bundles
    skels: dict[int, Path]  # HTP arch (73) -> skel file

    @property
    def htp_backend(self) -> Path | None:
        """``libQnnHtp.so`` / ``QnnHtp.dll``, if present."""
        return _first(self.path, ("libQnnHtp.so", "QnnHtp.dll"))

    @property
    def ep_library(self) -> Path | None:
        """The plugin EP library ONNX Runtime registers."""
        return _first(self.path, ("libonnxruntime_providers_qnn.so", "onnxruntime_providers_qnn.dll"))

    def skel_names(self) -> str:
        """``libQnnHtpV73Skel.so (v73)``, comma-separated, for messages."""
        return ", ".join(f"{p.name} (v{a})" for a, p in sorted(self.skels.items())) or "none"

    def to_json(self) -> dict:
        return {"path": str(self.path), "version": self.version, "qnn_sdk": self.qnn_sdk,
                "ep_library": str(self.ep_library) if self.ep_library else None,
                "htp_backend": str(self.htp_backend) if self.htp_backend else None,
                "skels": [{"htp_arch": a, "file": p.name} for a, p in sorted(self.skels.items())]}


def _first(folder: Path, names: tuple[str, ...]) -> Path | None:
    for n in names:
        hits = [folder / n] + sorted(folder.glob(f"*/{n}"))  # Windows wheels may keep libraries in a subfolder
        for h in hits:
            if h.is_file():
                return h
    return None


def find_skels(folder: str | os.PathLike) -> dict[int, Path]:
    """HTP arch -> skel file for every ``(lib)QnnHtpV<NN>Skel.so`` in ``folder`` (and one level below)."""
    folder = Path(folder)
    out: dict[int, Path] = {}
    for p in sorted([*folder.glob("*"), *folder.glob("*/*")]):
        m = _SKEL.match(p.name)
        if m and p.is_file():
            out.setdefault(int(m.group(1)), p)
    return out


def package_dir() -> Path | None:
    """``$KZTTS_QNN_PACKAGE_DIR``, else the installed ``onnxruntime_qnn`` folder, else None."""
    env = os.environ.get(PACKAGE_ENV)
    if env:
        return Path(env).expanduser()
    try:
        spec = importlib.util.find_spec("onnxruntime_qnn")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _versions(folder: Path) -> tuple[str | None, str | None]:
    """(package version, QNN SDK version) from ``build_and_package_info.py``, read, not imported."""
    f = folder / "build_and_package_info.py"
    try:
        text = f.read_text()
    except OSError:
        return None, None
    found = dict(re.findall(r"^(__version__|qnn_version)\s*=\s*['\"]([^'\"]*)['\"]", text, re.MULTILINE))
    return found.get("__version__"), found.get("qnn_version")


def find_package() -> QnnPackage | None:
    """The QNN package this process would use, or None when there is none."""
    folder = package_dir()
    if folder is None:
        return None
    if not folder.is_dir():
        if os.environ.get(PACKAGE_ENV):
            raise TargetError(f"{PACKAGE_ENV}={folder}: not a folder; point it at an onnxruntime_qnn package "
                              "folder or unset it")
        return None
    version, sdk = _versions(folder)
    return QnnPackage(folder, version, sdk, find_skels(folder))


def skel_problem(target: Target, package: QnnPackage | None) -> str | None:
    """Why ``target``'s HTP cannot run with ``package`` (no skel for its arch), or None.
    A package that ships no skel at all (the x86-64 simulator) refuses nothing."""
    if package is None or not package.skels or target.soc.htp_arch in package.skels:
        return None
    arch = target.soc.htp_arch
    return (f"target {target.name!r} ({target.soc.name}) needs the HTP v{arch} skel (libQnnHtpV{arch}Skel.so), "
            f"but onnxruntime-qnn at {package.path} ships only {package.skel_names()}")


def check_target_skel(target: Target, strict: bool) -> str | None:
    """Refuse (strict: :class:`MissingSkelError`) or allow with one warning per process and arch
    (the reason is returned: the caller runs the CPU instead) a target without a skel here."""
    package = find_package()
    problem = skel_problem(target, package)
    if problem is None:
        return None
    if strict:
        raise MissingSkelError(f"strict mode: {problem}; use a target of one of those archs (`kztts devices` "
                               "lists them) or run without --strict to use the CPU")
    key = (str(package.path), target.soc.htp_arch)
    with _warned_lock:
        first = key not in _warned
        _warned.add(key)
    if first:
        log.warning("%s: running its HTP work on the CPU instead", problem)
    return problem


def host_is_simulator() -> bool:
    """An x86-64 host: the QNN HTP backend here can only be the simulator."""
    import platform

    return platform.machine().lower() in ("x86_64", "amd64", "x64")
