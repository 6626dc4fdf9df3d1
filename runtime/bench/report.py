"""The bench's outputs: ``results.json``, ``results.csv``, ``results.md`` and ``pareto.png``."""
from __future__ import annotations

import csv
import json
import logging
import math
import platform
from pathlib import Path

from kztts.bundle.graphs import PRECISION_COLOURS
from kztts.core.metrics import as_list

log = logging.getLogger(__name__)


def cpu_name() -> str:
    """The CPU model, for the header of a benchmark table."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"

# /proc/cpuinfo flags -> the names a reader compares hosts by (ONNX Runtime's int4/int8 kernels use them)
_ISA_FLAGS = (("avx2", "AVX2"), ("avx512f", "AVX-512"), ("avx512_vnni", "VNNI"), ("avx_vnni", "AVX-VNNI"),
              ("amx_tile", "AMX"))


def cpu_isa(flags: str | None = None) -> str:
    """The vector extensions of this CPU that decide kernel speed, e.g. ``AVX2 AVX-512 VNNI AMX``
    (``flags``: a /proc/cpuinfo flags line, else this machine's)."""
    if flags is None:
        try:
            flags = next((ln.split(":", 1)[1] for ln in Path("/proc/cpuinfo").read_text().splitlines()
                          if ln.startswith("flags")), "")
        except OSError:
            flags = ""
    have = set(flags.split())
    names = [name for flag, name in _ISA_FLAGS if flag in have]
    return " ".join(names) if names else "unknown ISA"


# (key, header, format) of the table columns, speed first, then accuracy
COLUMNS = [
    ("name", "configuration", "{}"),
    ("prefill_ms", "prefill ms", "{:.1f}"),
    ("talker_ms", "talker ms/frame", "{:.1f}"),
    ("cp_ms", "CP ms/frame", "{:.1f}"),
    ("decoder_ms", "decoder ms/frame", "{:.1f}"),
    ("frame_ms", "frame ms", "{:.1f}"),
    ("frame_wall_ms", "frame wall ms", "{:.1f}"),
    ("frame_rtf", "RTF (frame)", "{:.3f}"),
    ("rtf", "RTF (run)", "{:.3f}"),
    ("ttfa_p50_ms", "first audio p50 ms", "{:.0f}"),
    ("ttfa_p95_ms", "first audio p95 ms", "{:.0f}"),
    ("peak_rss_mb", "peak RSS MB", "{:.0f}"),
    ("runs_per_frame", "runs/frame", "{:.2f}"),
    ("speedup", "speed-up vs ref", "{:.2f}x"),
    ("fps", "frames/s (all streams)", "{:.1f}"),  # batch rows (kztts.bench.batch_rows)
    ("fps_talker_cp", "T+CP frames/s", "{:.1f}"),
    ("talker_limit_pct", "talker % of limit", "{:.0f}%"),
    ("cp_limit_pct", "CP % of limit", "{:.0f}%"),
    ("load", "load avg before/after", "{}"),
    ("talker_cos_min", "talker cos min", "{:.6f}"),
    ("cp_cos_min", "CP cos min", "{:.6f}"),
    ("talker_argmax_agreement", "talker argmax TF", "{:.3f}"),
    ("cp_argmax_agreement", "CP argmax TF", "{:.3f}"),
    ("code_agreement", "codes equal", "{:.4f}"),
    ("snr_db", "audio SNR dB", "{:.1f}"),
    # sampled speech (``kztts bench --quality``; kztts.bench.quality_rows.attach): shown when measured
    ("natural_eos_rate", "natural EOS (sampled)", "{:.0%}"),
    ("silence_pct", "silence % (sampled)", "{:.1f}"),
    ("dnsmos_ovrl", "DNSMOS OVRL", "{:.2f}"),
    ("asr_wer_mean", "WER (ASR)", "{:.1%}"),
    ("asr_cer_mean", "CER (ASR)", "{:.1%}"),
    ("quality_flags", "quality flags", "{}"),
]
QUALITY_KEYS = frozenset({"natural_eos_rate", "silence_pct", "dnsmos_ovrl", "asr_wer_mean", "asr_cer_mean",
                          "quality_flags"})


# columns that are speed measurements: an untimed row (HTP simulator) shows "sim" there
TIMING_KEYS = frozenset({"prefill_ms", "talker_ms", "cp_ms", "decoder_ms", "frame_ms", "frame_wall_ms", "frame_rtf", "rtf",
                         "ttfa_ms", "ttfa_p50_ms", "ttfa_p95_ms", "runs_per_frame", "speedup", "fps", "fps_talker_cp"})
HTP_NOTE = ("HTP rows (htp-sim/...): the target's static graphs on onnxruntime-qnn's x86 HTP simulator, for "
            "accuracy only and NEVER timed (the simulator is 50-200x slower than a device): timing columns show "
            "'sim'; CP argmax of an HTP row = greedy cp_frame codes on the HTP from the fp32 hidden states and "
            "CB0 of G, against G (marked 'codes'); audio SNR = the decoder the target uses on G")


def _fmt(value, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def _cell(row: dict, key: str, fmt: str) -> str:
    """One table cell: "sim" for the timing columns of an untimed row; an HTP row's Code
    Predictor agreement is its greedy codes match (its cp_frame returns codes, not logits)."""
    if row.get("timed") is False and key in TIMING_KEYS:
        return "sim"
    if key == "cp_argmax_agreement" and row.get(key) is None and row.get("cp_codes_match") is not None:
        return f"{row['cp_codes_match']:.3f} codes"
    if key == "load":
        return load_cell(row)
    return _fmt(row.get(key), fmt)


def load_cell(row: dict) -> str:
    """The 1-minute load averages around the row's rounds, "BUSY" when ``kztts.core.metrics.is_busy``."""
    before, after = as_list(row.get("load_avg_before")), as_list(row.get("load_avg_after"))
    if not before and not after:
        return "-"
    cell = " ".join(f"{b if b is not None else '-'}/{a if a is not None else '-'}"
                    for b, a in zip(before, after + [None] * (len(before) - len(after))))
    return cell + (" BUSY" if row.get("busy") else "")


def markdown(rows: list[dict], header: str) -> str:
    sampled = any("natural_eos_rate" in r for r in rows)
    cols = [c for c in COLUMNS if sampled or c[0] not in QUALITY_KEYS]
    lines = [header, "", "| " + " | ".join(h for _, h, _ in cols) + " |",
             "|" + "|".join("---" if k in ("name", "quality_flags") else "---:" for k, _, _ in cols) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r, k, f) for k, _, f in cols) + " |")
    return "\n".join(lines) + "\n"


