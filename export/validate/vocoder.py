"""The real-vocoder judge of decoder precision: Piper's ``en_US-joe-medium`` decoder (latent -> waveform,
HiFi-GAN style, trained weights) under each recipe, judged by SNR against fp32, the ASR round trip and DNSMOS.

- :func:`cut_decoder`: the decoder cut out of the whole voice with ``onnx.utils.extract_model``
  (``kztts.eval.piper_voice.DECODER_INPUT`` -> ``DECODER_OUTPUT``).
- :func:`record_latents`: the voice's real latents for a fixed text set, kept in an ``.npz`` (the voice's noise is
  sampled inside its graph: recorded once, every recipe decodes the same latents).
- :func:`recipe_graphs`: the decoder under ``RECIPES``: fp32 (CPU), fp16 (the float graph on the simulated HTP,
  strict), w8a16 and a8w8 (QDQ on the simulated HTP, strict), cpu_int8 (static QDQ, per-channel weights,
  calibrated activations: ORT's QLinearConv), dynamic_int8 (today's rejected ConvInteger option), and plan (the
  per-node plan of ``kztts.export.htp.graph_analysis``, on the simulated HTP). Ranges and the plan come from
  ``CALIBRATION_TEXTS``; the judged sentences are ``TEXTS`` (no overlap).
- :func:`judge`: per recipe, SNR of all judged audio against fp32's, Whisper WER (``kztts.eval.asr``) against
  fp32's WER on the same sentences, DNSMOS SIG/BAK/OVRL (``kztts.eval.dnsmos``); :func:`run_study` adds the CPU
  EP's ms per second of audio (1 thread, the recipes' graphs timed round-robin) and the paper's HTP ms per audio
  second (the target SoC's measured conv-decoder rate, ``kztts.htp.cost.conv_decoder_rate``: :func:`paper_ms_per_s`).

A recipe keeps speech when its WER is within ``WER_MARGIN`` (1 point) of fp32's and no DNSMOS score falls more
than ``DNSMOS_MARGIN`` below fp32's (SIG: speech distortion, BAK: added noise, OVRL).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kztts.bundle import precisions as P_
from kztts.core.metrics import snr_db
from kztts.eval import dnsmos
from kztts.eval import piper_voice as P
from kztts.eval.asr import load_judge
from kztts.export.common import graph_qdq as Q
from kztts.export.htp.graph_analysis import DEFAULT_TARGET_DB, analyse, load_samples, save_samples
from kztts.export.validate.graph_plan import run_on_cpu, run_on_target
from kztts.htp.cost import conv_decoder_rate, node_macs
from kztts.htp.targets import load_target

log = logging.getLogger(__name__)

TEXTS = (
    "The birch canoe slid on the smooth planks.",
    "Glue the sheet to the dark blue background.",
    "It's easy to tell the depth of a well.",
    "These days a chicken leg is a rare dish.",
    "Rice is often served in round bowls.",
    "The juice of lemons makes fine punch.",
)
CALIBRATION_TEXTS = (
    "A large size in stockings is hard to sell.",
    "The boy was there when the sun rose.",
    "Kick the ball straight and follow through.",
)
# the HTP rows are the registry's plan precisions (kztts.bundle.precisions): fp16, w8a16, a8w8
HTP_RECIPES = (*P_.PLAN_PRECISIONS, "plan")  # run on the simulated HTP
RECIPES = ("fp32", *P_.PLAN_PRECISIONS, "cpu_int8", "dynamic_int8", "plan")
WER_MARGIN = 0.01
DNSMOS_MARGIN = 0.2
LANGUAGE = "english"


def cut_decoder(voice_dir: str | Path, dst: str | Path) -> Path:
    """The voice's decoder (latent [1, 192, T] -> waveform [1, 1, 256 T]) as its own graph."""
    from onnx.utils import extract_model

    extract_model(str(Path(voice_dir) / P.MODEL_FILE), str(dst), [P.DECODER_INPUT], [P.DECODER_OUTPUT])
    return Path(dst)


def record_latents(voice_dir: str | Path, texts, dst: str | Path, noise: bool = True) -> list[dict]:
    """The decoder feeds of ``texts`` (recorded once into ``dst``, read back afterwards; ``noise``: the voice's
    sampled noise, else none and the same latents on every run)."""
    dst = Path(dst)
    if not dst.is_file():
        save_samples(dst, [{P.DECODER_INPUT: lat} for lat in P.voice_latents(voice_dir, list(texts), noise)])
    return load_samples(dst, [P.DECODER_INPUT])


