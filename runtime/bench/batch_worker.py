"""One batched configuration, in its own process: ``python -m kztts.bench.batch_worker SPEC.json``.

B copies of the bench request (greedy, EOS blocked for ``frames`` frames) through
``TTS.stream_many`` at batch B (``kztts.tts.batch_loop``): every step decodes one Talker position and
runs one Code Predictor frame for all B streams; each stream has its own streaming decoder.
Only the batched graphs and the decoder are opened (no batch-1 Talker or Code Predictor), so the
peak RSS is the batch's own.

Row: per step (all streams) ``talker_ms``, ``cp_ms``; ``decoder_ms`` per frame of one stream;
``frame_ms`` = what one stream waits per frame (talker + CP + B x decoder: the decoders run one
after the other); ``fps`` = B frames per ``frame_ms`` (whole frame), ``fps_talker_cp`` = B frames
per talker + CP step, ``fps_wall`` = all frames over the timed run's wall time (prefills included);
``ttfa_ms`` the streams' mean time to first audio. Accuracy as ``kztts.bench.worker``, on stream 0,
with the Talker teacher-forced through all B rows at once (``rows_max_diff``: how far the other rows'
logits are from row 0's; 0 when batching changes nothing).
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import replace

import numpy as np

from kztts.bench.worker import _timed
from kztts.bundle.bundle import Bundle
from kztts.bundle.sessions import SessionConfig
from kztts.core import metrics
from kztts.core.worker_process import worker_main
from kztts.eval.replay import decode_inputs, teacher_forced_talker
from kztts.eval.ttfa import percentiles_ms
from kztts.plan.resolve import ExecutionPlan, resolve_plan
from kztts.runners.codec import Decoder
from kztts.runners.talker import DEFAULT_CONTEXT
from kztts.tts.request import SynthesisRequest, Voice
from kztts.tts.tts import TTS


class _AllRows:
    """A ``BatchedTalker`` behind the one-stream Talker API (``kztts.eval.replay``): every row gets the
    same input, row 0's output is returned, the others are compared with it."""

    def __init__(self, talker):
        self.talker = talker
        self.max_diff = 0.0

    def _same(self, logits: np.ndarray) -> None:
        self.max_diff = max(self.max_diff, float(np.abs(logits - logits[0]).max()))

    def prefill(self, embeds: np.ndarray):
        out = [self.talker.prefill(r, embeds) for r in range(self.talker.rows)]
        self._same(np.stack([o[0] for o in out]))
        return out[0]

    def decode(self, embed: np.ndarray):
        logits, hidden = self.talker.decode(np.repeat(embed[None], self.talker.rows, axis=0))
        self._same(logits)
        return logits[0], hidden[0]


class _Sizes:
    """What ``TTS`` reads of its one-stream Talker when only the batched graphs run: the context
    (prompt checks) and the vocabulary (the CB0 suppress list)."""

    def __init__(self, config: dict, context: int):
        self.context, self.vocab = context, int(config["vocab"])


def open_timed(spec: dict) -> tuple[TTS, dict]:
    """A ``TTS`` over the batched graphs only, whose batched Talker and Code Predictor time each call."""
    bundle = Bundle.open(spec["bundle"], SessionConfig(threads=int(spec["threads"])), load_graphs=False)
    m = bundle.manifest
    # the batch runs cp_frame_batched: leave the batch-1 Code Predictor unopened (its weights unread)
    one_stream = ExecutionPlan.open_code_predictor
    ExecutionPlan.open_code_predictor = lambda self, embeddings: None
    try:
        tts = TTS(bundle, talker=_Sizes(m.talker, min(DEFAULT_CONTEXT, int(m.talker["max_positions"]))))
    finally:
        ExecutionPlan.open_code_predictor = one_stream  # the accuracy pass opens cp_step
    open_batched = tts.plan.open_batched
    times: dict[str, list[float]] = {"talker": [], "code_predictor": []}

    def timed_open(*args, **kwargs):
        talker, cp = open_batched(*args, **kwargs)
        _timed(talker, "decode", times["talker"])
        _timed(cp, "predict", times["code_predictor"])
        return talker, cp

    tts.plan.open_batched = timed_open
    return tts, times


