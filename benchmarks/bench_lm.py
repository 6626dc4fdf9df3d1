"""Accuracy beside speed for a causal LM (issue 17): which precision and placement are safe.

Rows (``kztts.lm_accuracy``, all against the fp32 CPU bundle, teacher-forced over its fixed
multilingual text set, plus 32 greedy tokens per prompt):

- CPU fp32 / int8 / int4 (``kztts export --weights``: MatMulNBits, blocks of 128), with the
  median ms per decode step at ``--threads`` and the load average beside it;
- with ``--target``: the HTP simulator in fp16 under all-htp (the static graphs),
  guarded (``kztts calibrate``'s placement, run on the layer graphs with the fp16 guard on) and
  prefill-htp-decode-cpu (KV handover); in w8a16 (a second bundle: the static graphs quantized,
  calibrated on text by ``kztts.export.lm_quantize``) under all-htp and prefill-htp-decode-cpu.
  A w8a16 guarded row does not exist: the layer graphs are fp16 only (the exporter refuses
  ``--segments`` with w8a16; its message is quoted in the report). HTP rows are never timed (the
  simulator is not a device). A bundle with ``--segments`` layer graphs but no whole-stack static
  graphs (a 1.5B's, ``benchmarks/simulator_lm512.json``) runs the fp16 all-htp and
  prefill-htp-decode-cpu rows on its layer graphs, with the guard counting flagged HTP calls
  (``guard_flagged``) rather than failing the row; QNN itself stays strict (no CPU fallback).

Each finished row is logged and ``lm_accuracy.json`` rewritten (``"complete": false`` until the
last row), so a long simulator run keeps the rows it finished.

Writes ``lm_accuracy.md`` (the table, its caveats, the command) and ``lm_accuracy.json`` in
``--out``. A separate script rather than ``kztts bench`` rows: the rows need torch (variant
export, calibration) and measure text metrics the TTS bench has no column for.

    python benchmarks/bench_lm.py --gguf ~/.cache/kztts/checkpoints/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --bundle BUNDLE --weights fp32,int8,int4 --threads 2 --out /tmp/lm_bench
"""
from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import tempfile
from pathlib import Path

import psutil

PLACEMENTS = ("all-htp", "guarded", "prefill-htp-decode-cpu")
HTP_PRECISIONS = ("fp16", "w8a16")
INT4_CAVEAT = ("The checkpoint is a GGUF whose weights already lie on a 4-bit grid (Q4_K_M): re-quantizing them "
               "to int4 (blocks of 128) flatters int4; on a full-precision checkpoint int4 would lose more.")


def w8a16_guarded_refusal(source: Path, target: str) -> str:
    """The exporter's own message for w8a16 layer graphs (refused before anything loads): why there is
    no w8a16 guarded row."""
    from kztts.errors import KzttsError
    from kztts.export.lm_export import export_lm_bundle

    with tempfile.TemporaryDirectory() as tmp:
        try:
            export_lm_bundle(source, Path(tmp) / "b", target=target, precision="w8a16", segments=True)
        except KzttsError as e:
            return str(e)
    return "accepted (unexpected: add a w8a16 guarded row)"


def guarded_placement(bundle: Path, out: Path, prompts: Path | None = None) -> Path:
    """``kztts calibrate`` over ``prompts`` (default: the text set's prompts; each as a chat message):
    the guarded placement."""
    from kztts.cli import main
    from kztts.lm_accuracy import SAMPLES

    if prompts is None:
        prompts = out / "prompts.txt"
        prompts.write_text("\n".join(s.prompt.replace("\n", " ") for s in SAMPLES) + "\n", encoding="utf-8")
    placement = out / "guarded.json"
    if main(["calibrate", str(bundle), "--prompts", str(prompts), "--frames", "4", "-o", str(placement)]) != 0:
        raise SystemExit("kztts calibrate failed")
    return placement


def layer_graphs_only(bundle: Path) -> bool:
    """The bundle has the per-layer graphs (``--segments``) but no whole-stack static graphs."""
    from kztts.manifest import read_manifest
    from kztts.segments import segment_graph_name

    graphs = read_manifest(bundle).graphs
    return segment_graph_name("prefill", 0) in graphs and "talker_prefill" not in graphs


