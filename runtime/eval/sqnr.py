"""Quantization sensitivity per layer, on the CPU: what ``kztts calibrate`` records beside the fp16 magnitudes.

While the calibration prompts speak through the fp32 layer graphs (``kztts.eval.calibrate``), a sample of each
layer and head graph's calls is kept (the feeds with the fp32 outputs, at most ``--sqnr-feeds`` per graph). Then,
one graph at a time: the graph with its MatMuls' inputs as extra outputs (``kztts.bundle.onnx_wire.with_outputs``)
re-runs the kept calls for those inputs' valid rows (a prefill chunk's padded rows are left out; ``cp_frame``'s
are kept while it runs, every call), and for every quantized HTP precision of ``kztts.bundle.graphs`` (w8a16,
w4a16: 8- and 4-bit weights):

- each MatMul's output with its weight quantized as the exporter writes it (``kztts.htp.weights``) against its
  fp32 output, on the same inputs (numpy);
- the graph's output (a layer's ``hidden_out``, the head's ``logits``) with all its MatMul weights quantized
  (the graph re-run with those weights as session initializers) against the fp32 one, on the kept feeds.

Activations stay fp32 here: this isolates the weights' loss, layer by layer (each layer gets the fp32 stream's
input); the 16-bit activations and the layers' compounding are what ``kztts validate`` measures. The
SQNR of a set of rows is the mean over rows of 10 log10(|y|^2 / |y_q - y|^2) (``row_sqnr_db``): every
position counts alike, so a row holding a massive activation (Qwen's first position) does not hide the others.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kztts.bundle import graphs as G
from kztts.bundle.onnx_wire import read_graph, tensor_arrays, with_outputs
from kztts.bundle.segments import segment_graph_name
from kztts.core.progress import bar
from kztts.htp.weights import SQNR_CAP_DB, fake_quantize, matmul_keys

log = logging.getLogger(__name__)

DEFAULT_FEEDS = 16  # graph calls kept per graph for the output SQNR
DEFAULT_ROWS = 1024  # MatMul input rows kept per graph for the MatMul SQNR
_EXTERNAL_FOLDER = "session.model_external_initializers_file_folder_path"


def row_sqnr_db(reference: np.ndarray, test: np.ndarray) -> np.ndarray:
    """Per row (last axis = features): 10 log10(|ref|^2 / |test - ref|^2), capped at +-``SQNR_CAP_DB``."""
    ref = np.asarray(reference, np.float64).reshape(-1, np.shape(reference)[-1])
    err = np.asarray(test, np.float64).reshape(ref.shape) - ref
    s, n = (ref ** 2).sum(axis=1), (err ** 2).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        db = 10.0 * np.log10(s / n)
    db = np.where(n == 0, SQNR_CAP_DB, db)
    return np.clip(np.nan_to_num(db, nan=-SQNR_CAP_DB, posinf=SQNR_CAP_DB, neginf=-SQNR_CAP_DB),
                   -SQNR_CAP_DB, SQNR_CAP_DB)


class _Thinned:
    """At most ``cap`` items, spread over everything offered: every item while there is room, then every
    second one kept and every second new one taken, and so on (deterministic, no copy of the rest)."""

    def __init__(self, cap: int):
        self.cap, self.items, self.stride, self.seen = max(1, cap), [], 1, 0

    def offer(self, item) -> None:
        if self.seen % self.stride == 0:
            self.items.append(item)
            if len(self.items) > self.cap:
                self.items = self.items[::2]
                self.stride *= 2
        self.seen += 1


@dataclass
class GraphCapture:
    """One layer (or head) graph: what was kept of its calls, then its SQNRs."""

    name: str
    path: Path
    output: str | None  # the graph output compared ("hidden_out", "logits"); None: MatMuls only (cp_frame)
    keys: dict[str, str]  # MatMul node -> key
    inputs: dict[str, str]  # MatMul node -> its input tensor
    feeds: _Thinned
    rows: dict[str, _Thinned]  # input tensor -> kept row blocks
    pending: tuple | None = None  # (feed, outputs) of the call whose valid rows are not known yet
    sqnr: dict[str, float] = field(default_factory=dict)  # precision -> graph output SQNR (dB)
    matmul_sqnr: dict[str, dict[str, float]] = field(default_factory=dict)  # precision -> key -> dB


class CaptureSession:
    """Stands in for a graph's CPU session while the prompts speak: hands the caller the outputs it asked for and
    keeps the call for ``finish_call``. With ``augmented`` (a copy of the graph with its MatMul inputs as extra
    outputs: ``cp_frame``, whose calls are kept whole) it runs that copy instead; without (the layer graphs), it
    runs the session itself, and the MatMul inputs are recomputed from the kept calls in ``measure``, one graph at
    a time: a second session per layer graph would hold every layer's weights twice (24 GB for a 1.5B)."""

    def __init__(self, session, capture: GraphCapture, sess_options=None, augmented: bytes | None = None,
                 every_row: bool = False):
        import onnxruntime as ort

        self.session, self.capture, self.every_row = session, capture, every_row
        self._names = [o.name for o in session.get_outputs()]
        self._extra = sorted(set(capture.inputs.values())) if augmented is not None else []
        self._run = session if augmented is None else \
            ort.InferenceSession(augmented, sess_options, providers=["CPUExecutionProvider"])

    def run(self, output_names, feed, *args, **kwargs):
        out = self._run.run(self._names + self._extra, feed)
        main = dict(zip(self._names, out[:len(self._names)]))
        self.capture.pending = (feed, main, dict(zip(self._extra, out[len(self._names):])))
        if self.every_row:  # no padded rows (cp_frame): kept at once
            finish_call(self.capture, None)
        return [main[n] for n in (output_names or self._names)]

    def __getattr__(self, name):
        return getattr(self.session, name)


