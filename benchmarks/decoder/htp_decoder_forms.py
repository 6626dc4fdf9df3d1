#!/usr/bin/env python3
"""The HTP decoder_chunk with and without ConvTranspose nodes, fp16 and w8a16, on the simulator against the fp32 CPU
decoder (docs/PRECISION.md, "At 0.6B widths").

    python benchmarks/decoder/htp_decoder_forms.py [--size 0.6b] [--work DIR]

For each form (``convtranspose``: ``DecoderOptions(fold_snake=True)``; ``conv``: the export's ``HTP_DECODER_OPTIONS``,
every ConvTranspose as Conv + Reshape/Transpose) the script exports ``DecoderStep`` at 5 frames (static), quantizes it
by the HTP recipe (``quantize_decoder_graph(..., "w8a16")``, calibrated on 3 chunks of seeded random codes), then
decodes 10 other random frames in two chunks (state carried) with the float graph on the CPU EP (the reference), the
QDQ graph on the CPU EP, and each graph on the simulator, every HTP run in its own child process (fp16 mode leaks
across the sessions of one process). Prints the SNR of each against the reference and of the shifted outputs
(-3..3 samples). The 0.6B: 4 min and 5.5 GB per export, minutes per simulator run.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

FRAMES = 5


def _export(model_dir: Path, d: Path, form: str) -> None:
    import onnxruntime as ort
    import torch

    from kztts.export.common.decoder_qdq import HTP_RECIPE, quantize_decoder_graph
    from kztts.export.common.onnx_export import export_onnx
    from kztts.export.common.qwen_import import import_qwen_tts
    from kztts.export.graphs.codec_graphs import DecoderOptions, DecoderStep, _example_codes
    from kztts.export.htp.static_graphs import HTP_DECODER_OPTIONS

    st = import_qwen_tts().Qwen3TTSTokenizer.from_pretrained(str(model_dir / "speech_tokenizer")).model
    opts = HTP_DECODER_OPTIONS if form == "conv" else DecoderOptions(fold_snake=True)
    step = DecoderStep(st.decoder, opts).eval()
    names = [n for n, _ in step.state_specs]
    d.mkdir(parents=True, exist_ok=True)
    example = (_example_codes(FRAMES, step.bins), torch.tensor([0], dtype=torch.int64), *step.zero_state())
    export_onnx(step, example, d / "float.onnx", ["codes", "position"] + [f"state_{n}" for n in names],
                ["wav"] + [f"new_state_{n}" for n in names], None)
    meta = {"bins": step.bins, "state": [[f"state_{n}", list(s)] for n, s in step.state_specs]}
    (d / "meta.json").write_text(json.dumps(meta))
    sess = ort.InferenceSession(str(d / "float.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)  # calibration codes: not the measured ones (seed 7)
    state = {n: np.zeros(s, np.float32) for n, s in meta["state"]}
    feeds = []
    for i in range(3):
        f = {"codes": rng.integers(0, step.bins, (1, FRAMES, 16)).astype(np.int64),
             "position": np.array([i * FRAMES], np.int64), **state}
        feeds.append(f)
        state = {n: o for (n, _), o in zip(meta["state"], sess.run(None, f)[1:])}
    quantize_decoder_graph(d / "float.onnx", d / "w8a16.onnx", feeds, recipe=HTP_RECIPE)


def _run(d: Path, how: str) -> np.ndarray:
    """Decode the measured codes with ``how``: cpu32, cpu-w8a16, htp-fp16 or htp-w8a16; saves and returns the wav."""
    import onnxruntime as ort

    meta = json.loads((d / "meta.json").read_text())
    rng = np.random.default_rng(7)
    codes = [rng.integers(0, meta["bins"], (1, FRAMES, 16)).astype(np.int64) for _ in range(2)]
    graph = d / ("w8a16.onnx" if how.endswith("w8a16") else "float.onnx")
    if how == "cpu32":
        sess = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    elif how == "cpu-w8a16":
        from kztts.htp.qnn import _cpu_session

        sess = _cpu_session(graph, None)
    else:
        from kztts.htp import qnn
        from kztts.htp.targets import load_target

        if not qnn.qnn_available():
            raise SystemExit(f"no QNN execution provider: {qnn.qnn_unavailable_reason()}")
        sess = qnn.create_session(graph, load_target("simulator"), strict=True)
    state = {n: np.zeros(s, np.float32) for n, s in meta["state"]}
    wavs = []
    for i, c in enumerate(codes):
        out = sess.run(None, {"codes": c, "position": np.array([i * FRAMES], np.int64), **state})
        wavs.append(out[0])
        state = {n: o for (n, _), o in zip(meta["state"], out[1:])}
    y = np.concatenate(wavs, -1)[0]
    np.save(d / f"{how}.npy", y)
    return y


def _snr(ref: np.ndarray, y: np.ndarray, shift: int = 0) -> float:
    a, b = ref[max(shift, 0): len(ref) + min(shift, 0)], y[max(-shift, 0): len(y) + min(-shift, 0)]
    return float(10 * np.log10((a ** 2).sum() / max(((a - b) ** 2).sum(), 1e-30)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="0.6b", help="make-tiny size of the random-weight checkpoint (tiny, 0.6b)")
    ap.add_argument("--work", type=Path, default=None, help="where the graphs go (default: the kztts cache)")
    ap.add_argument("--child", nargs=2, metavar=("DIR", "HOW"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _run(Path(args.child[0]), args.child[1])
        return 0
    from kztts.core.cache import cache_dir
    from kztts.export.tts.tiny import cached_tiny

    model = cached_tiny(size=args.size, variant=None)
    work = args.work or cache_dir() / "bench" / f"htp_decoder_forms-{model.name}"
    for form in ("convtranspose", "conv"):
        d = work / form
        if not (d / "w8a16.onnx").is_file():
            _export(model, d, form)
        ref = _run(d, "cpu32")
        for how in ("cpu-w8a16", "htp-fp16", "htp-w8a16"):
            subprocess.run([sys.executable, __file__, "--child", str(d), how], check=True)
            y = np.load(d / f"{how}.npy")
            shifts = {s: round(_snr(ref, y, s), 2) for s in range(-3, 4) if s}
            print(f"{form:14s} {how:10s} SNR vs fp32 CPU {_snr(ref, y):7.2f} dB   shifted: {shifts}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
