"""8-bit weights alone, per tensor (as the w8a16 graphs: asymmetric uint8, one scale per matrix) or per
output channel (symmetric int8), fake-quantized into an fp16 bundle's fp32 prefill layer graphs (activations
float), one chunk of a text of kztts.eval.lm_accuracy.SAMPLES, against the unquantized chain.

Usage: python weights_fakequant.py FP16_BUNDLE TEXT MODE...   (MODE: per_tensor, per_channel)"""
import sys

import numpy as np
import onnx
import onnxruntime as ort
from diag_chunk import Chunk, session_options
from onnx import numpy_helper


def fake_quantized(w: np.ndarray, mode: str) -> np.ndarray:
    if mode == "per_tensor":  # uint8 asymmetric over [min(w, 0), max(w, 0)], as ORT's QDQ weights
        lo, hi = min(float(w.min()), 0.0), max(float(w.max()), 0.0)
        s = (hi - lo) / 255
        z = np.round(-lo / s)
        return ((np.clip(np.round(w / s) + z, 0, 255) - z) * s).astype(np.float32)
    if mode == "per_channel":  # int8 symmetric per output column of x @ W
        s = np.abs(w).max(axis=0, keepdims=True) / 127
        s[s == 0] = 1
        return (np.clip(np.round(w / s), -127, 127) * s).astype(np.float32)
    raise SystemExit(f"unknown mode {mode!r}: per_tensor or per_channel")


def opener(mode: str | None):
    so = session_options()

    def open_graph(path):
        m = onnx.load(path)
        if mode is not None:
            matw = {nd.input[1] for nd in m.graph.node if nd.op_type == "MatMul"}
            for init in m.graph.initializer:
                if init.name in matw and len(init.dims) == 2 and min(init.dims) > 1:
                    init.CopyFrom(numpy_helper.from_array(fake_quantized(numpy_helper.to_array(init), mode), init.name))
        return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return open_graph


def main() -> None:
    chunk = Chunk.load(sys.argv[1], sys.argv[2])
    ref = chunk.layer_chain(opener(None))
    print(f"{sys.argv[2]}: {chunk.n} tokens, one chunk; fp32 ppl {chunk.perplexity(ref):.3f}", flush=True)
    for mode in sys.argv[3:]:
        print(f"  weights 8-bit {mode} (head included): {chunk.compare(ref, chunk.layer_chain(opener(mode)))}", flush=True)


if __name__ == "__main__":
    main()
