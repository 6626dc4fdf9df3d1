"""A w8a16 LM bundle's prefill graph on the CPU EP, whole or with chosen activation QDQ pairs bypassed (the
tensor left in float): where does w8a16 lose? One chunk of a text of kztts.eval.lm_accuracy.SAMPLES (its first
prefill-chunk tokens, no chat template), against the fp32 layer graphs of an fp16 bundle of the same checkpoint
(exported with --segments for a target of the same shapes).

Usage: python qdq_bypass.py FP16_BUNDLE W8A16_BUNDLE TEXT VARIANT...   (VARIANT: a key of VARIANTS)
Memory: the QDQ graph is serialised in memory (< 2 GB), ~5 GB per variant at 1.5B. The tensor names are
those of the Qwen2 stack's export (Qwen2.5-Coder-1.5B: five Adds per layer, the residual ones 3rd and 4th)."""
import gc
import json
import sys
import time
from pathlib import Path

import onnx
import onnxruntime as ort
from diag_chunk import Chunk, session_options


def _norm(*ops):
    """Outputs of the given ops inside the RMSNorms (all of them when none is given)."""
    return lambda t: ("layernorm" in t or t.startswith("/stack/norm/")) and (
        not ops or any(t.endswith(f"/{o}_output_0") for o in ops))


def variants(layers: int) -> dict:
    residual = {f"/stack/Add_{k + 5 * u}_output_0" for u in range(layers) for k in (3, 4)}
    layer0_scores = {"/stack/Where_output_0", "/stack/Reshape_4_output_0", "/stack/MatMul_output_0",
                     "/stack/Add_2_output_0", "/stack/Softmax_output_0"}
    return {
        "w8a16": lambda t: False,
        "w8": lambda t: True,  # every activation in float: the 8-bit weights alone
        "float_residual": lambda t: t in residual,
        "float_norms": _norm(),
        # everything inside the norms but their outputs (the MatMuls' inputs, quantized in any w8a16 graph)
        "float_norms_inside": lambda t: _norm()(t) and not t.endswith("/Mul_4_output_0"),
        "float_layer0_scores": lambda t: t in layer0_scores,
        "float_attention": lambda t: any(k in t for k in ("MatMul_", "Where", "Softmax", "Reshape", "Transpose",
                                                          "/stack/MatMul_output_0")) and "proj" not in t,
        "norm_xs": _norm("Div"), "norm_sq": _norm("Mul"), "norm_var": _norm("ReduceMean", "Add"),
        "norm_rsqrt": _norm("Sqrt", "Div_1"), "norm_out": _norm("Mul_3", "Mul_4"),
        "norm_eps": _norm("Mul_1", "Reciprocal", "Mul_2"), "norm_s": _norm("Abs", "ReduceMax"),
    }


def bypassed(path: Path, bypass) -> tuple[onnx.ModelProto, int]:
    """The QDQ graph with each activation Q -> DQ pair whose tensor ``bypass`` names removed (graph
    outputs keep theirs)."""
    m = onnx.load(path)  # with its weights (1.5 GB at 1.5B: serialisable in memory)
    prod = {o: nd for nd in m.graph.node for o in nd.output}
    outs = {o.name for o in m.graph.output}
    rename = {}
    for nd in m.graph.node:
        if nd.op_type == "DequantizeLinear" and nd.output[0] not in outs:
            q = prod.get(nd.input[0])
            if q is not None and q.op_type == "QuantizeLinear" and bypass(q.input[0]):
                rename[nd.output[0]] = q.input[0]
    keep = [nd for nd in m.graph.node if not (nd.op_type == "DequantizeLinear" and nd.output[0] in rename)]
    for nd in keep:
        for i, t in enumerate(nd.input):
            if t in rename:
                nd.input[i] = rename[t]
    del m.graph.node[:]
    m.graph.node.extend(keep)
    return m, len(rename)


def main() -> None:
    chunk = Chunk.load(sys.argv[1], sys.argv[3])
    w8 = Path(sys.argv[2])
    graph = w8 / json.loads((w8 / "kztts.json").read_text())["graphs"]["talker_prefill"]["file"]
    so = session_options()
    ref = chunk.layer_chain(lambda p: ort.InferenceSession(str(p), so, providers=["CPUExecutionProvider"]))
    print(f"{sys.argv[3]}: {chunk.n} tokens in one prefill chunk; fp32 (the fp16 bundle's layer graphs) ppl "
          f"{chunk.perplexity(ref):.3f}", flush=True)
    table = variants(len(chunk.graphs) - 1)
    feed = {"inputs_embeds": chunk.hidden, "attention_mask": chunk.mask, "rope_cos": chunk.rope_cos,
            "rope_sin": chunk.rope_sin}
    for u in range(len(chunk.graphs) - 1):
        feed[f"past_key_{u}_in"], feed[f"past_value_{u}_in"] = chunk.past_key, chunk.past_value
    for name in sys.argv[4:]:
        started = time.time()
        m, count = bypassed(graph, table[name])
        print(f"{name}: {count} activation QDQ pairs bypassed", flush=True)
        sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        del m
        gc.collect()
        logits = sess.run(["logits"], feed)[0][0, :chunk.n]
        del sess
        print(f"  {name}: {chunk.compare(ref, logits)}  [{time.time() - started:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
