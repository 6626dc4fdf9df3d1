"""One kztts benchmark configuration, in its own process: ``python -m kztts.bench.worker SPEC.json``.

A process per configuration gives each its own peak RSS (VmHWM) and leaves no session of
another configuration in memory. numpy + ONNX Runtime only.

1. Open only the graphs the configuration runs (Talker, the Code Predictor graph of its
   mode, ``decoder_stream``), each wrapped to count its runs.
2. Warm-up pass, then the timed pass: ``TTS.stream`` greedy, EOS blocked for every frame
   (``min_new_tokens`` = frames), so every configuration produces the same number of frames;
   per-call times of prefill, Talker decode, Code Predictor and decoder pushes. Peak RSS
   is read here, before the accuracy pass opens anything else.
   Then the time to first audio of ten 10-word English texts (``kztts.eval.ttfa``): p50 and p95.
3. Accuracy on the baseline's codes G (the fp32 bundle, or this run's own codes when this
   is the baseline): teacher-forced Talker logits, teacher-forced ``cp_step`` logits from
   the baseline's hidden states, and the decoder's audio for G.
"""
from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field, replace

import numpy as np

from kztts.bundle.bundle import Bundle
from kztts.bundle.sessions import SessionConfig
from kztts.core import metrics
from kztts.core.worker_process import worker_main
from kztts.eval.replay import decode_inputs, teacher_forced_talker
from kztts.eval.ttfa import percentiles_ms, ttfa_over_texts
from kztts.plan.resolve import resolve_plan
from kztts.runners.codec import Decoder
from kztts.tts.request import Voice
from kztts.tts.tts import TTS

log = logging.getLogger(__name__)


class CountingSession:
    """An ONNX Runtime session that counts its runs (everything else is delegated)."""

    def __init__(self, session):
        self._session = session
        self.runs = 0

    def run(self, *args, **kwargs):
        self.runs += 1
        return self._session.run(*args, **kwargs)

    def run_with_iobinding(self, *args, **kwargs):
        self.runs += 1
        return self._session.run_with_iobinding(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._session, name)


def _timed(obj, name: str, sink: list[float]) -> None:
    """Replace ``obj.name`` by a wrapper appending each call's duration to ``sink``."""
    fn = getattr(obj, name)

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        sink.append(time.perf_counter() - t)
        return out

    setattr(obj, name, wrapper)


