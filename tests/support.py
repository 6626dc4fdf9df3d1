"""Helpers the test folders share (importable as ``support``: setup.cfg puts tests/ on the path).

Fixtures live in conftest.py files (the root one for what several folders use); plain functions that
several test files call live here, once."""
from __future__ import annotations

import http.client
import io
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
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


# ---------------------------------------------------------------- kztts serve in a child process (tests/server)
KEY = "test-key-0123"  # the API key the test servers are started with
START_TIMEOUT = 180  # seconds for a server to open its graphs (a loaded 2-core machine)
API_KEY_VARIABLE = "KZTTS_API_KEY"


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    log: Path

    @property
    def host_port(self) -> tuple[str, int]:
        host, port = self.url.removeprefix("http://").split(":")
        return host, int(port)

    def tail(self) -> str:
        return self.log.read_text()[-3000:]


def start_server(folder: Path, log: Path, *args: str, env: dict | None = None) -> Server:
    """``kztts serve BUNDLE --port 0 ARGS`` as a process; its URL from the line it prints when listening."""
    env = {**os.environ, "KZTTS_THREADS": "1", **(env or {})}
    env.pop(API_KEY_VARIABLE, None)
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "kztts.cli.main", "serve", str(folder), "--port", "0", *args],
                                stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    deadline = time.monotonic() + START_TIMEOUT
    line = ""
    while time.monotonic() < deadline and proc.poll() is None:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            break
    match = re.search(r"http://[0-9.]+:\d+", line)
    if not match:
        proc.kill()
        raise AssertionError(f"the server did not start: {line!r}\n{log.read_text()[-3000:]}")
    return Server(proc, match.group(0), log)


def stop(server: Server) -> int:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
    try:
        return server.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        raise



def raw(server: Server, method: str, path: str, body: bytes | dict | None = None, key: str | None = KEY,
        headers: dict | None = None) -> tuple[int, dict, bytes]:
    """(status, headers, body) of one plain HTTP request."""
    conn = http.client.HTTPConnection(*server.host_port, timeout=60)
    h = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    conn.request(method, path, body=data, headers=h)
    r = conn.getresponse()
    out = (r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    conn.close()
    return out


def int16_of_wav(data: bytes) -> np.ndarray:
    """The 16-bit samples of a 24 kHz WAV file's bytes."""
    import soundfile as sf

    x, sr = sf.read(io.BytesIO(data), dtype="int16")
    assert sr == 24000
    return x


def need_disk(folder: Path, need: int, what: str) -> None:
    """Skip the test, saying why, when ``folder``'s disk has less than ``need`` bytes free for ``what``
    (CI hosts differ in free space: a host short of it lacks a capability, the test is not failed)."""
    import pytest

    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < need:
        pytest.skip(f"{what} needs {need / 2**30:.1f} GiB free at {folder}; this host has {free / 2**30:.1f} GiB")


def real_gguf() -> Path:
    """The real Qwen2.5-Coder-1.5B GGUF from the cache, fetched if missing (skipped on a host without the disk)."""
    from kztts.lm.fetch import QWEN25_CODER_1_5B_Q4KM, checkpoint_path, fetch_checkpoint, space_needed

    path = checkpoint_path()
    if not path.is_file():
        need_disk(path.parent, space_needed(QWEN25_CODER_1_5B_Q4KM), "fetching the real 1.5B")
    return fetch_checkpoint()


class AtOnce:
    """The handler's event loop, stood in for: a job's event goes into its queue at once, from any thread."""

    @staticmethod
    def call_soon_threadsafe(put, *args):
        put(*args)


def save_bundle_graph(model, bundle: Path, rel: str) -> None:
    """Save an edited graph of ``bundle`` (loaded with its data) whole, its weights inline (it may have read them from
    the bundle's shared weights file), never through a hard link, and set its size in the manifest entries that
    name the file."""
    import onnx

    path = Path(bundle) / rel
    path.unlink()
    onnx.save_model(model, str(path))
    manifest = json.loads((Path(bundle) / "kztts.json").read_text())
    for spec in manifest["graphs"].values():
        if spec["file"] == rel:
            spec["bytes"] = path.stat().st_size
    (Path(bundle) / "kztts.json").write_text(json.dumps(manifest, indent=1))


def scaled_weight(good: Path, out: Path, graph: str, node: str, factor: float) -> Path:
    """A copy of bundle ``good`` whose ``graph`` (its HTP file) has the first MatMul/Gemm/Conv whose name holds
    ``node`` computing with its weight scaled by ``factor``: its DequantizeLinear's scale times ``factor`` (a
    quantization scale written wrong), or, in a float graph, the weight itself (the same arithmetic)."""
    import onnx
    from onnx import numpy_helper

    from kztts.bundle.manifest import read_manifest

    shutil.copytree(good, out)
    spec = read_manifest(out).graphs[graph]
    rel = spec.extra.get("htp_file", spec.file)
    model = onnx.load(str(out / rel))
    inits = {t.name: t for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    for n in model.graph.node:
        if n.op_type in ("MatMul", "Gemm", "Conv", "ConvTranspose") and node in n.name:
            w = n.input[1]
            dq = producer.get(w)
            t = inits[dq.input[1]] if dq is not None and dq.op_type == "DequantizeLinear" else inits[w]
            a = numpy_helper.to_array(t)
            t.CopyFrom(numpy_helper.from_array((a * factor).astype(a.dtype), t.name))
            save_bundle_graph(model, out, rel)
            return out
    raise AssertionError(f"{rel}: no MatMul/Gemm/Conv named like {node!r}")


def scaled_nbits(good: Path, out: Path, graph: str, node: str, factor: float) -> Path:
    """A copy of bundle ``good`` whose CPU ``graph`` has the first MatMulNBits whose name holds ``node`` computing
    with its weight scales times ``factor`` (a quantized weight written with the wrong scale); the graph is saved
    whole (its weights inline) and its manifest entry's size follows."""
    import onnx
    from onnx import numpy_helper

    shutil.copytree(good, out)
    rel = json.loads((out / "kztts.json").read_text())["graphs"][graph]["file"]
    model = onnx.load(str(out / rel))
    inits = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "MatMulNBits" and node in n.name:
            t = inits[n.input[2]]
            a = numpy_helper.to_array(t)
            t.CopyFrom(numpy_helper.from_array((a * factor).astype(a.dtype), t.name))
            save_bundle_graph(model, out, rel)
            return out
    raise AssertionError(f"{rel}: no MatMulNBits named like {node!r}")
