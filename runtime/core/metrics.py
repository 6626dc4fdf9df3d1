"""Accuracy and timing summaries shared by the bench workers (numpy only)."""
from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
import psutil


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of matching rows (last axis), float64."""
    a = np.asarray(a, np.float64).reshape(-1, np.shape(a)[-1])
    b = np.asarray(b, np.float64).reshape(-1, np.shape(b)[-1])
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.sum(a * b, axis=1) / np.maximum(den, 1e-30)


def snr_db(signal: np.ndarray, reference: np.ndarray) -> float:
    """10 log10(|ref|^2 / |signal - ref|^2); inf when identical."""
    ref = np.asarray(reference, np.float64)
    err = np.asarray(signal, np.float64) - ref
    noise = float(np.sum(err * err))
    if noise == 0.0:
        return float("inf")
    return float(10.0 * np.log10(max(float(np.sum(ref * ref)), 1e-30) / noise))


def agreement(codes: np.ndarray, reference: np.ndarray) -> float:
    """Fraction of equal codes over the common frames (frames missing on either side count as different)."""
    a, b = np.asarray(codes), np.asarray(reference)
    n = max(a.shape[0], b.shape[0])
    if n == 0:
        return 1.0
    m = min(a.shape[0], b.shape[0])
    return float((a[:m] == b[:m]).sum()) / float(n * b.shape[1])


def median_ms(seconds: list[float], skip: int = 0) -> float | None:
    """Median in ms of ``seconds[skip:]`` (all of them if fewer remain)."""
    xs = seconds[skip:] if len(seconds) > skip else seconds
    return round(statistics.median(xs) * 1e3, 3) if xs else None


def peak_rss_mb() -> float:
    """This process's peak resident set, MB: the peak working set on Windows, VmHWM on Linux;
    elsewhere (macOS) psutil reports no peak, so the current resident set (a lower bound)."""
    mem = psutil.Process().memory_info()
    peak = getattr(mem, "peak_wset", None)  # Windows only
    if peak is None:
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024.0, 1)
        except OSError:
            pass
        peak = mem.rss
    return round(peak / (1024.0 * 1024.0), 1)


def accuracy(codes, tf_talker, tf_cp, wav_on_base, wav_own, base: dict) -> dict:
    """The accuracy columns against the baseline arrays (``base``: codes, talker_logits,
    cp_logits, wav)."""
    out = {"code_agreement": agreement(codes, base["codes"])}
    if tf_talker is not None:
        c = cosine_rows(tf_talker, base["talker_logits"])
        out.update(talker_cos_min=float(c.min()), talker_cos_mean=float(c.mean()),
                   talker_argmax_agreement=float(np.mean(np.argmax(tf_talker, -1) == np.argmax(base["talker_logits"], -1))))
    if tf_cp is not None:
        c = cosine_rows(tf_cp, base["cp_logits"])
        out.update(cp_cos_min=float(c.min()), cp_cos_mean=float(c.mean()),
                   cp_argmax_agreement=float(np.mean(np.argmax(tf_cp, -1) == np.argmax(base["cp_logits"], -1))))
    if wav_on_base is not None:
        out["snr_db"] = snr_db(wav_on_base, base["wav"])
    if wav_own is not None:
        n = min(len(wav_own), len(base["wav"]))
        out["e2e_snr_db"] = snr_db(wav_own[:n], base["wav"][:n])
    return out


# A timed row is flagged busy when the 1-minute load average before or after it exceeds the
# cores the row itself uses plus this margin: something else competed for the cores (a busy
# 2-core machine made a 2-thread reference 9x slower than its 1-thread run once).
# The load average lags by about a minute, so a row right after a heavier one can be flagged
# for that one's load: compare a flagged row again in a quiet run.
BUSY_MARGIN = 0.5


def is_busy(loads: list[float | None], threads: int, margin: float = BUSY_MARGIN) -> bool:
    """Whether any of the load averages taken around a row exceeds ``threads + margin``."""
    return any(x is not None and x > threads + margin for x in loads)


def as_list(x) -> list:
    """A row field that is one value (one round) or a list (merged rounds) as a list; None -> []."""
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]
