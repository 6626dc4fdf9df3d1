"""The real-vocoder study: Piper en_US-joe-medium's decoder under each precision recipe (README.md).

    python benchmarks/piper_decoder/study.py [--work DIR] [--rounds 3] [--json out.json] [--plot plan.png]
"""
from __future__ import annotations

import argparse
import json
import logging
import platform
from pathlib import Path

import psutil

from kztts.core.cache import cache_dir
from kztts.eval.piper_voice import fetch_voice
from kztts.export.validate.vocoder import run_study


def _isa() -> str:
    flags = ""
    try:
        flags = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags"))
    except (OSError, StopIteration):
        pass
    have = [n for f, n in (("avx512f", "AVX-512"), ("avx512_vnni", "VNNI"), ("amx_tile", "AMX"), ("avx2", "AVX2"))
            if f" {f}" in flags]
    return "+".join(have) or platform.machine()


def _table(rows: dict) -> None:
    print("| recipe | runs on | SNR dB vs fp32 | WER | DNSMOS SIG/BAK/OVRL | CPU ms per audio s (1 thread) | keeps speech | note |")
    print("|---|---|---|---|---|---|---|---|")
    for r, row in rows.items():
        d = row["dnsmos"]
        cpu = f"{row['cpu_ms_per_s']:.1f}" if row["cpu_ms_per_s"] is not None else "-"
        print(f"| {r} | {row['device']} | {row['snr_db']:.1f} | {row['wer'] * 100:.1f}% | {d['sig']:.2f}/{d['bak']:.2f}/"
              f"{d['ovrl']:.2f} | {cpu} | {'yes' if row['keeps_speech'] else 'no'} | {row['note']} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=str(cache_dir() / "studies" / "piper_decoder"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write the rows and the analysis here")
    ap.add_argument("--plot", help="write the plan's per-node picture here (PNG)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    load0 = psutil.getloadavg()
    res = run_study(fetch_voice(), args.work, rounds=args.rounds)
    load1 = psutil.getloadavg()
    print(f"CPU ISA {_isa()}, load average {load0[0]:.1f} at start, {load1[0]:.1f} at end; "
          f"{res['audio_seconds']:.1f} s of audio, {res['macs_per_audio_second'] / 1e9:.2f} GMAC per audio second")
    paper = res["paper_ms_per_audio_second"]
    print(f"HTP paper ms per audio second ({res['paper_target']}, compute term x the conv-decoder factor): "
          + (f"{paper:.1f}" if paper is not None else "-"))
    print(f"all {len(res['texts'])} sentences, every graph on the CPU EP (a QDQ graph there predicts the HTP):")
    _table(res["rows"])
    print(f"the first {res['htp_sentences']} sentences, HTP recipes on the simulated HTP (strict):")
    _table(res["htp_rows"])
    if res["analysis"]:
        print("plan:", json.dumps(res["analysis"]["plan"]["counts"]),
              f"node threshold {res['analysis']['plan']['node_threshold_db']} dB")
    if args.json:
        out = {k: v for k, v in res.items() if k != "wavs"}
        out.update(isa=_isa(), load_start=load0[0], load_end=load1[0])
        Path(args.json).write_text(json.dumps(out, indent=1))
    if args.plot and res["analysis"]:
        from kztts.export.htp.graph_analysis import GraphAnalysis, NodeReport

        a = res["analysis"]
        ga = GraphAnalysis(a["graph"], a["samples"], a["threshold"], a["target_db"],
                           [NodeReport(**n) for n in a["nodes"]], a["output_sqnr_db"])
        ga.plot(args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
