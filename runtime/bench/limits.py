"""The bench rows' share of the host's streaming bandwidth and their load flags.

``probe_threads`` measures the bandwidth (``kztts.bench.bandwidth.probe``) once per thread
count; the bench calls it before and after the timed rows. ``annotate`` then gives every
timed row (the qwen-tts reference reads the fp32 weights of the fp32 bundle) its bytes per
Talker step and per Code Predictor frame, its "% of limit" against the larger of the two
probes at its thread count (the limit is what the host can do), and its ``busy`` flag
(``kztts.core.metrics.is_busy`` on the load averages around each of its rounds).
"""
from __future__ import annotations

import logging
from pathlib import Path

from kztts.bench import bandwidth
from kztts.bundle.manifest import read_manifest
from kztts.core.metrics import BUSY_MARGIN, as_list, is_busy

log = logging.getLogger(__name__)


def probe_threads(thread_counts: list[int]) -> dict[int, dict]:
    """{threads: probe result} for each thread count."""
    out = {}
    for t in thread_counts:
        out[t] = bandwidth.probe(t)
        log.info("streaming bandwidth, %d thread(s): %.2f GB/s", t, out[t]["gb_s"])
    return out


def limit_gb_s(probes: list[dict[int, dict]], threads: int) -> float | None:
    """The highest bandwidth any probe measured at ``threads``."""
    values = [p[threads]["gb_s"] for p in probes if threads in p]
    return max(values) if values else None


def _graphs(row: dict) -> tuple[str, str | None]:
    """The Talker graph and the Code Predictor frame graph (None in step mode) the row ran."""
    ran = list(row.get("runs") or {})
    talker = next((g for g in ran if g.startswith("talker")), "talker")
    return talker, next((g for g in ran if g.startswith("cp_frame")), None)


def _reference_graphs(bundle: Path) -> tuple[str, str]:
    """The fp32 bundle's Talker and Code Predictor frame graphs whose bytes a reference row is measured
    against: the fused-attention pair when the bundle has it (what the fp32 row runs), else the plain one."""
    graphs = read_manifest(bundle).graphs
    return ("talker_gqa", "cp_frame_gqa") if {"talker_gqa", "cp_frame_gqa"} <= set(graphs) else ("talker", "cp_frame")


def annotate(rows: list[dict], probes: list[dict[int, dict]], base_bundle: Path, bundles: dict, args) -> None:
    """Set on each timed row: bytes read per step, ``talker_limit_pct``/``cp_limit_pct``,
    ``limit_gb_s``, ``busy``. ``bundles``: {(weights, kv, decoder): bundle dir} of the configs.
    A batched row's step reads the batched graphs' constants once and each stream's KV."""
    for row in rows:
        if row.get("timed") is False or "error" in row or row.get("kind") not in ("kztts", "reference", "kztts-batch"):
            continue
        threads = int(row["threads"])
        # Talker positions cached on average over the timed frames (prompt + warm-up + half of the rest)
        positions = int(row.get("prefill_positions") or 0) + args.warmup + (args.frames - args.warmup) // 2
        if row["kind"] == "reference":  # the same weights as the fp32 bundle's graphs the kztts rows run
            read = bandwidth.step_bytes(base_bundle, *_reference_graphs(base_bundle), positions=positions)
        elif row["kind"] == "kztts-batch":
            read = bandwidth.step_bytes(bundles[(row["weights"], row["kv"], row["decoder"])], "talker_batched",
                                        "cp_frame_batched", positions=positions,
                                        kv_bytes=2 if row["kv"] == "fp16" else 4, streams=int(row["batch"]))
        else:
            talker, cp = _graphs(row)
            read = bandwidth.step_bytes(bundles[(row["weights"], row["kv"], row["decoder"])], talker, cp,
                                        positions=positions, kv_bytes=2 if row["kv"] == "fp16" else 4)
        gb_s = limit_gb_s(probes, threads)
        row["limit_gb_s"] = gb_s
        bandwidth.add_limit_columns(row, read, gb_s)
        loads = as_list(row.get("load_avg_before")) + as_list(row.get("load_avg_after"))
        row["busy"] = is_busy(loads, threads)


def probe_note(probes: list[dict[int, dict]]) -> str:
    """A header line (starting with a newline): the probes' bandwidth per thread count, before and after the rows."""
    if not any(probes):
        return ""
    parts = []
    for t in sorted({t for p in probes for t in p}):
        vals = " / ".join(f"{p[t]['gb_s']:.2f}" for p in probes if t in p)
        parts.append(f"{t} thread(s) {vals} GB/s")
    mb = next((p[t]["weight_mb"] for p in probes for t in p), None)
    return (f"\nstreaming bandwidth (ONNX Runtime fp32 GEMV over a {mb} MB weight, before / after the rows): "
            + "; ".join(parts) + "; % of limit = bytes a Talker step / CP frame reads (weights at their "
            "precision + KV) / its ms / the higher probe")


def header_note(rows: list[dict]) -> str:
    """Header lines: the reference's attention and the busy rule."""
    refs = sorted({f"{r.get('attention')} (accuracy columns: {r.get('accuracy_attention')})"
                   for r in rows if r.get("kind") == "reference" and "error" not in r})
    note = f"\nqwen-tts reference timed with attention {', '.join(refs)}" if refs else ""
    return note + (f"\nload avg before/after each round (1 min); BUSY: above the row's threads + {BUSY_MARGIN}: "
                   "something else used the cores, compare that row again in a quiet run")
