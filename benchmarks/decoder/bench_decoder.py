#!/usr/bin/env python3
"""Streaming decoder ms per frame of each graph variant, next to its audio SNR against the plain fp32 graph.

Exports the ``decoder_stream`` graph of the checkpoint's speech tokenizer once per variant
(``kztts.export.graphs.codec_graphs.DecoderOptions``; cached under ``--work``), opens every variant
at every ``--threads`` count in this one process, and times them interleaved: each round runs
every (variant, threads, chunk) once, from a fresh state, pushing ``--frames`` random frames
``--chunk`` at a time; the first round is a warm-up. Reported: the median over rounds of
(sum of push times) / frames, and the SNR of the variant's samples against the first variant's
at the same threads (``inf`` = bit-identical).

    python benchmarks/decoder/bench_decoder.py --size 0.6b --threads 1,2 --chunk 4
    python benchmarks/decoder/bench_decoder.py --variants plain,conv2d,fold_snake --opt all,extended

Variant names: ``plain`` or ``+``-joined DecoderOptions fields (``conv2d+tconv_as_conv+fold_snake``);
a suffix ``@extended`` (or ``@basic``) opens it at that ORT optimization level instead of ``all``;
``int8:<name>`` / ``int8c:<name>``: that graph with its Conv weights quantized to 8 bits per tensor /
per output channel (ORT ConvInteger, dynamic activations; lossy, opt-in). The machine is shared: only ratios inside one run mean anything; the
load average is printed at the start and the end.
"""
from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

log = logging.getLogger("bench_decoder")

DEFAULT_VARIANTS = "plain,fold_snake,conv2d,tconv_as_conv,conv2d+tconv_as_conv+fold_snake"


