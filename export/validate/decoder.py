"""The speech decoder of an HTP target against the fp32 CPU decoder: the SNR of its audio
(``kztts validate --target``, ``tests/export/validate/test_decoder.py``).

The HTP side runs in a child process (docs/QNN_EP.md: fp16 mode leaks across the sessions of one
process): the execution plan's decoder, i.e. the static ``decoder_chunk`` when the target puts
the decoder on the HTP (the last partial chunk padded). The CPU side is the bundle's fp32
``decoder_stream`` with the same segmentation. Codes are seeded random codes: the check is of
the arithmetic, which random codes exercise over the whole codebooks.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from kztts.bundle.bundle import Bundle
from kztts.core.metrics import snr_db
from kztts.core.worker_process import run_worker, worker_main
from kztts.plan.resolve import resolve_plan
from kztts.runners.codec import Decoder, decoder_codes, decoder_kwargs

def _decode_worker(spec: dict) -> dict:
    bundle = Bundle.open(spec["bundle"], load_graphs=False)
    plan = resolve_plan(bundle, target=spec["target"], strict=spec["strict"])
    step = plan.steps["decoder"]
    wav = plan.open_decoder().decode(spec["codes"])
    graph = step.graphs[0]
    return {"wav": wav.astype(np.float32), "device": step.device, "graph": graph,
            "precision": bundle.manifest.graphs[graph].precision}


def htp_decoder_snr(bundle_dir: str | Path, target: str | Path, frames: int = 10, *, strict: bool = True,
                    timeout: float = 1800) -> dict:
    """``decoder_device``, ``decoder_graph`` and ``decoder_precision`` (the plan's, for ``target``; an HTP graph's
    is fp16 or w8a16: ``kztts.bundle.graphs.HTP_DECODER_PRECISIONS``), ``decoder_frames``, and ``decoder_snr_db``:
    its audio against the fp32 CPU decoder (None when the target decodes on the CPU: that is the fp32 decoder
    itself)."""
    bundle = Bundle.open(bundle_dir, load_graphs=False)
    cpu_graph = "decoder_stream" if "decoder_stream" in bundle.manifest.graphs else "decoder"
    kwargs = decoder_kwargs(bundle, cpu_graph, {})
    codes = decoder_codes(frames, kwargs["codebook_size"])
    spec = {"bundle": str(bundle_dir), "target": str(target), "strict": strict, "codes": codes}
    res = run_worker("kztts.export.validate.decoder", spec, None, "htp-decoder", timeout=timeout)
    out = {"decoder_device": res["device"], "decoder_graph": res["graph"], "decoder_precision": res["precision"],
           "decoder_frames": int(frames), "decoder_snr_db": None}
    if res["device"] == "htp":
        ref = Decoder(bundle.session(cpu_graph), **kwargs).decode(codes)
        out["decoder_snr_db"] = float(snr_db(np.asarray(res["wav"]), ref))
    return out


def main(argv: list[str] | None = None) -> int:
    """The HTP side's child process (``kztts.core.worker_process``)."""
    return worker_main(_decode_worker, argv)


if __name__ == "__main__":
    sys.exit(main())
