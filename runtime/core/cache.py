"""Where generated artifacts (tiny models, bundles, goldens) are cached."""
from __future__ import annotations

import os
import shlex
from pathlib import Path

from kztts.core import env


def cache_dir() -> Path:
    """``$KZTTS_CACHE`` if set, else ``~/.cache/kztts``."""
    return env.path("KZTTS_CACHE") or Path.home() / ".cache" / "kztts"


def portable_path(path: str | Path) -> str:
    """``path`` as a report may publish it: under the cache ``$KZTTS_CACHE/...``, under the working
    folder relative to it, under the home folder ``~/...``, else its name alone (a report read on
    another machine must not name folders of the machine that wrote it)."""
    p = Path(path)
    if not p.is_absolute():
        return str(path)
    p = Path(os.path.abspath(p))
    for base, label in ((Path(os.path.abspath(cache_dir())), "$KZTTS_CACHE"), (Path.cwd(), None),
                        (Path.home(), "~")):
        try:
            rel = p.relative_to(base)
        except ValueError:
            continue
        return str(rel) if label is None else f"{label}/{rel.as_posix()}"
    return p.name


def portable_command(command: str) -> str:
    """A command line with every absolute path in it (alone, after ``--flag=`` or after ``NAME=``, as in
    ``--quantized-bundle w4a16=/path``) made :func:`portable_path`."""
    words = []
    for word in shlex.split(command):
        flag, eq, value = word.partition("=") if "=" in word and not word.startswith("/") else ("", "", word)
        if value and Path(value).is_absolute():
            word = f"{flag}{eq}{portable_path(value)}"
        words.append(shlex.quote(word))
    return " ".join(words)
