"""Where the memory of the static Talker on the HTP simulator goes, and its context-binary bytes.

    python benchmarks/htp_simulator_06b/htp_memory.py MODEL_DIR OUT_DIR [--context 64] [--chunk 32]
        [--target simulator] [--both] [--shared] [--kv fp16|fp32]

Exports the static Talker graphs of MODEL_DIR (``kztts.export.htp.static_graphs.export_static_talker``, KV I/O
``--kv``, default the fp16 graphs' default) into OUT_DIR, then in one child process per case (a clean
peak RSS each, VmHWM): the prefill graph opened from its source on QNN, a one-graph context binary
generated from it (``talker_graphs: prefill-only``), that context loaded, with ``--both`` the two graphs
opened from source (the ``prefill+decode`` layout the simulator must compile, since it cannot load a
weight-shared context), and with ``--shared`` the weight-shared context binary of both graphs generated
as device targets get it (``kztts.export.htp.static_graphs.make_context_binaries``, ``share=True``; the
simulator can write it but not load it). Each child that opens a graph runs it once on zeros. Prints
one JSON object: resident MB after open / after the run / peak, seconds, the context binaries' bytes
and one fp16 copy of the graph's weights.
Heavy at 0.6B shapes: run it with no other heavy job on the machine. The simulator's host time is not a
device time.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from kztts.bundle.graphs import HTP_KV_DTYPES

_CHILD = r"""
import json, sys, time
from pathlib import Path
import numpy as np

def mb(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return round(int(line.split()[1]) / 1024, 1)

from kztts.htp.qnn import create_session
from kztts.htp.targets import load_target
d, target, case = Path(sys.argv[1]), load_target(sys.argv[2]), sys.argv[3]
t = time.time()
if case == "shared":
    from kztts.export.htp.static_graphs import make_context_binaries
    (d / "graphs").mkdir(exist_ok=True)
    ctx = make_context_binaries(d, {n: f"{n}.onnx" for n in ("talker_prefill", "talker_decode")},
                                target, share=True)
    bins = sorted({b for c in ctx.values() for b in c["binaries"]})
    print(json.dumps({"case": case, "open_s": round(time.time() - t, 1), "binaries": bins,
                      "context_binary_bytes": sum((d / b).stat().st_size for b in bins),
                      "peak_rss_mb": mb("VmHWM")}))
    sys.exit(0)
if case == "source":
    sessions = [create_session(d / "talker_prefill.onnx", target, strict=True)]
elif case == "both":
    sessions = [create_session(d / f"{n}.onnx", target, strict=True) for n in ("talker_prefill", "talker_decode")]
elif case == "generate":
    ctx = {"ep.context_enable": "1", "ep.context_file_path": str(d / "talker_prefill_ctx.onnx"),
           "ep.context_embed_mode": "0"}
    sessions = [create_session(d / "talker_prefill.onnx", target, strict=True, context=ctx)]
else:
    sessions = [create_session(d / "talker_prefill_ctx.onnx", target, strict=True)]
out = {"case": case, "open_s": round(time.time() - t, 1), "rss_after_open_mb": mb("VmRSS")}
s = sessions[0]
t = time.time()
s.run(None, {i.name: np.zeros(i.shape, np.float16 if i.type == "tensor(float16)" else np.float32)
            for i in s.get_inputs()})
out.update(run_s=round(time.time() - t, 1), rss_after_run_mb=mb("VmRSS"), peak_rss_mb=mb("VmHWM"))
print(json.dumps(out))
"""


def fp16_weight_bytes(path: Path) -> int:
    """Two bytes per float initializer element of the graph: one fp16 copy of its weights."""
    import numpy as np
    import onnx

    m = onnx.load(str(path))
    return 2 * sum(int(np.prod(t.dims)) for t in m.graph.initializer if t.data_type == onnx.TensorProto.FLOAT)


def export_graphs(model_dir: Path, out: Path, context: int, chunk: int, kv: str) -> None:
    from kztts.export.common.checkpoint import load_reference
    from kztts.export.htp.static_graphs import export_static_talker

    missing = [(n, seq) for n, seq in (("talker_prefill", chunk), ("talker_decode", 1))
               if not (out / f"{n}.onnx").is_file()]
    if not missing:
        return
    model = load_reference(model_dir).model
    for name, seq in missing:
        export_static_talker(model.talker, out / f"{name}.onnx", seq, context, kv_dtype=kv)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--target", default="simulator")
    ap.add_argument("--both", action="store_true", help="also open both graphs from source (the old layout)")
    ap.add_argument("--shared", action="store_true",
                    help="also generate the weight-shared context binary of both graphs (device targets' layout)")
    ap.add_argument("--kv", choices=HTP_KV_DTYPES["fp16"], default=HTP_KV_DTYPES["fp16"][0],
                    help="KV I/O type of the graphs (default: what fp16 exports write)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    export_graphs(args.model_dir, args.out, args.context, args.chunk, args.kv)
    for old in [*args.out.glob("talker_prefill_ctx*"), *args.out.glob("graphs/talker_*_ctx*")]:
        old.unlink()
    report = {"context": args.context, "chunk": args.chunk, "kv": args.kv, "target": args.target,
              "fp16_weight_bytes": fp16_weight_bytes(args.out / "talker_prefill.onnx"), "cases": []}
    cases = ("source", "generate", "load") + (("both",) if args.both else ()) + (("shared",) if args.shared else ())
    for case in cases:
        res = subprocess.run([sys.executable, "-c", _CHILD, str(args.out), args.target, case], capture_output=True,
                             text=True)
        if res.returncode != 0:
            report["cases"].append({"case": case, "error": (res.stderr or res.stdout).strip()[-500:],
                                    "returncode": res.returncode})
            continue
        report["cases"].append(json.loads(res.stdout.strip().splitlines()[-1]))
        if case == "generate":
            report["context_binary_bytes"] = sum(p.stat().st_size for p in args.out.glob("talker_prefill_ctx*.bin"))
            report["context_vs_fp16_weights"] = round(report["context_binary_bytes"] / report["fp16_weight_bytes"], 3)
        if case == "shared":
            report["shared_context_binary_bytes"] = report["cases"][-1]["context_binary_bytes"]
            report["shared_context_vs_fp16_weights"] = round(
                report["shared_context_binary_bytes"] / report["fp16_weight_bytes"], 3)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
