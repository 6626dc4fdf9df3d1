"""A piece of work in a fresh Python process: ``python -m MODULE SPEC.json``, result back as JSON.

Validation and benchmarks run work in a child process because the QNN HTP's fp16 mode is
per process (once a process opened an fp16 QNN session, later ones are fp16 too, docs/QNN_EP.md)
and because a process of its own gives clean peak-RSS and timing figures.

The protocol (numpy + the standard library only):

- parent, :func:`run_worker`: writes ``TAG.spec.json`` into the work folder (the spec's
  numpy arrays go to ``TAG.spec.npz`` next to it) with ``out`` naming ``TAG.result.json``,
  runs ``python -m MODULE TAG.spec.json`` and returns the result dict, arrays included;
- child, :func:`worker_main`: reads the spec (arrays restored), calls ``fn(spec) -> dict``
  and writes the result: its numpy arrays to ``TAG.result.npz``, everything else (JSON
  values) to ``TAG.result.json``, whose ``_arrays`` names the ``.npz``.

A failed child (non-zero exit, a signal, a timeout, no result written) raises
:class:`WorkerError` naming the module, the tag and, when a signal ended it, which one.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from kztts.core.errors import KzttsError, signal_note

log = logging.getLogger(__name__)

_ARRAYS = "_arrays"  # key naming the .npz that holds a spec's or a result's arrays


class WorkerError(KzttsError):
    """A worker process failed: ``cause`` says how, ``lines`` are the last lines of its output."""

    def __init__(self, module: str, tag: str, cause: str, lines: list[str], signal: int | None = None):
        self.module, self.tag, self.cause, self.lines, self.signal = module, tag, cause, lines, signal
        tail = "\n".join(lines[-12:])
        super().__init__(f"the worker {module} [{tag}] failed ({cause})" + (f":\n{tail}" if tail else ""))

    def brief(self) -> str:
        """One line: the last three lines of its output and, after a signal, which one."""
        parts = self.lines[-3:]
        if self.signal is not None:  # no traceback then: say which signal ended it
            parts = parts + [signal_note(self.signal)]
        return " | ".join(parts)


def _split_arrays(data: dict, npz: Path) -> dict:
    """``data`` without its numpy arrays, which are saved to ``npz`` (named under ``_arrays``)."""
    arrays = {k: v for k, v in data.items() if isinstance(v, np.ndarray)}
    plain = {k: v for k, v in data.items() if k not in arrays}
    if arrays:
        np.savez(npz, **arrays)
        plain[_ARRAYS] = str(npz)
    return plain


def _join_arrays(plain: dict) -> dict:
    """The inverse of ``_split_arrays``: the arrays of the named ``.npz`` put back."""
    path = plain.pop(_ARRAYS, None)
    if path is not None:
        with np.load(path) as npz:
            plain.update({k: npz[k] for k in npz.files})
    return plain


def run_worker(module: str, spec: dict, work_dir: Path | None, tag: str, *, env: dict | None = None,
               timeout: float | None = None) -> dict:
    """Run ``python -m module TAG.spec.json`` and return the child's result dict.

    ``spec``: JSON values and numpy arrays; ``work_dir``: where the spec and result files
    stay (None: a temporary folder, removed afterwards); ``env``: variables set on top of
    this process's environment; ``timeout``: seconds before the child is killed. Raises
    :class:`WorkerError` when the child fails."""
    if work_dir is None:
        with tempfile.TemporaryDirectory(prefix=f"kztts-{tag}-") as tmp:
            return run_worker(module, spec, Path(tmp), tag, env=env, timeout=timeout)
    work_dir = Path(work_dir)
    spec_path, out = work_dir / f"{tag}.spec.json", work_dir / f"{tag}.result.json"
    plain = _split_arrays({**spec, "out": str(out)}, work_dir / f"{tag}.spec.npz")
    spec_path.write_text(json.dumps(plain))
    try:
        proc = subprocess.run([sys.executable, "-m", module, str(spec_path)], capture_output=True, text=True,
                              env={**os.environ, **(env or {})}, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        output = e.stderr or e.stdout or ""
        output = output.decode(errors="replace") if isinstance(output, bytes) else output
        raise WorkerError(module, tag, f"timed out after {timeout:g} s", output.strip().splitlines()) from None
    if proc.returncode != 0 or not out.is_file():
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        if proc.returncode < 0:
            raise WorkerError(module, tag, signal_note(-proc.returncode), lines, signal=-proc.returncode)
        cause = f"exit {proc.returncode}" if proc.returncode else "it wrote no result"
        raise WorkerError(module, tag, cause, lines)
    return _join_arrays(json.loads(out.read_text()))


def worker_main(fn: Callable[[dict], dict], argv: list[str] | None = None) -> int:
    """The child side: ``python -m <module> SPEC.json`` runs ``fn(spec)`` and writes its result
    where ``spec["out"]`` says (numpy arrays of the result to an ``.npz`` next to it)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m <worker module> SPEC.json (written by kztts.core.worker_process.run_worker)",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    spec = _join_arrays(json.loads(Path(argv[0]).read_text()))
    out = Path(spec["out"])
    result = _split_arrays(fn(spec), out.with_suffix(".npz"))
    out.write_text(json.dumps(result) + "\n")
    return 0


SERVE_PREFIX = "KZTTS-E2E "  # marks the lines of a run server's answers (other output is ignored)


def serve_runs(run_once: Callable[[], dict], ready: dict) -> int:
    """A long-lived worker that serves runs one at a time: print ``SERVE_PREFIX + JSON(ready)``, then
    answer every ``run`` line on stdin with one ``SERVE_PREFIX + JSON(run_once())`` line; any other
    line ends it (``kztts.bench.e2e`` drives two of them, one per side)."""
    print(SERVE_PREFIX + json.dumps(ready), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        print(SERVE_PREFIX + json.dumps(run_once()), flush=True)
    return 0
