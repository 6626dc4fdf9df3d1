"""One HTP row of ``kztts bench``, in its own process: ``python -m kztts.bench.htp_worker SPEC.json``.

The target's static graphs run on the HTP simulator of onnxruntime-qnn (strict: no node may
fall back to the CPU, and a missing QNN EP is an error). The simulator computes the HTP's real
fp16 / quantized numerics but is 50-200x slower than the CPU, so nothing here is timed: the
row has accuracy columns and peak RSS only. An own process also keeps the simulator's fp16
mode away from fp32 sessions (it leaks across sessions of one process, docs/QNN_EP.md).

Against the fp32 baseline (``kztts.bench.worker``'s ``baseline.npz``, codes G):
- teacher-forced Talker logits on G (cosine, argmax agreement);
- Code Predictor, when the target puts ``cp_frame`` on the HTP: its greedy codes from the fp32
  Talker hidden states and G's CB0, against G's CB1..15 (``validate_htp.greedy_cp_codes`` on the
  plan's own session; the graph
  chains its 15 steps internally and returns codes, not logits, so there is no CP cosine);
- the free-running greedy codes (EOS blocked) against G;
- the decoder on G: the plan's (``decoder_chunk`` on the HTP when the target places it there,
  the last partial chunk padded), else the CPU fp32 decoder; and the row's own codes decoded on the CPU.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import replace

import numpy as np

from kztts.bench.worker import teacher_forced
from kztts.bundle.bundle import Bundle
from kztts.bundle.sessions import SessionConfig
from kztts.core import metrics
from kztts.core.worker_process import worker_main
from kztts.htp.qnn import Placement, session_precision
from kztts.htp.targets import load_target
from kztts.runners.codec import Decoder
from kztts.tts.request import Voice
from kztts.tts.tts import TTS

log = logging.getLogger(__name__)

UNTIMED = "untimed: the HTP simulator computes the HTP's numerics on the x86 CPU, 50-200x slower than a device"


def _placement(tts) -> dict:
    """Per graph the plan puts on the HTP: nodes on QNN and on the CPU, and the arithmetic in force."""
    graphs = tts.bundle.manifest.graphs
    out = {}
    for step in tts.plan.steps.values():
        if step.device != "htp":
            continue
        for name in step.graphs:
            sess = tts.plan.session(name)
            pl = Placement.of(sess)
            out[name] = {"qnn_nodes": pl.qnn_nodes, "cpu_nodes": pl.cpu_nodes,
                         "precision": session_precision(graphs[name].precision, sess)}
    return out


def _open_sessions(tts) -> dict:
    """Open the plan's sessions one by one, each graph once (a prefill-only Talker serves decode with
    its prefill graph): the process's resident MB after each, which says where the peak RSS goes."""
    import psutil

    out = {"start": round(psutil.Process().memory_info().rss / 2 ** 20, 1)}
    for name in tts.plan.graphs(("talker_prefill", "talker_decode", "code_predictor", "decoder")):
        tts.plan.session(name)
        out[f"{name} ({tts.plan.device_of(name)})"] = round(psutil.Process().memory_info().rss / 2 ** 20, 1)
    return out


def run(spec: dict) -> dict:
    """Run one HTP row; return its result row (see the module docstring)."""
    from kztts.export.validate.htp import greedy_cp_codes
    target = load_target(spec["target"])
    bundle = Bundle.open(spec["bundle"], SessionConfig(threads=int(spec["threads"])), load_graphs=False)
    tts = TTS(bundle, target=target, strict=True)
    voice = Voice(np.load(spec["xvector"]).astype(np.float32).reshape(-1))
    frames = int(spec["frames"])
    base = dict(np.load(spec["baseline"]))
    g = base["codes"]

    rss_after_open = _open_sessions(tts)
    prompt = tts.prompt(spec["text"], voice, language=spec.get("language"))
    tf_talker, _ = teacher_forced(tts, prompt, g)
    settings = replace(tts.default_settings().greedy(), min_new_tokens=frames)
    codes = tts.generate_codes(spec["text"], voice, language=spec.get("language"), greedy=True, settings=settings,
                               max_frames=frames)

    cp_match = None
    cp_device, decoder_device = tts.plan.steps["code_predictor"].device, tts.plan.steps["decoder"].device
    if cp_device == "htp":  # on the plan's own cp_frame session: a second one would hold its weights again
        cp = greedy_cp_codes(tts.code_predictor,
                             base["talker_hidden"][:len(g)].astype(np.float32), g[:, 0])
        cp_match = float((cp == g[:, 1:]).mean())
    stream = tts.streaming_decoder()
    cpu_decoder = Decoder(tts.plan.session("decoder_stream", "cpu"), chunk_size=stream.chunk_size,
                          left_context=stream.left_context)
    wav_own = cpu_decoder.decode(codes)
    row = {"kind": "htp-sim", "timed": False, "untimed_reason": UNTIMED, "frames": frames,
           "prefill_positions": int(prompt.embeds.shape[0]), "context": target.shapes.context,
           "prefill_chunk": target.shapes.prefill_chunk, "soc": target.soc.name,
           "cp_device": cp_device, "decoder_device": decoder_device, "placement": _placement(tts),
           "talker_graphs": target.talker_graphs, "rss_mb_after_open": rss_after_open,
           "context_binaries": sorted(n for n, g in tts.bundle.manifest.graphs.items() if g.extra.get("context_file"))}
    row.update(metrics.accuracy(codes, tf_talker, None, None, wav_own, base))
    row["cp_codes_match"] = cp_match
    # the decoder of the plan (decoder_chunk on the HTP when the target puts it there) on G, against the
    # fp32 CPU decoder's audio of G (the baseline's)
    row["snr_db"] = metrics.snr_db(tts.whole_decoder().decode(g), base["wav"])
    row["decoder_snr_db"] = row["snr_db"] if decoder_device == "htp" else None
    row["peak_rss_mb"] = metrics.peak_rss_mb()
    return row


def main(argv: list[str] | None = None) -> int:
    return worker_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