def row_specs(bundle: Path, weights: list[str], target: str | None, placements: list[str], out: Path,
              calibrate_prompts: Path | None = None, precisions: tuple[str, ...] = ("fp16",),
              w8a16_bundle: Path | None = None, guarded: Path | None = None) -> list:
    """CPU rows of ``bundle``'s variants; with ``target``, per HTP precision: fp16 rows of ``bundle``,
    w8a16 rows of ``w8a16_bundle`` (no guarded row: its layer graphs would be fp16). ``guarded``: the
    guarded row's placement file (default: ``kztts calibrate`` now)."""
    from kztts.export.variants import cached_variant
    from kztts.lm_accuracy import RowSpec

    specs = [RowSpec(f"cpu {w}", cached_variant(bundle, weights=w), weights=w) for w in weights]
    layers = target is not None and layer_graphs_only(bundle)
    for prec in precisions if target else ():
        for p in placements:
            if prec == "w8a16":
                if p != "guarded":
                    specs.append(RowSpec(f"htp-sim w8a16 {p}", w8a16_bundle, target=target, placement=p))
            elif p == "guarded":
                placement = guarded or guarded_placement(bundle, out, calibrate_prompts)
                specs.append(RowSpec("htp-sim fp16 guarded", bundle, target=target, check_saturation=True,
                                     guard_counts=layers, placement=str(placement)))
            else:
                specs.append(RowSpec(f"htp-sim fp16 {p}", bundle, target=target, placement=p,
                                     check_saturation=layers, guard_counts=layers))
    return specs


