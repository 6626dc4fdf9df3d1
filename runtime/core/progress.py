"""Progress of long work on stderr: phase lines (always, unless quiet) and bars (a terminal only).

Phases go through the ``kztts.core.progress`` logger; the CLI (:func:`configure`) prints them as
``kztts: <phase>`` on stderr and silences them with ``-q``. A library user sees them only if they
configure logging. Bars are tqdm bars, shown on a terminal and never when quiet or redirected, so
a log file holds phase lines, not bar redraws.
"""
from __future__ import annotations

import logging
import sys

LOGGER = "kztts.core.progress"
log = logging.getLogger(LOGGER)
_QUIET = [False]  # set by configure (-q)


def configure(quiet: bool) -> None:
    """Print phases on stderr as ``kztts: ...`` (the CLI); ``quiet`` silences phases and bars."""
    for h in list(log.handlers):
        log.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("kztts: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.WARNING if quiet else logging.INFO)
    log.propagate = False
    _QUIET[0] = quiet


def quiet() -> bool:
    """True under ``-q``: no phase lines, no bars."""
    return _QUIET[0]


def phase(message: str, *args) -> None:
    """One phase line (``message % args``)."""
    log.info(message, *args)


class Steps:
    """A bar over ``total`` steps on a terminal; :meth:`phase` names the current step (a phase
    line when there is no bar)."""

    def __init__(self, total: int, desc: str, unit: str = "step"):
        from tqdm import tqdm

        self.desc = desc
        self.bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr,
                        disable=True if quiet() else None)  # None: no bar unless stderr is a terminal

    def phase(self, text: str) -> None:
        if self.bar.disable:
            phase("%s: %s", self.desc, text)
        else:
            self.bar.set_postfix_str(text)

    def update(self, n: int = 1) -> None:
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()


def bar(iterable=None, **kw):
    """A tqdm bar on stderr, disabled when quiet or stderr is not a terminal."""
    from tqdm import tqdm

    return tqdm(iterable, file=sys.stderr, disable=True if quiet() else None, **kw)