def _options(path: Path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry(_EXTERNAL_FOLDER, str(path.parent))
    return so


def _capture(name: str, path: Path, output: str | None, first_layer: int, max_feeds: int,
             max_rows: int) -> GraphCapture:
    g = read_graph(path)
    keys = matmul_keys(g.nodes, {t.name for t in g.tensors}, first_layer)
    inputs = {n.name: n.inputs[0] for n in g.nodes if n.name in keys}
    return GraphCapture(name, path, output, keys, inputs, _Thinned(max_feeds),
                        {x: _Thinned(max_rows) for x in set(inputs.values())})


def capture_session(session, bundle, name: str, max_rows: int = DEFAULT_ROWS) -> tuple[CaptureSession, GraphCapture]:
    """A :class:`CaptureSession` over graph ``name``'s CPU ``session`` keeping only its MatMul inputs, every row
    (``cp_frame``: its SQNR is per MatMul; its outputs are sampled codes)."""
    path = Path(bundle.path) / bundle.manifest.graphs[name].file
    cap = _capture(name, path, None, 0, 1, max_rows)
    return CaptureSession(session, cap, _options(path), with_outputs(path, sorted(set(cap.inputs.values()))),
                          every_row=True), cap


def capture_sessions(talker, bundle, max_feeds: int = DEFAULT_FEEDS, max_rows: int = DEFAULT_ROWS) \
        -> dict[tuple[str, object], GraphCapture]:
    """Put a :class:`CaptureSession` in place of every layer and head graph's session of ``talker`` (an all-CPU
    ``SegmentedTalker``); returns {(phase, unit): capture}. Call :func:`finish_call` from the talker's
    ``on_unit`` hook with each call's valid rows."""
    out = {}
    for ph in ("prefill", "decode"):
        for unit in [*range(talker.num_layers), "head"]:
            name = segment_graph_name(ph, unit)
            path = Path(bundle.path) / bundle.manifest.graphs[name].file
            cap = _capture(name, path, "logits" if unit == "head" else "hidden_out",
                           0 if unit == "head" else int(unit), max_feeds, max_rows)
            talker.sessions[name] = CaptureSession(talker.sessions[name], cap)
            out[(ph, unit)] = cap
    return out


def finish_call(capture: GraphCapture, valid: int | None) -> None:
    """Keep the pending call of ``capture`` (its first ``valid`` rows are real positions; None: all)."""
    if capture.pending is None:
        return
    feed, outputs, extra = capture.pending
    capture.pending = None
    if capture.output is not None:
        capture.feeds.offer(({k: np.array(v) for k, v in feed.items()}, np.array(outputs[capture.output]), valid))
    for x, thinned in capture.rows.items():
        if x in extra:
            a = np.asarray(extra[x], np.float32)
            thinned.offer(a.reshape(-1, a.shape[-1])[:valid].copy())


def _rows_from_feeds(capture: GraphCapture) -> None:
    """The MatMul input rows of ``capture``'s kept calls (their valid rows), from its graph with those inputs as
    extra outputs: one such session at a time, freed on return."""
    import onnxruntime as ort

    names = sorted(capture.rows)
    sess = ort.InferenceSession(with_outputs(capture.path, names), _options(capture.path),
                                providers=["CPUExecutionProvider"])
    for feed, _, valid in capture.feeds.items:
        for x, a in zip(names, sess.run(names, feed)):
            a = np.asarray(a, np.float32)
            capture.rows[x].offer(a.reshape(-1, a.shape[-1])[:valid].copy())


def _weights(capture: GraphCapture) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """({MatMul node: its weight [K, N]}, {MatMul node: the weight's name}) (through Identity aliases)."""
    g = read_graph(capture.path)
    alias = {n.outputs[0]: n.inputs[0] for n in g.nodes if n.op == "Identity" and n.inputs and n.outputs}
    names = {}
    for n in g.nodes:
        if n.name in capture.keys:
            w = n.inputs[1]
            while w in alias:
                w = alias[w]
            names[n.name] = w
    arrays = tensor_arrays(capture.path, set(names.values()))
    return {node: arrays[w] for node, w in names.items()}, names


def measure(capture: GraphCapture, precisions=None, chunk: int = 64) -> None:
    """Fill ``capture.matmul_sqnr`` and ``capture.sqnr`` at each quantized precision (module docstring)."""
    import onnxruntime as ort

    precisions = precisions or G.QUANTIZED_PRECISIONS
    if capture.output is not None and capture.feeds.items and not any(t.items for t in capture.rows.values()):
        _rows_from_feeds(capture)
    weights, wnames = _weights(capture)
    for p in precisions:
        entry = G.htp_precision(p)
        quantized = {node: fake_quantize(w, entry) for node, w in weights.items()}
        per_key: dict[str, list[np.ndarray]] = {}
        for node, w in weights.items():
            rows = capture.rows[capture.inputs[node]].items
            if not rows:
                continue
            x = np.concatenate(rows)
            dbs = [row_sqnr_db(x[i:i + chunk] @ w, x[i:i + chunk] @ quantized[node]) for i in range(0, len(x), chunk)]
            per_key.setdefault(capture.keys[node], []).append(np.concatenate(dbs))
        capture.matmul_sqnr[p] = {k: float(np.mean(np.concatenate(v))) for k, v in per_key.items()}
        if capture.output is None:
            continue
        so = _options(capture.path)
        held = {}
        for node, w in wnames.items():
            if w not in held:
                held[w] = ort.OrtValue.ortvalue_from_numpy(quantized[node])
                so.add_initializer(w, held[w])
        sess = ort.InferenceSession(str(capture.path), so, providers=["CPUExecutionProvider"])
        dbs = []
        for feed, ref, valid in capture.feeds.items:
            got = sess.run([capture.output], feed)[0]
            r, g = ref.reshape(-1, ref.shape[-1])[:valid], got.reshape(-1, got.shape[-1])[:valid]
            dbs.append(row_sqnr_db(r, g))
        capture.sqnr[p] = float(np.mean(np.concatenate(dbs))) if dbs else float("nan")
        del sess, held, quantized


def measure_all(captures: dict, progress: bool = False) -> None:
    """:func:`measure` every capture, one graph at a time (its weights and sessions freed before the next)."""
    items = list(captures.values())
    for cap in (bar(items, desc="sqnr", unit="graph") if progress else items):
        measure(cap)
        cap.feeds, cap.rows = _Thinned(1), {}  # the kept calls are no longer needed