def write_csv(rows: list[dict], path: Path) -> None:
    keys = [k for k, _, _ in COLUMNS] + sorted({k for r in rows for k in r} - {k for k, _, _ in COLUMNS}
                                               - {"times_ms", "runs", "error"})
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) for k in keys})


def pareto(rows: list[dict], path: Path, title: str) -> None:
    """Accuracy (greedy code agreement, and audio SNR) against the frame real-time factor;
    the Pareto front (no row both faster and more accurate) is joined by a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
    for ax, key, label in ((axes[0], "code_agreement", "greedy codes equal to fp32 bundle"),
                           (axes[1], "talker_cos_min", "teacher-forced talker logits cosine (min)")):
        pts = [(r["frame_rtf"], r[key], r) for r in rows  # untimed rows (HTP simulator) have no place here
               if r.get("timed") is not False and r.get("frame_rtf") is not None and r.get(key) is not None]
        for x, y, r in pts:
            ref = r.get("kind") == "reference"
            ax.scatter([x], [y], marker="*" if ref else "o", s=120 if ref else 40,
                       color="black" if ref else PRECISION_COLOURS.get(r.get("weights", "fp32"), "tab:gray"))
            ax.annotate(r["name"], (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
        front, best = [], -math.inf
        for x, y, _ in sorted(pts, key=lambda p: (p[0], -p[1])):
            if y > best:
                front.append((x, y))
                best = y
        if front:
            ax.plot(*zip(*front), "--", color="grey", linewidth=1)
        ax.axvline(1.0, color="red", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("real-time factor per frame (talker + CP + decoder) / 80 ms; < 1 is faster than real time;\n"
                      "batch rows: / B streams (1 / throughput: audio seconds made per second)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    fig.suptitle(title + "\n(blue fp32, orange int8, green int4, star qwen-tts PyTorch)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_all(rows: list[dict], meta: dict, out_dir: Path, extra: str = "") -> dict[str, Path]:
    """The four outputs; ``extra``: markdown appended after the table (the end-to-end table)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "results.json", "csv": out_dir / "results.csv", "md": out_dir / "results.md",
             "png": out_dir / "pareto.png"}
    table = markdown(rows, meta["header"]) + extra
    paths["json"].write_text(json.dumps({**meta, "rows": rows, "table": table}, indent=1, default=str) + "\n")
    write_csv(rows, paths["csv"])
    paths["md"].write_text(table)
    try:
        pareto(rows, paths["png"], meta["header"].splitlines()[0])
    except ImportError:
        log.warning("matplotlib is not installed: no Pareto plot (pip install matplotlib)")
        paths.pop("png")
    return paths
