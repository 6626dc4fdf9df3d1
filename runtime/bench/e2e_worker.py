"""The kztts side of the bench's end-to-end row: ``python -m kztts.bench.e2e_worker SPEC.json``.

What ``kztts synth`` does for one text (``TTS.synthesize`` with the default plan and decode,
then ``write_wav``), greedy with EOS blocked for ``spec["frames"]`` frames, timed from the
call to the written file; served run by run (``kztts.core.worker_process.serve_runs``). numpy + ONNX Runtime.
"""
from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from kztts.bundle.bundle import Bundle
from kztts.bundle.sessions import SessionConfig
from kztts.core.audio import write_wav
from kztts.core.worker_process import serve_runs
from kztts.tts.request import Voice
from kztts.tts.tts import TTS


def main(argv: list[str] | None = None) -> int:
    import json

    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    tts = TTS(Bundle.open(spec["bundle"], SessionConfig(threads=int(spec["threads"]))))
    voice = Voice(np.load(spec["xvector"]).astype(np.float32).reshape(-1))
    n = int(spec["frames"])
    settings = replace(tts.default_settings().greedy(), min_new_tokens=n)
    wav = Path(spec["wav"].format(side="kztts"))

    def run_once() -> dict:
        t = time.perf_counter()
        result = tts.synthesize(spec["text"], voice, language=spec.get("language"), greedy=True, settings=settings,
                                max_frames=n)  # the bench's count, not the text's runaway cap
        write_wav(wav, result.samples, result.sample_rate)
        return {"s": time.perf_counter() - t, "frames": int(result.frames)}

    graphs = tts.plan.graphs(("talker_decode", "code_predictor", "decoder"))
    return serve_runs(run_once, {"graphs": graphs})


if __name__ == "__main__":
    sys.exit(main())