def stream_batch(tts: TTS, spec: dict, voice: Voice, n: int) -> tuple[np.ndarray, dict, float]:
    """``batch`` identical greedy streams of exactly ``n`` frames (EOS blocked): stream 0's audio,
    every stream's result, and the wall seconds."""
    batch = int(spec["batch"])
    s = replace(tts.default_settings().greedy(), min_new_tokens=n)
    req = SynthesisRequest(spec["text"], voice, spec.get("language"), greedy=True, settings=s, max_frames=n)
    results: dict = {}
    audio: list = []
    t = time.perf_counter()
    for index, a in tts.stream_many([req] * batch, batch=batch, chunk_frames=int(spec["chunk"]), results=results):
        if index == 0:
            audio.append(a)
    return np.concatenate(audio), results, time.perf_counter() - t


def speed_row(spec: dict, times: dict, results: dict, wall: float, peak: float, open_s: float) -> dict:
    batch, frames, warmup = int(spec["batch"]), int(spec["frames"]), int(spec["warmup"])
    talker_ms = metrics.median_ms(times["talker"], warmup)
    cp_ms = metrics.median_ms(times["code_predictor"], warmup)
    decoder_ms = round(1e3 * sum(r.times.decoder for r in results.values()) / (batch * frames), 3)
    frame_ms = round(talker_ms + cp_ms + batch * decoder_ms, 3)
    codes = results[0].codes
    return {
        "batch": batch,
        "talker_ms": talker_ms, "cp_ms": cp_ms, "decoder_ms": decoder_ms, "frame_ms": frame_ms,
        "fps": round(batch * 1e3 / frame_ms, 2),
        "fps_talker_cp": round(batch * 1e3 / (talker_ms + cp_ms), 2),
        "fps_wall": round(batch * frames / wall, 2),
        "ttfa_ms": round(1e3 * statistics.mean(r.times.first_audio for r in results.values()), 1),
        **percentiles_ms([r.times.first_audio for r in results.values()]),  # over the batch's streams
        "wall_s": round(wall, 3),
        "rtf": round(wall / (batch * results[0].audio_seconds), 4),
        "frame_rtf": round(frame_ms / 80.0 / batch, 4),  # 12.5 frames per second of audio, per stream
        "peak_rss_mb": peak,
        "streams_equal": all(np.array_equal(r.codes, codes) for r in results.values()),
        "open_s": round(open_s, 2),
        "frames": frames,
    }


def accuracy(tts: TTS, spec: dict, voice: Voice, codes: np.ndarray, audio: np.ndarray) -> dict:
    """Stream 0 against the baseline (``kztts.bench.worker``), every row of the batched Talker checked
    equal under teacher forcing."""
    base = dict(np.load(spec["baseline"]))
    g = base["codes"]
    prompt = tts.prompt(spec["text"], voice, language=spec.get("language"))
    row = {"prefill_positions": int(prompt.embeds.shape[0])}  # the "% of limit" counts the KV it leaves
    rows = _AllRows(tts.plan.open_batched(tts.tables, int(spec["batch"]), prompt.embeds.shape[0] + len(g))[0])
    tf_talker, _ = teacher_forced_talker(rows, prompt.embeds, decode_inputs(tts.tables, prompt, g[:-1]))
    row["rows_max_diff"] = rows.max_diff
    step = resolve_plan(tts.bundle, cp_mode="step").open_code_predictor(tts.tables)
    tf_cp = np.stack([step.teacher_forced_logits(base["talker_hidden"][k], int(g[k, 0]), g[k, 1:])
                      for k in range(len(g))])
    dec = tts.streaming_decoder()
    wav_on_g = Decoder(tts.plan.session(tts.plan.decoder_graph(), "cpu"), chunk_size=dec.chunk_size,
                       left_context=dec.left_context).decode(g)
    row.update(metrics.accuracy(codes, tf_talker, tf_cp, wav_on_g, audio, base))
    return row


def run(spec: dict) -> dict:
    t_open = time.perf_counter()
    tts, times = open_timed(spec)
    open_s = time.perf_counter() - t_open
    voice = Voice(np.load(spec["xvector"]).astype(np.float32).reshape(-1))
    batch, frames = int(spec["batch"]), int(spec["frames"])
    stream_batch(tts, spec, voice, max(int(spec["warmup"]), 1))
    for v in times.values():
        v.clear()
    audio, results, wall = stream_batch(tts, spec, voice, frames)
    peak = metrics.peak_rss_mb()
    if any(r.frames != frames for r in results.values()) or len(results) != batch:
        raise RuntimeError(f"expected {batch} streams of {frames} frames, got {[r.frames for r in results.values()]}")
    row = speed_row(spec, times, results, wall, peak, open_s)
    row.update(accuracy(tts, spec, voice, results[0].codes, audio))
    return row


def main(argv: list[str] | None = None) -> int:
    return worker_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
