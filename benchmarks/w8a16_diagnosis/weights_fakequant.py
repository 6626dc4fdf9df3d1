"""8-bit weights alone, per tensor (as the w8a16 graphs: asymmetric uint8, one scale per matrix) or per
output channel (symmetric int8), fake-quantized into an fp16 bundle's fp32 prefill layer graphs (activations
float), one chunk of a text of kztts.lm_accuracy.SAMPLES, against the unquantized chain.

Usage: python weights_fakequant.py FP16_BUNDLE TEXT MODE...   (MODE: per_tensor, per_channel)"""
import json, sys, math
import numpy as np, onnx, onnxruntime as ort
from onnx import numpy_helper
from tokenizers import Tokenizer
from kztts.talker_static import chunk_inputs
from kztts.rope import rope_tables
from kztts.lm_accuracy import SAMPLES

B = sys.argv[1]
cfg = json.load(open(f"{B}/kztts.json"))["config"]["lm"]
g0 = json.load(open(f"{B}/kztts.json"))["graphs"]["talker_prefill_layer_0"]
C, S, H, hd, L, kv = g0["context"], g0["seq"], cfg["hidden"], cfg["head_dim"], cfg["num_layers"], cfg["num_kv_heads"]
tok = Tokenizer.from_file(f"{B}/tokenizer.json")
emb = np.load(f"{B}/embeddings/token_embedding.npy", mmap_mode="r")
cos_t, sin_t = rope_tables(C + S, hd, float(cfg["rope_theta"]))
ids = tok.encode(next(s for s in SAMPLES if s.name == sys.argv[2]).text).ids[:S]; n = len(ids)
h0, mask = chunk_inputs(np.asarray(emb[ids], np.float32), n, S, 0, C, H, g0["mask_value"])
so = ort.SessionOptions(); so.log_severity_level = 3

def fq(w, mode):
    if mode == "per_tensor":  # uint8 asymmetric over [min(w, 0), max(w, 0)], as ORT's QDQ weights
        lo, hi = min(float(w.min()), 0.0), max(float(w.max()), 0.0); s = (hi - lo) / 255; z = np.round(-lo / s)
        return ((np.clip(np.round(w / s) + z, 0, 255) - z) * s).astype(np.float32)
    if mode == "per_channel":  # int8 symmetric per output column of x @ W
        s = np.abs(w).max(axis=0, keepdims=True) / 127; s[s == 0] = 1
        return (np.clip(np.round(w / s), -127, 127) * s).astype(np.float32)
    return w

def session(path, mode):
    m = onnx.load(path)
    if mode != "fp32":
        matw = {nd.input[1] for nd in m.graph.node if nd.op_type == "MatMul"}
        for init in m.graph.initializer:
            if init.name in matw and len(init.dims) == 2 and min(init.dims) > 1:
                init.CopyFrom(numpy_helper.from_array(fq(numpy_helper.to_array(init), mode), init.name))
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])

def logits(mode):
    x = h0
    for u in range(L):
        x = session(f"{B}/graphs/segments/talker_prefill_layer_{u}.onnx", mode).run(None, {
            "hidden_in": x, "attention_mask": mask, "rope_cos": cos_t[None, :S], "rope_sin": sin_t[None, :S],
            "past_key_in": np.zeros((kv, 1, hd, C - S), np.float32), "past_value_in": np.zeros((kv, 1, C - S, hd), np.float32)})[0]
    return session(f"{B}/graphs/segments/talker_prefill_head.onnx", mode).run(None, {"hidden_in": x})[0][0, :n]

def lsm(x):
    x = x.astype(np.float64); mx = x.max(-1, keepdims=True); return x - mx - np.log(np.exp(x - mx).sum(-1, keepdims=True))
t = np.asarray(ids[1:]); ppl = lambda lg: math.exp(-lsm(lg[:-1])[np.arange(len(t)), t].mean())
ref = logits("fp32"); print(f"{sys.argv[2]}: {n} tokens, one chunk; fp32 ppl {ppl(ref):.3f}", flush=True)
for mode in sys.argv[3:]:
    lg = logits(mode)
    cos = [float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in zip(ref, lg)]
    print(f"  weights 8-bit {mode} (head included): ppl {ppl(lg):.3f}; logits cos mean {np.mean(cos):.6f} min {min(cos):.6f}; "
          f"top-1 {np.mean(ref.argmax(-1) == lg.argmax(-1)):.3f}", flush=True)
