"""Every ``KZTTS_*`` environment variable, read and checked in one place.

A bad value is a ``KzttsError`` naming the variable, the value and what is accepted, raised
before any work starts (``kztts.cli.main.main`` calls :func:`check_environment` first). The sampling
overrides (``KZTTS_TEMP``...) are parsed by ``kztts.generation.settings`` with the same messages.

Thread counts accept 0 (ONNX Runtime's choice: all cores) up to :func:`max_threads`: a value
far above the core count only makes ONNX Runtime create that many threads (999999 never returns).
Booleans accept 1/0, true/false, yes/no, on/off (any case); an empty value is the default.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from kztts.core.errors import KzttsError

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


def max_threads() -> int:
    """The largest thread count accepted: 4 x the CPU count, at least 64."""
    return max(64, 4 * (os.cpu_count() or 1))


def check_threads(name: str, value: int, *, minimum: int = 0) -> int:
    """``value`` if ``minimum <= value <= max_threads()``, else an error naming ``name``
    (a variable or a flag such as ``--decoder-threads``)."""
    top = max_threads()
    if not minimum <= value <= top:
        zero = " (0 = all cores)" if minimum == 0 else ""
        raise KzttsError(f"{name}={value}: thread count out of range; give {minimum}..{top}{zero} "
                         f"({os.cpu_count()} CPUs here)")
    return value


def _raw(name: str, environ: Mapping[str, str] | None) -> str:
    return (os.environ if environ is None else environ).get(name, "").strip()


def threads(name: str, default: int | None = 0, environ: Mapping[str, str] | None = None) -> int | None:
    """A thread count from variable ``name``; ``default`` when unset or empty."""
    raw = _raw(name, environ)
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise KzttsError(f"{name}={raw!r} is not valid: expected an integer 0..{max_threads()} "
                         "(0 = all cores)") from None
    return check_threads(name, value)


def flag(name: str, default: bool = False, environ: Mapping[str, str] | None = None) -> bool:
    """A boolean variable: 1/0, true/false, yes/no, on/off (any case); ``default`` when unset."""
    raw = _raw(name, environ)
    if raw == "":
        return default
    if raw.lower() in TRUE:
        return True
    if raw.lower() in FALSE:
        return False
    raise KzttsError(f"{name}={raw!r} is not valid: use one of {'/'.join(TRUE)} or {'/'.join(FALSE)}")


def set_flag(name: str, value: bool = True) -> None:
    """Set a boolean variable for this process and the processes it starts (e.g. Ray tasks, HTP hosts)."""
    os.environ[name] = "1" if value else "0"


def choice(name: str, choices: tuple[str, ...], default: str, environ: Mapping[str, str] | None = None) -> str:
    """One of ``choices`` (any case) from variable ``name``; ``default`` when unset."""
    raw = _raw(name, environ).lower()
    if raw == "":
        return default
    if raw not in choices:
        raise KzttsError(f"{name}={raw!r} is not valid: use one of {', '.join(choices)}")
    return raw


def path(name: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """A path variable (``~`` expanded), or None when unset or empty."""
    raw = _raw(name, environ)
    return Path(raw).expanduser() if raw else None


# The values of KZTTS_ATTENTION: the CPU graphs' two attention forms, ONNX Runtime's fused
# GroupQueryAttention or plain ONNX ops (kztts.bundle.graphs names the graphs of each).
ATTENTIONS = ("fused", "plain")

# name -> reader; every documented non-sampling variable (README "Environment variables")
READERS = {
    "KZTTS_THREADS": lambda env: threads("KZTTS_THREADS", 0, env),
    "KZTTS_DECODER_THREADS": lambda env: threads("KZTTS_DECODER_THREADS", None, env),
    "KZTTS_SPIN": lambda env: flag("KZTTS_SPIN", False, env),
    "KZTTS_DISABLE_QNN": lambda env: flag("KZTTS_DISABLE_QNN", False, env),
    "KZTTS_ATTENTION": lambda env: choice("KZTTS_ATTENTION", ATTENTIONS, "fused", env),
    "KZTTS_CACHE": lambda env: path("KZTTS_CACHE", env),
    "KZTTS_QNN_CONFIGS": lambda env: path("KZTTS_QNN_CONFIGS", env),
}


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Read every variable of :data:`READERS` once, so a bad value fails before any work."""
    for read in READERS.values():
        read(environ)
