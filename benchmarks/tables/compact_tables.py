#!/usr/bin/env python3
"""What the compact tables of a quantized bundle cost: the same int8/int4 variant with its tables compact (text
table 8 bits per row, codec tables fp16: ``kztts.bundle.table_compact.compact_tables``) and with its fp32
bundle's tables (bf16 text, fp32 codec), compared on ``kztts validate``'s four validation prompts (their own
voice, each in its prompt mode: x-vector and ICL, streaming and not):

* the prompt rows (the prefill's input embeddings): cosine min and max |difference|;
* the Talker's prefill logits: cosine, and whether their argmax agrees;
* greedy codes over ``--frames`` frames: the share of codes equal, frames equal, and the first frame that differs
  (a random-weight model's near-ties flip under any change, and the difference cascades from the first flip);
* beside them, what the quantized weights themselves cost: the prefill logits cosine of the full-table variant
  against the fp32 bundle;

and the bytes of each bundle's tables.

    python benchmarks/tables/compact_tables.py FP32_BUNDLE --weights int4 [--frames 16] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path


def table_bytes(bundle: Path, embeddings: dict) -> int:
    files = {s["file"] for s in embeddings.values()} | {s["scale_file"] for s in embeddings.values() if "scale_file" in s}
    return sum((bundle / f).stat().st_size for f in files)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", help="an fp32 bundle (kztts export without --weights)")
    ap.add_argument("--weights", default="int4", choices=("int8", "int4"))
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", help="where to write the two variants (default: a temporary folder)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    os.environ["KZTTS_THREADS"] = str(args.threads)
    import logging

    logging.getLogger("kztts").setLevel(logging.ERROR)
    import numpy as np

    from kztts.bundle.manifest import read_manifest, write_manifest
    from kztts.bundle.table_views import view_tables
    from kztts.core.metrics import cosine_rows
    from kztts.eval.acceptance import VALIDATION_PROMPTS, validation_voice
    from kztts.export.common.variants import make_variant
    from kztts.tts.tts import TTS

    base = Path(args.bundle)
    work = Path(args.work or tempfile.mkdtemp(prefix="kztts-tables-"))
    compact = make_variant(base, work / "compact", weights=args.weights)
    full = work / "full"
    if full.exists():
        shutil.rmtree(full)
    shutil.copytree(compact, full, copy_function=os.link)
    data = json.loads(json.dumps(read_manifest(full).data))
    # the base's tables; one that is a view into the base's weights file (not this variant's) written out as a .npy
    data["embeddings"] = view_tables(full, read_manifest(base).embeddings, None, source=base)
    for spec in data["embeddings"].values():
        dst = full / spec["file"]
        if not dst.exists():
            os.link(base / spec["file"], dst)
    write_manifest(full, data)

    tts = {name: TTS(path) for name, path in (("compact", compact), ("full", full), ("fp32", base))}
    rows = []
    for text, mode in VALIDATION_PROMPTS:
        icl, streaming = mode.startswith("icl"), mode.endswith("_stream")
        out = {}
        for name, t in tts.items():
            voice = (t.voice_from_reference(validation_voice(), 24000, "A short reference sentence.") if icl
                     else t.voice_from_wav(validation_voice(), 24000))
            prepared = t.prepare(text, voice, language="english", greedy=True, max_frames=args.frames,
                                 streaming_text=streaming)
            prompt = prepared.prompt()
            logits, _ = t.talker.prefill(prompt.embeds)
            codes = t.synthesize(text, voice, language="english", greedy=True, max_frames=args.frames,
                                 streaming_text=streaming).codes
            out[name] = (prompt.embeds, np.asarray(logits).reshape(1, -1), codes)
        (e1, l1, c1), (e2, l2, c2), (_, l3, _) = out["compact"], out["full"], out["fp32"]
        n = min(len(c1), len(c2))
        same = np.all(c1[:n] == c2[:n], axis=1)
        rows.append({"mode": mode, "prompt_cos_min": float(cosine_rows(e1, e2).min()),
                     "prompt_max_abs": float(np.abs(e1 - e2).max()),
                     "logits_cos": float(cosine_rows(l1, l2)[0]), "argmax_equal": bool(l1.argmax() == l2.argmax()),
                     "codes_equal": float((c1[:n] == c2[:n]).mean()), "frames_equal": f"{int(same.sum())}/{n}",
                     "weights_logits_cos": float(cosine_rows(l2, l3)[0]),
                     "first_diff": None if same.all() else int(np.argmin(same))})
    sizes = {name: table_bytes(path, read_manifest(path).embeddings) for name, path in
             (("compact", compact), ("full", full))}
    print(f"{base.name} at --weights {args.weights}, {args.frames} greedy frames, {args.threads} threads")
    print(f"tables: compact {sizes['compact'] / 1e6:.1f} MB, full {sizes['full'] / 1e6:.1f} MB "
          f"({sizes['compact'] / sizes['full']:.2f}x)")
    print("| prompt mode | prompt rows cos min | max abs diff | prefill logits cos | argmax | codes equal | "
          f"frames equal | first diff | {args.weights} weights' own logits cos |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['prompt_cos_min']:.7f} | {r['prompt_max_abs']:.2e} | {r['logits_cos']:.7f} | "
              f"{'equal' if r['argmax_equal'] else 'DIFF'} | {r['codes_equal']:.3f} | {r['frames_equal']} | "
              f"{r['first_diff']} | {r['weights_logits_cos']:.7f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "bytes": sizes, "weights": args.weights}, indent=1))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