def snr_db(x: np.ndarray, ref: np.ndarray) -> float:
    """10 log10(|ref|^2 / |x - ref|^2); inf when equal."""
    noise = float(np.sum((x.astype(np.float64) - ref) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(float(np.sum(ref.astype(np.float64) ** 2)) / noise)


def parse_variant(text: str) -> tuple[str, str, str]:
    """``[int8:|int8c:]name[@opt]`` -> (graph options name, optimization level, quantization: "", "int8", "int8c")."""
    quant, sep, body = text.partition(":")
    if not sep:
        quant, body = "", text
    elif quant not in ("int8", "int8c"):
        raise SystemExit(f"unknown quantization {quant!r} in variant {text!r}: int8 or int8c")
    name, _, opt = body.partition("@")
    return name, opt or "all", quant


def options_of(name: str):
    from kztts.export.graphs.codec_graphs import DecoderOptions

    fields = [] if name == "plain" else name.split("+")
    unknown = set(fields) - {"conv2d", "tconv_as_conv", "fold_snake"}
    if unknown:
        raise SystemExit(f"unknown decoder option(s) {sorted(unknown)} in variant {name!r}")
    return DecoderOptions(**{f: True for f in fields})


def export_variant(model_dir: Path, work: Path, name: str, quant: str, cache: dict) -> Path:
    """The decoder_stream graph of variant ``name`` (exported once into ``work``); ``quant`` "int8":
    its convs quantized per tensor, "int8c": per output channel (ORT dynamic quantization)."""
    path = work / ((quant + "-" if quant else "") + name) / "decoder_stream.onnx"
    if path.is_file():
        return path
    if quant:
        src = export_variant(model_dir, work, name, "", cache)
        from onnxruntime.quantization import QuantType, quantize_dynamic

        path.parent.mkdir(parents=True, exist_ok=True)
        log.info("quantizing %s convs to 8 bits (%s)", name, quant)
        quantize_dynamic(str(src), str(path), op_types_to_quantize=["Conv"], weight_type=QuantType.QUInt8,
                         per_channel=quant == "int8c")
        return path
    from kztts.export.graphs.codec_graphs import DecoderStep, export_stream_graph

    if "st" not in cache:
        from kztts.export.common.qwen_import import import_qwen_tts

        cache["st"] = import_qwen_tts().Qwen3TTSTokenizer.from_pretrained(str(model_dir / "speech_tokenizer")).model
    log.info("exporting decoder_stream %s", name)
    step = DecoderStep(cache["st"].decoder, options_of(name)).eval()
    export_stream_graph(step, path)
    return path


def open_session(path: Path, threads: int, opt: str):
    import onnxruntime as ort

    from kztts.bundle.sessions import SessionConfig, _session_options

    so = _session_options(SessionConfig(threads=threads, optimization=opt, spinning=False))
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def run_once(dec, codes: np.ndarray, chunk: int) -> tuple[float, float, np.ndarray]:
    """Wall and CPU seconds (all threads of this process) spent in pushes of ``chunk`` frames over
    all ``codes`` from a fresh state, and the samples. CPU time is what a busy shared machine
    disturbs least (another process's time slices are not counted)."""
    dec.reset()
    wall, cpu, out = 0.0, 0.0, []
    for i in range(0, len(codes), chunk):
        t, c = time.perf_counter(), time.process_time()
        out.append(dec.push(codes[i:i + chunk]))
        wall += time.perf_counter() - t
        cpu += time.process_time() - c
    return wall, cpu, np.concatenate(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", help="checkpoint (default: the random-weight --size model)")
    ap.add_argument("--size", default="0.6b", choices=["tiny", "0.6b", "1.7b"])
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help="comma list; the first is the SNR reference")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--chunk", default="4", help="frames per push, comma list")
    ap.add_argument("--frames", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (after one warm-up round), >= 1")
    ap.add_argument("--work", help="exported variants (default: $KZTTS_CACHE/bench-decoder/<model>)")
    ap.add_argument("--save-optimized", action="store_true", help="also write ORT's optimized graph per variant")
    ap.add_argument("--profile", action="store_true", help="also print each variant's ORT node time by op type")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    from kztts.core.cache import cache_dir
    from kztts.runners.codec import StreamingDecoder

    if args.model_dir:
        model_dir = Path(args.model_dir)
    else:
        from kztts.export.tts.tiny import cached_tiny

        model_dir = cached_tiny(variant="equal" if args.size == "tiny" else None, size=args.size)
    work = Path(args.work) if args.work else cache_dir() / "bench-decoder" / model_dir.name
    if args.rounds < 1:
        raise SystemExit("--rounds must be >= 1")
    variants = [v for v in args.variants.split(",") if v]
    threads = [int(t) for t in args.threads.split(",")]
    chunks = [int(c) for c in args.chunk.split(",")]
    cache: dict = {}
    paths = {v: export_variant(model_dir, work, parse_variant(v)[0], parse_variant(v)[2], cache) for v in variants}
    cache.clear()
    if args.save_optimized:
        for v in variants:
            save_optimized(paths[v], parse_variant(v)[1], work / f"optimized-{v.replace(':', '-')}.onnx")

    if args.profile:
        for v in variants:
            profile(paths[v], parse_variant(v)[1], threads[0], chunks[0], args.frames, v)
    decs = {}
    for v in variants:
        for t in threads:
            decs[v, t] = StreamingDecoder(open_session(paths[v], t, parse_variant(v)[1]))
    codes = np.random.default_rng(0).integers(0, 2048, (args.frames, 16), dtype=np.int64)
    load_start = psutil.getloadavg()
    times: dict[tuple, list[float]] = {}
    cpu_times: dict[tuple, list[float]] = {}
    audio: dict[tuple, np.ndarray] = {}
    keys = [(v, t, c) for t in threads for c in chunks for v in variants]
    for r in range(args.rounds + 1):
        order = keys[r % len(keys):] + keys[:r % len(keys)]  # rotate: no variant always runs first
        for key in order:
            wall, cpu, wav = run_once(decs[key[0], key[1]], codes, key[2])
            if r:
                times.setdefault(key, []).append(wall * 1e3 / args.frames)
                cpu_times.setdefault(key, []).append(cpu * 1e3 / args.frames)
            audio.setdefault(key, wav)
    load_end = psutil.getloadavg()

    print(f"\n{model_dir.name}: decoder_stream, {args.frames} frames, {args.rounds} rounds, "
          f"load average {load_start[0]:.2f} at start, {load_end[0]:.2f} at end")
    print("ms/frame: wall (median over rounds, min), CPU of all threads (median); ratios to the first variant")
    print(f"{'variant':<40}{'thr':>4}{'chunk':>6}{'wall':>8}{'min':>8}{'ratio':>7}{'CPU':>8}{'ratio':>7}{'SNR dB':>8}")
    for t in threads:
        for c in chunks:
            ref_key = (variants[0], t, c)
            base, base_cpu = float(np.median(times[ref_key])), float(np.median(cpu_times[ref_key]))
            for v in variants:
                ms, cpu = times[v, t, c], float(np.median(cpu_times[v, t, c]))
                snr = snr_db(audio[v, t, c], audio[ref_key])
                print(f"{v:<40}{t:>4}{c:>6}{np.median(ms):>8.1f}{min(ms):>8.1f}{np.median(ms) / base:>7.3f}"
                      f"{cpu:>8.1f}{cpu / base_cpu:>7.3f}{snr:>8.1f}")
    return 0


def profile(path: Path, opt: str, threads: int, chunk: int, frames: int, label: str, top: int = 9) -> None:
    """ORT's per-node profile of one streaming pass (after a warm-up pass), summed by op type."""
    import collections
    import json

    import onnxruntime as ort

    from kztts.bundle.sessions import SessionConfig, _session_options
    from kztts.runners.codec import StreamingDecoder

    so = _session_options(SessionConfig(threads=threads, optimization=opt, spinning=False))
    so.enable_profiling = True
    so.profile_file_prefix = str(Path(tempfile.gettempdir()) / f"kztts-bench-decoder-{os.getpid()}")
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    codes = np.random.default_rng(0).integers(0, 2048, (frames, 16), dtype=np.int64)
    run_once(StreamingDecoder(sess), codes, chunk)
    events = json.loads(Path(sess.end_profiling()).read_text())
    by_op: collections.Counter = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            by_op[e["args"].get("op_name", "?")] += e["dur"]
    total = sum(by_op.values())
    print(f"profile {label} ({threads} threads, chunk {chunk}): node time {total / 1e3 / frames:.1f} ms/frame; "
          + ", ".join(f"{op} {100 * us / total:.0f}%" for op, us in by_op.most_common(top)))


def save_optimized(path: Path, opt: str, out: Path) -> None:
    """ORT's optimized graph of ``path`` (op types after its transforms), weights kept external."""
    import collections

    import onnx
    import onnxruntime as ort

    from kztts.bundle.sessions import _OPT_LEVELS

    so = ort.SessionOptions()
    so.graph_optimization_level = _OPT_LEVELS[opt]
    so.optimized_model_filepath = str(out)
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name", out.name + ".data")
    so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    so.log_severity_level = 3
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    ops = collections.Counter(n.op_type for n in onnx.load(str(out), load_external_data=False).graph.node)
    print(f"{path.parent.name} @{opt}: " + ", ".join(f"{k} {n}" for k, n in ops.most_common()))


if __name__ == "__main__":
    raise SystemExit(main())