def conv_macs(graph: str | Path, feed: dict) -> int:
    """Multiply-accumulates of the Conv/ConvTranspose/MatMul nodes of ``graph`` on ``feed`` (shapes inferred)."""
    import onnx

    model = onnx.load(str(graph))
    for i in model.graph.input:
        if i.name in feed:
            dims = i.type.tensor_type.shape.dim
            for d, n in zip(dims, feed[i.name].shape):
                d.ClearField("dim_param")
                d.dim_value = int(n)
    model = onnx.shape_inference.infer_shapes(model)
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
              for vi in (*model.graph.value_info, *model.graph.input, *model.graph.output)}
    shapes.update({t.name: list(t.dims) for t in model.graph.initializer})
    total = 0
    for n in model.graph.node:
        if n.op_type in Q.QUANT_OPS:
            total += node_macs(n.op_type, [shapes.get(x, []) for x in n.input], [shapes.get(n.output[0], [])])
    return total


@dataclass
class RecipeRow:
    """One recipe's judgement."""

    recipe: str
    device: str
    snr_db: float = float("nan")
    wer: float | None = None
    dnsmos: dict = field(default_factory=dict)
    cpu_ms_per_s: float | None = None
    keeps_speech: bool | None = None
    note: str = ""


def recipe_graphs(decoder: Path, calib: list[dict], work: Path, *, target_db: float = DEFAULT_TARGET_DB,
                  with_plan: bool = True) -> tuple[dict[str, Path], dict | None]:
    """{recipe: graph file} (module docstring) and the analysis JSON behind the plan (None without it)."""
    prepared = Q.prepare(decoder, work / "fp32.onnx")
    cache = work / "ranges.json"
    Q.graph_ranges(prepared, calib, cache)
    out = {"fp32": prepared, P_.PLAN_FLOAT: prepared}
    for r in (*P_.PLAN_QUANTIZED, "cpu_int8"):
        out[r] = Q.quantize(prepared, work / f"{r}.onnx", r, cache)
    out["dynamic_int8"] = Q.quantize_dynamic_int8(prepared, work / "dynamic_int8.onnx")
    analysis = None
    if with_plan:
        a = analyse(decoder, calib, target_db=target_db, work_dir=None)
        analysis = a.to_json()
        out["plan"] = Q.quantize_plan(prepared, work / "plan.onnx", analysis["plan"]["nodes"], cache)
    return out, analysis


def time_cpu(graphs: dict[str, Path], feeds: list[dict], rounds: int = 3, threads: int = 1) -> dict[str, float]:
    """CPU ms per call set (every feed once) of each graph on the CPU EP, ``threads`` threads, round-robin over
    the graphs ``rounds`` times (process CPU time: other jobs' time slices do not enter it); the median."""
    import onnxruntime as ort

    sessions = {}
    for name, g in graphs.items():
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.intra_op_num_threads = threads
        sessions[name] = ort.InferenceSession(str(g), so, providers=["CPUExecutionProvider"])
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for s in sessions.values():  # warm-up
        s.run(None, feeds[0])
    for _ in range(rounds):
        for name, s in sessions.items():
            t = time.process_time()
            for f in feeds:
                s.run(None, f)
            times[name].append((time.process_time() - t) * 1e3)
    return {k: float(np.median(v)) for k, v in times.items()}


def judge(wavs: dict[str, list[np.ndarray]], sample_rate: int, texts, judge_asr=None) -> dict[str, RecipeRow]:
    """SNR against fp32, WER and DNSMOS per recipe (``wavs[recipe]``: one waveform per text)."""
    asr = judge_asr or load_judge([LANGUAGE])
    ref = np.concatenate([w.reshape(-1) for w in wavs["fp32"]])
    rows = {}
    for r, ws in wavs.items():
        row = RecipeRow(r, "cpu")
        row.snr_db = float(snr_db(np.concatenate([w.reshape(-1) for w in ws]), ref))
        edits = units = 0
        for w, t in zip(ws, texts):
            res = asr.score(w.reshape(-1), sample_rate, t, LANGUAGE)
            edits, units = edits + res.edits, units + res.units
        row.wer = edits / max(1, units)
        scores = [dnsmos.score(w.reshape(-1), sample_rate) for w in ws]
        row.dnsmos = {k: float(np.mean([getattr(s, k) for s in scores])) for k in ("sig", "bak", "ovrl")}
        rows[r] = row
    base = rows["fp32"]
    for row in rows.values():
        row.keeps_speech = (row.wer <= base.wer + WER_MARGIN
                            and all(row.dnsmos[k] >= base.dnsmos[k] - DNSMOS_MARGIN for k in base.dnsmos))
    return rows


