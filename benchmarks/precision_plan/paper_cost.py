"""Bytes and paper milliseconds per frame (a TTS bundle) or per token (an LM bundle) for each HTP precision and
precision plan, on the device targets: ``kztts inspect BUNDLE --target T [--precision P | --placement PLAN]``'s
cost on paper (``kztts.htp.cost.bundle_cost``), as one table.

    python benchmarks/precision_plan/paper_cost.py BUNDLE --out DIR [--targets sm8750,x_elite,x2_elite]
        [--precisions fp16,w8a16,w4a16] [--plan NAME=PLAN.json ...]

Writes DIR/paper_cost.json and DIR/paper_cost.md (the table and the command). Counting only: no graph runs but
one profiled CPU call per graph (MACs) at the target's shapes; nothing is timed.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kztts.bundle import graphs as G
from kztts.bundle.manifest import read_manifest
from kztts.htp.cost import bundle_cost
from kztts.htp.placement import parse_placement
from kztts.htp.targets import load_target

ROLES = ("talker_decode", "code_predictor", "decoder")


def row(report: dict, name: str) -> dict:
    est = report["paper_estimate"]
    unit = report.get("unit", "frame")
    parts = {r["role"]: r for r in report["graphs"] if r["calls_per_frame"]}
    out = {"target": report["target"], "configuration": name, "unit": unit,
           "mb_per_unit": report["frame"]["bytes"] / 1e6,
           "weights_mb_after_sharing": report["weights"]["after_sharing"] / 1e6,
           "ms_per_unit": est.get("ms_per_frame") if est["available"] else None,
           "bandwidth_gbps": est.get("bandwidth_gbps"), "bandwidth_kind": est.get("bandwidth_kind")}
    for role in ROLES:
        if role in parts:
            r = parts[role]
            out[f"{role}_mb"] = (r["weight_read_bytes"] + r["io_bytes"]) * r["calls_per_frame"] / 1e6
            out[f"{role}_precision"] = f"{r['precision']} ({r['device']})"
    return out


def markdown(rows: list[dict], command: str, random_weights: bool) -> str:
    unit = rows[0]["unit"]
    head = ["target", "configuration", f"MB/{unit}", f"paper ms/{unit}"]
    roles = [r for r in ROLES if any(f"{r}_mb" in x for x in rows)]
    head += [f"{r} MB ({'precision'})" for r in roles]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for x in rows:
        cells = [x["target"], x["configuration"], f"{x['mb_per_unit']:.0f}",
                 "n/a" if x["ms_per_unit"] is None else f"{x['ms_per_unit']:.1f}"]
        cells += [f"{x[f'{r}_mb']:.0f} ({x[f'{r}_precision']})" if f"{r}_mb" in x else "" for r in roles]
        lines.append("| " + " | ".join(cells) + " |")
    note = "Random weights (a `kztts make-tiny --size` checkpoint): bytes and MACs are the released shapes'; " \
        "nothing here says how accurate a precision is.\n\n" if random_weights else ""
    return note + "\n".join(lines) + f"\n\nCommand:\n\n    {command}\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--targets", default="sm8750,x_elite,x2_elite")
    ap.add_argument("--precisions", default=",".join(G.HTP_PRECISIONS))
    ap.add_argument("--plan", action="append", default=[], metavar="NAME=PLAN.json",
                    help="a precision plan file, shown as row NAME (repeatable)")
    args = ap.parse_args(argv)
    manifest = read_manifest(args.bundle)
    layers = int(manifest.talker["num_layers"])
    plans = []
    for item in args.plan:
        name, sep, path = item.partition("=")
        if not sep:
            ap.error(f"--plan {item}: expected NAME=PLAN.json")
        plans.append((name, parse_placement(json.loads(Path(path).read_text()), path, layers)))
    rows = []
    for t in [load_target(x) for x in args.targets.split(",") if x]:
        for p in [x for x in args.precisions.split(",") if x]:
            rows.append(row(bundle_cost(args.bundle, t, precision=p), p))
            print(json.dumps(rows[-1]), flush=True)
        for name, plan in plans:
            rows.append(row(bundle_cost(args.bundle, t, plan=plan), name))
            print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/precision_plan/paper_cost.py BUNDLE " + " ".join(
        a if not Path(a).is_absolute() else Path(a).name for a in (argv if argv is not None else sys.argv[1:])[1:])
    (args.out / "paper_cost.json").write_text(json.dumps({"rows": rows, "command": command,
                                                          "random_weights": bool(manifest.random_weights)},
                                                         indent=1) + "\n")
    md = markdown(rows, command, bool(manifest.random_weights))
    (args.out / "paper_cost.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