def teacher_forced(tts, prompt, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Talker logits [F, V] and hidden [F, H] of ``tts``: after the prefill, then after feeding
    frames 0..F-2 of ``codes`` (the last frame is never fed back)."""
    return teacher_forced_talker(tts.talker, prompt.embeds, decode_inputs(tts.tables, prompt, codes[:-1]))


@dataclass
class Instrumented:
    """A ``TTS`` whose Talker, Code Predictor and streaming decoder record each call's duration, and
    whose sessions count their runs."""

    tts: TTS
    counters: dict  # graph -> CountingSession
    times: dict = field(default_factory=lambda: {"prefill": [], "talker": [], "code_predictor": [], "decoder": []})
    pushes: list = field(default_factory=list)  # frames per decoder push
    chunk_times: list = field(default_factory=list)  # when each audio chunk of the last stream came out
    open_s: float = 0.0

    def clear(self) -> None:
        for v in self.times.values():
            v.clear()
        self.pushes.clear()


def open_instrumented(spec: dict) -> Instrumented:
    t_open = time.perf_counter()
    attention = spec.get("attention", "fused")
    pipeline = bool(spec.get("pipeline", False))
    # pipelined: the decoder gets one core of its own next to the Talker and Code Predictor
    cfg = SessionConfig(threads=int(spec["threads"]), spinning=bool(spec.get("spin", False)),
                        decoder_threads=1 if pipeline else None)
    bundle = Bundle.open(spec["bundle"], cfg, load_graphs=False)
    counters = {}
    plan = resolve_plan(bundle, cp_mode=spec["cp_mode"], attention=attention)
    for name in plan.graphs(("talker_decode", "code_predictor", "decoder")):
        counters[name] = CountingSession(plan.session(name))
        bundle._sessions[name] = counters[name]
    run = Instrumented(TTS(bundle, cp_mode=spec["cp_mode"], pipeline=pipeline, attention=attention), counters)
    _timed(run.tts.talker, "prefill", run.times["prefill"])
    _timed(run.tts.talker, "decode", run.times["talker"])
    _timed(run.tts.code_predictor, "predict", run.times["code_predictor"])
    dec = run.tts.streaming_decoder()
    push = dec.push

    def counted_push(codes):
        run.pushes.append(len(codes))
        return push(codes)

    dec.push = counted_push
    _timed(dec, "push", run.times["decoder"])
    run.open_s = time.perf_counter() - t_open
    return run


def stream(run: Instrumented, spec: dict, voice: Voice, n: int) -> tuple[np.ndarray, object, float]:
    """A greedy stream of exactly ``n`` frames (EOS blocked): its audio, result and wall seconds."""
    s = replace(run.tts.default_settings().greedy(), min_new_tokens=n)
    holder: dict = {}
    run.chunk_times.clear()
    t = time.perf_counter()
    audio = []
    # max_frames on the request: the bench's own count, so a short text's runaway cap does not end it early
    for a in run.tts.stream(spec["text"], voice, language=spec.get("language"), greedy=True, settings=s,
                            max_frames=n, chunk_frames=int(spec["chunk"]), result=holder):
        audio.append(a)
        run.chunk_times.append(time.perf_counter())
    return np.concatenate(audio), holder["result"], time.perf_counter() - t


def speed_row(run: Instrumented, spec: dict, result, wall: float, runs: dict, prompt, peak: float) -> dict:
    """The timing columns: medians per stage after the warm-up frames, first audio, wall, memory."""
    frames, warmup, chunk = int(spec["frames"]), int(spec["warmup"]), int(spec["chunk"])
    times = run.times
    dec_per_frame = [t / n for t, n in zip(times["decoder"], run.pushes)]
    row = {
        "prefill_ms": metrics.median_ms(times["prefill"][1:] or times["prefill"]),
        "prefill_positions": int(prompt.embeds.shape[0]),
        "talker_ms": metrics.median_ms(times["talker"], warmup),
        "cp_ms": metrics.median_ms(times["code_predictor"], warmup),
        "decoder_ms": metrics.median_ms(dec_per_frame, -(-warmup // chunk)),
        "ttfa_ms": round(result.times.first_audio * 1e3, 1),
        "wall_s": round(wall, 3),
        "audio_s": round(result.audio_seconds, 3),
        "rtf": round(wall / result.audio_seconds, 4),
        "peak_rss_mb": peak,
        "runs_per_frame": round(sum(runs.values()) / frames, 3),
        "runs": runs,
        "open_s": round(run.open_s, 2),
        "frames": frames,
    }
    row["frame_ms"] = round(row["talker_ms"] + row["cp_ms"] + row["decoder_ms"], 3)
    # steady state of the stream: wall time between the first and the last audio chunk per frame
    # (with pipelining the stages overlap, so frame_ms, their sum, overstates the cost)
    ct = run.chunk_times
    row["frame_wall_ms"] = (round((ct[-1] - ct[0]) * 1e3 / (frames - chunk), 3)
                            if frames > chunk and len(ct) > 1 else None)
    row["pipeline"] = bool(spec.get("pipeline", False))
    row["frame_rtf"] = round(row["frame_ms"] / 80.0, 4)  # 12.5 frames per second of audio
    row["times_ms"] = {k: [round(x * 1e3, 3) for x in v] for k, v in times.items()}
    return row


def accuracy(tts: TTS, spec: dict, prompt, codes: np.ndarray, audio: np.ndarray) -> dict:
    """The accuracy columns against the baseline's codes G (or this run's own, when it is the baseline,
    which it then saves): teacher-forced Talker and ``cp_step`` logits, and the decoder's audio of G."""
    base_path = spec.get("baseline")
    base = dict(np.load(base_path)) if base_path else None
    g = base["codes"] if base is not None else codes
    tf_talker, tf_hidden = teacher_forced(tts, prompt, g)
    step = resolve_plan(tts.bundle, cp_mode="step").open_code_predictor(tts.tables)  # logits: the step graph
    hidden_for_cp = base["talker_hidden"] if base is not None else tf_hidden
    tf_cp = np.stack([step.teacher_forced_logits(hidden_for_cp[k], int(g[k, 0]), g[k, 1:]) for k in range(len(g))])
    dec = tts.streaming_decoder()
    wav_on_g = Decoder(tts.plan.session("decoder_stream", "cpu"), chunk_size=dec.chunk_size,
                       left_context=dec.left_context).decode(g)
    if base is None:
        np.savez(spec["save_baseline"], codes=codes, talker_logits=tf_talker, talker_hidden=tf_hidden,
                 cp_logits=tf_cp, wav=wav_on_g)
        base = {"codes": codes, "talker_logits": tf_talker, "cp_logits": tf_cp, "wav": wav_on_g}
    return metrics.accuracy(codes, tf_talker, tf_cp, wav_on_g, audio, base)


def run(spec: dict) -> dict:
    """Run one configuration; return its result row (see module docstring)."""
    inst = open_instrumented(spec)
    tts = inst.tts
    voice = Voice(np.load(spec["xvector"]).astype(np.float32).reshape(-1))
    frames = int(spec["frames"])
    stream(inst, spec, voice, max(int(spec["warmup"]), 1))  # warm-up: first-run allocations, page faults, threads
    inst.clear()
    runs_before = {n: c.runs for n, c in inst.counters.items()}
    audio, result, wall = stream(inst, spec, voice, frames)
    runs = {n: c.runs - runs_before[n] for n, c in inst.counters.items()}
    prompt = tts.prompt(spec["text"], voice, language=spec.get("language"))
    inst.times["prefill"].clear()  # whole prompts only (a stream prefills a kept voice prefix's text part)
    for _ in range(int(spec.get("prefill_repeats", 3))):  # more prefill samples (the cache is reset by it)
        tts.talker.prefill(prompt.embeds)
    peak = metrics.peak_rss_mb()  # before the accuracy pass opens anything else
    if result.frames != frames:
        raise RuntimeError(f"expected {frames} frames, got {result.frames}")
    row = speed_row(inst, spec, result, wall, runs, prompt, peak)
    # time to first audio over ten texts, from the call, every graph warm from the runs above
    ttfa = ttfa_over_texts(tts, voice, chunk_frames=int(spec["chunk"]), first_chunk=int(spec.get("first_chunk", 1)))
    row.update(percentiles_ms(ttfa), ttfa_texts=len(ttfa))
    row.update(accuracy(tts, spec, prompt, result.codes, audio))
    if spec.get("save_codes"):
        np.save(spec["save_codes"], result.codes)
    return row


def main(argv: list[str] | None = None) -> int:
    return worker_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