def report_markdown(rows: list[dict], manifest: dict, args, w8a16: str | None, command: str) -> str:
    from kztts.lm_accuracy import markdown_table

    src = manifest.get("source") or {}
    texts = f" (texts: {args.texts})" if args.texts else ""
    lines = [f"LM `{manifest.get('model_type')}` from `{Path(src.get('path', '?')).name}` "
             f"(sha256 {str(src.get('sha256', ''))[:12]}...), {args.threads} threads, "
             f"{rows[0].get('tokens')} teacher-forced positions{texts}, {args.greedy_steps} greedy tokens per "
             "prompt.", "",
             markdown_table(rows), ""]
    if src.get("gguf"):
        lines.append(f"- **int4 caveat**: {INT4_CAVEAT}")
    lines += ["- logits cos / top-1 agree: teacher-forced against the fp32 CPU bundle; greedy prefix: mean "
              "fraction of the greedy tokens equal to fp32's before the first divergence; greedy equal: prompts "
              "whose tokens are all equal.",
              "- ms/token: median decode step (CPU rows only), the 1-minute load average beside it: compare rows "
              "of one run, not absolute figures."]
    if w8a16 is not None:
        lines.append(f"- HTP w8a16: static graphs calibrated on `kztts.export.lm_quantize.CALIBRATION_TEXTS` "
                     f"(disjoint from the measured texts); no guarded row, the exporter refuses w8a16 layer graphs: "
                     f"\"{w8a16}\"")
    lines += ["", "Command:", "", f"    {command}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--gguf", type=Path, help="a Qwen2/Qwen3 GGUF file")
    src.add_argument("--model", type=Path, help="a Qwen2/Qwen3 Hugging Face directory")
    ap.add_argument("--bundle", type=Path, help="its fp32 LM bundle (default: exported into the cache; with "
                                                "--target it must hold that target's graphs and --segments)")
    ap.add_argument("--weights", default="fp32,int8,int4", help="CPU rows (fp32 first: the reference)")
    ap.add_argument("--target", help="HTP simulator rows for this target (the bundle's static graphs)")
    ap.add_argument("--placements", default=",".join(PLACEMENTS))
    ap.add_argument("--htp-precisions", default=",".join(HTP_PRECISIONS),
                    help="HTP rows: fp16 (the --bundle's graphs), w8a16 (a second bundle)")
    ap.add_argument("--w8a16-bundle", type=Path, help="its w8a16 LM bundle (default: exported into the cache "
                                                      "with --target --precision w8a16)")
    ap.add_argument("--calibrate-prompts", type=Path, help="kztts calibrate's prompts for the guarded row "
                                                           "(default: the text set's prompts)")
    ap.add_argument("--guarded-placement", type=Path, help="the guarded row's placement file (a `kztts calibrate` "
                                                           "output) instead of calibrating now")
    ap.add_argument("--texts", help="a subset of the text set, by name (comma-separated; default: all; the "
                                    "report names them)")
    ap.add_argument("--greedy-steps", type=int, default=None, help="greedy tokens per prompt (default: "
                                                                   "kztts.lm_accuracy.GREEDY_STEPS)")
    ap.add_argument("--reference", type=Path, help="an .npz for the fp32 row: read when it was saved for the same "
                                                  "bundle, texts, greedy steps and context, else computed and "
                                                  "saved (one HTP row per process without recomputing fp32)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=512, help="CPU KV positions (texts are cut to it)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    from kztts.export.lm_export import cached_lm_bundle
    from kztts.lm_accuracy import GREEDY_STEPS, SAMPLES, run_rows
    from kztts.manifest import read_manifest

    source = args.gguf or args.model
    weights = [w.strip() for w in args.weights.split(",") if w.strip()]
    if weights[0] != "fp32":
        ap.error("--weights must start with fp32 (the reference row)")
    placements = [p.strip() for p in args.placements.split(",") if p.strip()]
    samples = SAMPLES
    if args.texts:
        names = [t.strip() for t in args.texts.split(",") if t.strip()]
        unknown = sorted(set(names) - {s.name for s in SAMPLES})
        if unknown:
            ap.error(f"--texts: unknown {', '.join(unknown)} (the set: {', '.join(s.name for s in SAMPLES)})")
        samples = tuple(s for s in SAMPLES if s.name in names)
    if args.greedy_steps is None:
        args.greedy_steps = GREEDY_STEPS
    args.out.mkdir(parents=True, exist_ok=True)
    bundle = args.bundle or cached_lm_bundle(source, target=args.target, segments=args.target is not None)
    manifest = read_manifest(bundle).data
    precisions = [p.strip() for p in args.htp_precisions.split(",") if p.strip()]
    unknown = sorted(set(precisions) - set(HTP_PRECISIONS))
    if unknown:
        ap.error(f"--htp-precisions: unknown {', '.join(unknown)} (expected {', '.join(HTP_PRECISIONS)})")
    w8a16, w8a16_bundle = None, None
    if args.target and "w8a16" in precisions:
        w8a16 = w8a16_guarded_refusal(source, args.target)
        w8a16_bundle = args.w8a16_bundle or cached_lm_bundle(source, target=args.target, precision="w8a16")
    command = " ".join(shlex.quote(a) for a in ["python", "benchmarks/bench_lm.py", *(argv or sys.argv[1:])])
    specs = row_specs(bundle, weights, args.target, placements, args.out, args.calibrate_prompts,
                      precisions=tuple(precisions), w8a16_bundle=w8a16_bundle, guarded=args.guarded_placement)
    done: list[dict] = []

    def write_json(complete: bool) -> None:
        (args.out / "lm_accuracy.json").write_text(json.dumps(
            {"bundle": str(bundle), "source": manifest.get("source"), "threads": args.threads,
             "texts": [s.name for s in samples], "greedy_steps": args.greedy_steps, "w8a16_no_guarded_row": w8a16,
             "load_avg_end": psutil.getloadavg(), "command": command, "complete": complete, "rows": done},
            indent=1), encoding="utf-8")

    def on_row(row: dict) -> None:
        logging.info("row %s", json.dumps(row))
        done.append(row)
        write_json(complete=False)

    rows = run_rows(specs, samples=samples, threads=args.threads, steps=args.greedy_steps, context=args.context,
                    on_row=on_row, reference_file=args.reference)
    write_json(complete=True)
    md = report_markdown(rows, manifest, args, w8a16, command)
    (args.out / "lm_accuracy.md").write_text(md, encoding="utf-8")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