def paper_ms_per_s(macs_per_s: float, target: str) -> float:
    """HTP ms per audio second on paper for ``target``: the decoder's MACs per audio second over the target SoC's
    measured conv-decoder rate (``kztts.htp.cost.conv_decoder_rate``, the one ``paper_estimate`` uses)."""
    return macs_per_s / (conv_decoder_rate(load_target(target))["gmacs_per_s"] * 1e9) * 1e3


def run_study(voice_dir: str | Path, work: str | Path, *, texts=TEXTS, calibration_texts=CALIBRATION_TEXTS,
              recipes=RECIPES, target: str = "simulator", htp_sentences: int = 2, rounds: int = 3,
              target_db: float = DEFAULT_TARGET_DB, timing: bool = True, paper_target: str = "x_elite") -> dict:
    """The whole study (module docstring). ``rows``: every recipe but fp16 on the CPU EP over all ``texts`` (a QDQ
    graph there predicts the HTP's arithmetic); ``htp_rows``: fp32 on the CPU and each HTP recipe on ``target``
    (strict) over the first ``htp_sentences`` texts (the simulator is 50-200x slower than the CPU), with
    ``snr_vs_cpu_db``: the simulator against the same graph on the CPU EP."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    decoder = work / "decoder.onnx"
    if not decoder.is_file():
        cut_decoder(voice_dir, decoder)
    calib = record_latents(voice_dir, calibration_texts, work / "calibration_latents.npz")
    feeds = record_latents(voice_dir, texts, work / "latents.npz")
    graphs, analysis = recipe_graphs(decoder, calib, work, target_db=target_db, with_plan="plan" in recipes)
    graphs = {k: v for k, v in graphs.items() if k in recipes}
    wavs = {r: run_on_cpu(g, feeds) for r, g in graphs.items() if r != P_.PLAN_FLOAT}  # fp16: the HTP's only
    sample_rate = 22050
    rows = judge(wavs, sample_rate, texts)
    htp_rows: dict = {}
    n = min(htp_sentences, len(feeds))
    if n and target:
        sim = {"fp32": [w for w in wavs["fp32"][:n]]}
        for r in (x for x in HTP_RECIPES if x in graphs):
            log.info("decoding %d sentences on %s (strict): %s", n, target, r)
            sim[r] = run_on_target(graphs[r], feeds[:n], target, strict=True)
        htp_rows = judge(sim, sample_rate, texts[:n])
        for r, row in htp_rows.items():
            row.device = "cpu" if r == "fp32" else f"{target} (strict)"
            if r in wavs and r != "fp32":
                row.note = "SNR vs the same graph on the CPU EP: %.1f dB" % snr_db(
                    np.concatenate([w.reshape(-1) for w in sim[r]]),
                    np.concatenate([w.reshape(-1) for w in wavs[r][:n]]))
    seconds = sum(w.size for w in wavs["fp32"]) / sample_rate
    if timing:
        cpu = time_cpu({r: g for r, g in graphs.items() if r != P_.PLAN_FLOAT}, feeds, rounds=rounds)
        for r, ms in cpu.items():
            rows[r].cpu_ms_per_s = ms / seconds
    macs = sum(conv_macs(graphs["fp32"], f) for f in feeds) / seconds
    return {"texts": list(texts), "calibration_texts": list(calibration_texts), "audio_seconds": seconds,
            "macs_per_audio_second": macs, "paper_target": paper_target,
            "paper_ms_per_audio_second": paper_ms_per_s(macs, paper_target),
            "rows": {k: v.__dict__ for k, v in rows.items()},
            "htp_rows": {k: v.__dict__ for k, v in htp_rows.items()}, "htp_sentences": n,
            "analysis": analysis, "wavs": wavs, "sample_rate": sample_rate}


__all__ = ["CALIBRATION_TEXTS", "RECIPES", "TEXTS", "RecipeRow", "conv_macs", "cut_decoder", "judge",
           "paper_ms_per_s", "recipe_graphs", "record_latents", "run_study", "time_cpu"]
