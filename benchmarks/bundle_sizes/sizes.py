"""Bundle bytes against the bytes of the weights they hold.

For each bundle: its bytes on disk (tokenizer aside), split into graphs, shared weights file, context binaries and
tables; and the checkpoint's weights counted once at the precision the bundle stores them (``--weights-bits``:
32 for an fp32 bundle's graphs; the text table at its own table dtype). The ratio is what issue-free wording calls
"bundle bytes over weight bytes".

    python benchmarks/bundle_sizes/sizes.py CHECKPOINT BUNDLE [BUNDLE ...] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import struct
from pathlib import Path

_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I8": 1, "U8": 1, "BOOL": 1}


def checkpoint_params(model_dir: Path) -> dict[str, int]:
    """{tensor name: element count} of every safetensors file of a checkpoint (headers only)."""
    out = {}
    for f in sorted(model_dir.rglob("*.safetensors")):
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        for name, t in header.items():
            if name == "__metadata__":
                continue
            count = 1
            for d in t["shape"]:
                count *= d
            out[f"{f.relative_to(model_dir)}:{name}"] = count
    return out


def bundle_parts(bundle: Path) -> dict[str, int]:
    parts = {"tokenizer": 0, "tables": 0, "shared weights": 0, "context binaries": 0, "graphs": 0, "other": 0}
    for f in bundle.rglob("*"):
        if not f.is_file():
            continue
        rel, size = f.relative_to(bundle).as_posix(), f.stat().st_size
        key = ("tokenizer" if rel == "tokenizer.json" else "tables" if rel.startswith("embeddings/")
               else "shared weights" if rel.endswith("weights.data") else "context binaries" if rel.endswith(".bin")
               else "graphs" if rel.startswith("graphs/") else "other")
        parts[key] += size
    return parts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint", type=Path)
    p.add_argument("bundles", type=Path, nargs="+")
    p.add_argument("--weights-bits", type=int, default=32, help="bits per graph weight the bundles store")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    params = checkpoint_params(a.checkpoint)
    text = sum(n for k, n in params.items() if "text_embedding" in k)
    rows = []
    for b in a.bundles:
        m = json.loads((b / "kztts.json").read_text())
        table = m["embeddings"]["text_embedding"]["dtype"]
        weights = (sum(params.values()) - text) * a.weights_bits // 8 + text * {"int8": 1}.get(table, 2)
        parts = bundle_parts(b)
        total = sum(parts.values()) - parts["tokenizer"]
        rows.append({"bundle": str(b), "weights_mb": weights / 1e6, "bundle_mb": total / 1e6,
                     "ratio": total / weights, **{f"{k}_mb": v / 1e6 for k, v in parts.items()}})
        print(f"{b.name}: {total / 1e6:,.1f} MB (tokenizer aside) for {weights / 1e6:,.1f} MB of weights: "
              f"{total / weights:.2f}x; " + ", ".join(f"{k} {v / 1e6:,.1f}" for k, v in parts.items()))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
