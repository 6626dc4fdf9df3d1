"""A w8a16 LM bundle's prefill graph on the CPU EP, whole or with chosen activation QDQ pairs bypassed (the
tensor left in float): where does w8a16 lose? One chunk of a text of kztts.lm_accuracy.SAMPLES (its first
prefill-chunk tokens, no chat template), against the fp32 layer graphs of an fp16 bundle of the same checkpoint
(exported with --segments for a target of the same shapes, context 512 and chunk 64 here).

Usage: python qdq_bypass.py FP16_BUNDLE W8A16_BUNDLE TEXT VARIANT...   (VARIANT: a key of SETS)
Memory: the QDQ graph is serialised in memory (< 2 GB), ~5 GB per variant at 1.5B."""
import json, sys, math, gc, time
import numpy as np, onnx, onnxruntime as ort
from tokenizers import Tokenizer
from kztts.talker_static import chunk_inputs
from kztts.rope import rope_tables
from kztts.lm_accuracy import SAMPLES

B, WB = sys.argv[1], sys.argv[2]
W = f"{WB}/" + json.load(open(f"{WB}/kztts.json"))["graphs"]["talker_prefill"]["file"]
cfg = json.load(open(f"{B}/kztts.json"))["config"]["lm"]
g0 = json.load(open(f"{B}/kztts.json"))["graphs"]["talker_prefill_layer_0"]
C, S, H, hd, L, kv = g0["context"], g0["seq"], cfg["hidden"], cfg["head_dim"], cfg["num_layers"], cfg["num_kv_heads"]
tok = Tokenizer.from_file(f"{B}/tokenizer.json")
emb = np.load(f"{B}/embeddings/token_embedding.npy", mmap_mode="r")
cos_t, sin_t = rope_tables(C + S, hd, float(cfg["rope_theta"]))
text = next(s for s in SAMPLES if s.name == sys.argv[3]).text
ids = tok.encode(text).ids[:S]; n = len(ids)
h, mask = chunk_inputs(np.asarray(emb[ids], np.float32), n, S, 0, C, H, g0["mask_value"])
so = ort.SessionOptions(); so.log_severity_level = 3

def fp32_logits():
    x = h
    for u in range(L):
        s = ort.InferenceSession(f"{B}/graphs/segments/talker_prefill_layer_{u}.onnx", so, providers=["CPUExecutionProvider"])
        x = s.run(None, {"hidden_in": x, "attention_mask": mask, "rope_cos": cos_t[None, :S], "rope_sin": sin_t[None, :S],
                         "past_key_in": np.zeros((kv, 1, hd, C - S), np.float32), "past_value_in": np.zeros((kv, 1, C - S, hd), np.float32)})[0]
    s = ort.InferenceSession(f"{B}/graphs/segments/talker_prefill_head.onnx", so, providers=["CPUExecutionProvider"])
    return s.run(None, {"hidden_in": x})[0][0, :n]

def residual_names():
    return {f"/stack/Add_{k + 5 * u}_output_0" for u in range(L) for k in (3, 4)}

SETS = {
    "w8a16": lambda t: False,
    "w8": lambda t: True,  # every activation in float: the 8-bit weights alone
    "float_residual": lambda t: t in RES,
    "float_norms": lambda t: "layernorm" in t or t.startswith("/stack/norm/"),
    "float_layer0_scores": lambda t: t in {"/stack/Where_output_0", "/stack/Reshape_4_output_0", "/stack/MatMul_output_0",
                                           "/stack/Add_2_output_0", "/stack/Softmax_output_0"},
    "float_attention": lambda t: any(k in t for k in ("MatMul_", "Where", "Softmax", "Reshape", "Transpose", "/stack/MatMul_output_0")) and "proj" not in t,
}
RES = residual_names()

def _norm(*ops):
    return lambda t: ("layernorm" in t or t.startswith("/stack/norm/")) and any(t.endswith(f"/{o}_output_0") for o in ops)

SETS.update(norm_xs=_norm("Div"), norm_sq=_norm("Mul"), norm_var=_norm("ReduceMean", "Add"), norm_rsqrt=_norm("Sqrt", "Div_1"),
            norm_out=_norm("Mul_3", "Mul_4"), norm_eps=_norm("Mul_1", "Reciprocal", "Mul_2"), norm_s=_norm("Abs", "ReduceMax"))

def variant_logits(name):
    m = onnx.load(W)  # with its weights (1.5 GB: serialisable in memory)
    bypass = SETS[name]
    prod = {o: nd for nd in m.graph.node for o in nd.output}
    rename, drop = {}, set()
    outs = {o.name for o in m.graph.output}
    for nd in m.graph.node:
        if nd.output[0] in outs:
            continue
        if nd.op_type == "DequantizeLinear":
            q = prod.get(nd.input[0])
            if q is not None and q.op_type == "QuantizeLinear" and bypass(q.input[0]):
                rename[nd.output[0]] = q.input[0]; drop.add(id(nd))
    keep = [nd for nd in m.graph.node if id(nd) not in drop]
    for nd in keep:
        for i, t in enumerate(nd.input):
            if t in rename: nd.input[i] = rename[t]
    del m.graph.node[:]; m.graph.node.extend(keep)
    print(f"{name}: {len(drop)} activation QDQ pairs bypassed", flush=True)
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    del m; gc.collect()
    feed = {"inputs_embeds": h, "attention_mask": mask, "rope_cos": cos_t[None, :S], "rope_sin": sin_t[None, :S]}
    for u in range(L):
        feed[f"past_key_{u}_in"] = np.zeros((kv, 1, hd, C - S), np.float32); feed[f"past_value_{u}_in"] = np.zeros((kv, 1, C - S, hd), np.float32)
    out = sess.run(["logits"], feed)[0][0, :n]
    del sess; gc.collect()
    return out

def lsm(x):
    x = x.astype(np.float64); mx = x.max(-1, keepdims=True); return x - mx - np.log(np.exp(x - mx).sum(-1, keepdims=True))
t = np.asarray(ids[1:])
ppl = lambda lg: math.exp(-lsm(lg[:-1])[np.arange(len(t)), t].mean())
ref = fp32_logits()
print(f"{sys.argv[3]}: {n} tokens in one prefill chunk; fp32 (B's layer graphs) ppl {ppl(ref):.3f}", flush=True)
for v in sys.argv[4:]:
    t0 = time.time(); lg = variant_logits(v)
    cos = [float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in zip(ref, lg)]
    print(f"  {v}: ppl {ppl(lg):.3f}; logits cos mean {np.mean(cos):.6f} min {min(cos):.6f} (position {int(np.argmin(cos))}); "
          f"top-1 {np.mean(ref.argmax(-1) == lg.argmax(-1)):.3f}  [{time.time() - t0:.0f} s]", flush=True)
