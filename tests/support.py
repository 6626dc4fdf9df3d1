"""Helpers the test folders share (importable as ``support``: setup.cfg puts tests/ on the path).

Fixtures live in conftest.py files (the root one for what several folders use); plain functions that
several test files call live here, once."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]  # the repository: README.md, runtime/, export/, benchmarks/
MASSIVE_LAYER = 1  # the Talker layer of the massive-activation test model (tests/htp/conftest.py)


def run_kztts(*args, **kw) -> subprocess.CompletedProcess:
    """``kztts ARGS`` in a child process (``python -m kztts.cli.main``), its output captured as text."""
    return subprocess.run([sys.executable, "-m", "kztts.cli.main", *map(str, args)], capture_output=True, text=True,
                          **kw)


def kztts_main(capsys, *args) -> tuple[int, str, str]:
    """``kztts ARGS`` in this process (``kztts.cli.main.main``): (exit code, stdout, stderr) of this call alone."""
    from kztts.cli.main import main

    capsys.readouterr()
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def cpu_session(path):
    """An ONNX Runtime session of the graph file ``path`` on the CPU EP, one thread, warnings off."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def cosine(a, b) -> float:
    """The cosine of two arrays taken whole (flattened), as ``kztts.core.metrics.cosine_rows`` computes it for
    one row; per-row cosines are ``cosine_rows`` itself."""
    from kztts.core.metrics import cosine_rows

    return float(cosine_rows(np.ravel(a)[None], np.ravel(b)[None])[0])


# ---------------------------------------------------------------- causal LMs (tests/lm, tests/export/lm)
def plain_greedy_lm(model_dir):
    """transformers' causal LM of ``model_dir`` in eval mode with a plain greedy generation config (no EOS, no
    repetition penalty): the reference the LM tests compare a bundle with."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    model.generation_config = GenerationConfig()
    return model


def empty_gguf(path: Path, architecture: str) -> Path:
    """A GGUF file of ``architecture`` with one block and no tensors: what the checkpoint checks read first."""
    import gguf

    w = gguf.GGUFWriter(str(path), architecture)
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def assert_equals_reprefill(lm, turns: list[list[int]], replies, atol: float) -> None:
    """Each turn of a chat session again from an empty cache, the whole conversation before its reply in one
    prefill: the same logits at every reply position (cosine >= 0.99999, max |diff| < ``atol``) and the same
    greedy tokens."""
    prefix: list[int] = []
    for turn, reply in zip(turns, replies):
        prefix = prefix + turn
        lm._claim(object())
        logits = lm.feed(prefix)
        for i, want in enumerate(reply.logits):
            assert cosine(logits, want) >= 0.99999 and np.abs(logits - want).max() < atol
            token = int(np.argmax(logits))
            if i < len(reply.ids):
                assert token == reply.ids[i]
            else:
                assert token in lm.stop_ids
            if i + 1 < len(reply.logits):
                logits = lm.feed([token])
        prefix = prefix + reply.ids


# ---------------------------------------------------------------- QDQ graphs (tests/htp, tests/lm)
def matmul_weight_kinds(path) -> set[str]:
    """How the constant weights of a QDQ graph's MatMuls are quantized: {"int8 per-channel axis 1"},
    {"int4 per-channel axis 1", "int4 LPBQ block 64"}, ... ("per-tensor": one scale, or a zero point)."""
    import onnx
    from onnx import numpy_helper

    g = onnx.load(str(path)).graph
    inits = {t.name: t for t in g.initializer}
    dq = {n.output[0]: n for n in g.node if n.op_type == "DequantizeLinear" and n.input[0] in inits}
    kinds = set()
    for n in g.node:
        d = dq.get(n.input[1]) if n.op_type == "MatMul" and len(n.input) > 1 else None
        if d is None:
            continue
        w = inits[d.input[0]]
        kind = onnx.helper.tensor_dtype_to_np_dtype(w.data_type).name
        if d.input[1] not in inits:  # LPBQ: the scales are a DequantizeLinear of per-block integer scales
            block = next((a.i for a in d.attribute if a.name == "block_size"), 0)
            kinds.add(f"{kind} LPBQ block {block}")
            continue
        scale = numpy_helper.to_array(inits[d.input[1]])
        zero = numpy_helper.to_array(inits[d.input[2]]) if len(d.input) > 2 and d.input[2] else np.zeros(1)
        axis = next((a.i for a in d.attribute if a.name == "axis"), 1)
        kinds.add(f"{kind} per-channel axis {axis}" if scale.size == w.dims[axis] > 1 and not zero.any()
                  else f"{kind} per-tensor")
    return kinds
