"""Code Predictor graphs (cp_step, cp_frame) and runner against qwen-tts, on both tiny variants.

- greedy codes equal the reference's generate() on >= 40 frames x 15 codebooks, both modes
- teacher-forced step-graph logits: cosine >= 0.99999 against the reference modules
- the in-graph sampler (ONNX) picks the host sampler's token on >= 10,000 draws
- invalid sampling parameters fail before any graph runs
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from kztts.bundle.embeddings import EmbeddingTables
from kztts.core.errors import KzttsError
from kztts.core.metrics import cosine_rows
from kztts.generation.sampling import SamplingParams, XorShift32, repetition_penalty, sample_token
from kztts.runners.code_predictor import CodePredictor

FRAMES = 41
GREEDY = SamplingParams.greedy_params()


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def exported(reference, variant, tmp_path_factory):
    """cp_step / cp_frame graphs and the embedding tables of one tiny variant, in a module tmp dir."""
    from kztts.export.common.embeddings import export_embeddings
    from kztts.export.graphs.code_predictor_graph import export_code_predictor
    from kztts.export.graphs.gqa_graphs import export_cp_frame_gqa
    from kztts.export.tts.tts_parts import model_config, special_ids

    model = reference.model
    out = tmp_path_factory.mktemp(f"cp_{variant}")
    specs = export_code_predictor(model, out)
    specs["cp_frame_gqa"] = export_cp_frame_gqa(model, out, "unbundled")  # the CPU frame graph: top-k selection
    tables = EmbeddingTables(out, export_embeddings(model, out), special_ids(model))
    sessions = {name: ort.InferenceSession(str(out / spec.file), providers=["CPUExecutionProvider"])
                for name, spec in specs.items()}
    cfg = model_config(model)
    return dict(dir=out, specs=specs, tables=tables, sessions=sessions, config=cfg)


def make_cp(exported, mode, frame_graph="cp_frame"):
    cfg = exported["config"]
    return CodePredictor(exported["sessions"], cfg["code_predictor"], cfg["talker"], exported["tables"], mode=mode,
                         frame_graph=frame_graph)


@pytest.fixture(scope="module")
def frames(reference):
    """Greedy reference codes [F, 16] and the talker hidden that fed each frame's code predictor."""
    from kztts.export.common.reference import reference_run, teacher_forced_talker

    run = reference_run(reference, "xvec_nonstream", frames=FRAMES)
    _, hidden = teacher_forced_talker(reference.model, run.prefill, run.trailing, run.tts_pad, run.codes)
    assert len(run.codes) >= 40
    return run.codes, hidden[:len(run.codes)]


@torch.no_grad()
def reference_cp_logits(model, hidden: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Teacher-forced logits [F, 15, V] of the reference code predictor, all frames in one batch.

    qwen-tts's own ``forward_sub_talker_finetune`` (one causal pass over [h, C(c0), E_1(c1), ...,
    E_14(c14)], head g on position g + 1): the same modules and weights generate() runs
    step by step with a KV cache, 15x fewer Python calls."""
    logits, _ = model.talker.forward_sub_talker_finetune(torch.as_tensor(codes, dtype=torch.long),
                                                         torch.as_tensor(hidden, dtype=torch.float32))
    return logits.numpy()


# ---------------------------------------------------------------- reference parity
@pytest.mark.parametrize("mode,frame_graph,params", [
    ("frame", "cp_frame", GREEDY), ("step", "cp_frame", GREEDY), ("frame", "cp_frame_gqa", GREEDY),
    ("frame", "cp_frame_gqa", SamplingParams(0.0, 50, 0.9)),  # greedy by temperature, top-k on
])
def test_greedy_codes_match_reference(exported, frames, mode, frame_graph, params):
    codes, hidden = frames
    cp = make_cp(exported, mode, frame_graph)
    got = np.stack([cp.predict(hidden[k], int(codes[k, 0]), params, XorShift32(k))[0] for k in range(len(codes))])
    assert got.shape == (len(codes), 15) and got.dtype == np.int64
    match = got == codes[:, 1:]
    assert match.all(), f"{mode}: {match.sum()}/{match.size} codes match; first frame off: {np.nonzero(~match.all(1))[0][:5]}"


def test_teacher_forced_step_logits_cosine(reference, exported, frames):
    codes, hidden = frames
    cp = make_cp(exported, "step")
    ref = reference_cp_logits(reference.model, hidden, codes)
    ours = np.stack([cp.teacher_forced_logits(hidden[k], int(codes[k, 0]), codes[k, 1:]) for k in range(len(codes))])
    assert ours.shape == ref.shape == (len(codes), 15, cp.vocab)
    cos = cosine_rows(ref, ours)
    assert cos.min() >= 0.99999, cos.min()
    np.testing.assert_array_equal(ours.argmax(-1), codes[:, 1:])
    np.testing.assert_array_equal(ref.argmax(-1), codes[:, 1:])


def test_embedding_sum_and_next_talker_input(reference, exported, frames):
    from kztts.export.common.reference import codec_input

    codes, hidden = frames
    tables = exported["tables"]
    for mode in ("frame", "step"):
        cp = make_cp(exported, mode)
        for k in (0, len(codes) - 1):
            got, total = cp.predict(hidden[k], int(codes[k, 0]), GREEDY, XorShift32(1))
            want = sum(tables.cp_codec(g, got[g:g + 1])[0] for g in range(15))
            np.testing.assert_allclose(total, want, rtol=1e-6, atol=1e-6)
            nxt = tables.codec([int(codes[k, 0])])[0] + total
            np.testing.assert_allclose(nxt, codec_input(reference.model, codes[k]).numpy(), rtol=1e-5, atol=1e-5)


SAMPLED = [
    SamplingParams(0.9, 50, 1.0),
    SamplingParams(0.9, 50, 1.0, repetition_penalty=1.05),  # the windowed-penalty preset's Code Predictor
    SamplingParams(1.3, 0, 0.8, repetition_penalty=1.3),  # top-k off: the selection keeps every id
    SamplingParams(0.5, 3, 0.95, repetition_penalty=0.8),
]


@pytest.mark.parametrize("frame_graph,params", [("cp_frame", p) for p in SAMPLED]
                         + [("cp_frame_gqa", p) for p in SAMPLED[1:]])
def test_frame_and_step_modes_sample_identically(exported, frames, params, frame_graph):
    """The frame graphs' in-graph samplers (full sort in cp_frame, top-k selection in
    cp_frame_gqa) against the host sampler on the step graph's logits, same seeds."""
    codes, hidden = frames
    frame_cp, step_cp = make_cp(exported, "frame", frame_graph), make_cp(exported, "step")
    rf, rs = XorShift32(99), XorShift32(99)
    differs_from_greedy = 0
    for k in range(0, len(codes), 6):
        a, ea = frame_cp.predict(hidden[k], int(codes[k, 0]), params, rf)
        b, eb = step_cp.predict(hidden[k], int(codes[k, 0]), params, rs)
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(ea, eb, rtol=1e-5, atol=1e-5)
        differs_from_greedy += int((a != codes[k, 1:]).any())
        assert rf.state == rs.state
    assert differs_from_greedy > 0  # sampling really sampled


def test_each_frame_takes_exactly_15_uniforms(exported, frames):
    codes, hidden = frames
    for mode in ("frame", "step"):
        for params in (GREEDY, SamplingParams(0.9, 50, 1.0)):
            rng, twin = XorShift32(5), XorShift32(5)
            make_cp(exported, mode).predict(hidden[0], int(codes[0, 0]), params, rng)
            twin.uniforms(15)
            assert rng.state == twin.state


# ---------------------------------------------------------------- errors
class _NoRun:
    def run(self, *a, **k):
        raise AssertionError("a graph ran before the parameters were validated")


@pytest.mark.parametrize("params, message", [
    (SamplingParams(-1.0, 50, 1.0), r"code predictor temperature must be a finite number >= 0"),
    (SamplingParams(0.9, -3, 1.0), r"code predictor top_k must be an integer >= 0"),
    (SamplingParams(0.9, 50, 0.0), r"code predictor top_p must be in \(0, 1\]"),
    (SamplingParams(0.9, 50, 1.0, repetition_penalty=0.0), r"code predictor repetition_penalty must be a finite number > 0"),
])
@pytest.mark.parametrize("mode", ["frame", "step"])
def test_invalid_params_fail_before_any_graph_runs(exported, params, message, mode):
    cfg = exported["config"]
    cp = CodePredictor({"cp_frame": _NoRun(), "cp_step": _NoRun()}, cfg["code_predictor"], cfg["talker"],
                       exported["tables"], mode=mode)
    rng = XorShift32(3)
    h = np.zeros(cfg["talker"]["hidden"], np.float32)
    with pytest.raises(KzttsError, match=message):
        cp.predict(h, 5, params, rng)
    assert rng.state == XorShift32(3).state  # nothing drawn either
    with pytest.raises(KzttsError, match=r"c0 must be a codec id in 0..3071, got 3072"):
        cp.predict(h, 3072, GREEDY, rng)
    with pytest.raises(KzttsError, match=r"expects the talker hidden \[\d+\], got \(3,\)"):
        cp.predict(np.zeros(3, np.float32), 5, GREEDY, rng)
    with pytest.raises(KzttsError, match="mode 'fast' is not one of frame, step"):
        CodePredictor({}, cfg["code_predictor"], cfg["talker"], exported["tables"], mode="fast")


# ---------------------------------------------------------------- graph structure
def test_graph_io_and_structure(exported):
    specs = exported["specs"]
    cfg = exported["config"]
    h, v, hd = cfg["talker"]["hidden"], cfg["code_predictor"]["vocab"], cfg["code_predictor"]["head_dim"]
    frame = specs["cp_frame"]
    assert [(t.name, t.dtype, t.shape) for t in frame.inputs] == [
        ("hidden", "float32", (1, h)), ("c0_embed", "float32", (1, h)), ("temperature", "float32", (1,)),
        ("top_k", "int64", (1,)), ("top_p", "float32", (1,)), ("repetition_penalty", "float32", (1,)),
        ("uniforms", "float32", (15,))]
    assert [(t.name, t.dtype, t.shape) for t in frame.outputs] == [
        ("codes", "int64", (15,)), ("embedding_sum", "float32", (1, h))]
    step = specs["cp_step"]
    assert [(t.name, t.dtype, t.shape) for t in step.inputs][:4] == [
        ("inputs_embeds", "float32", (1, "seq", h)), ("rope_cos", "float32", (1, "seq", hd)),
        ("rope_sin", "float32", (1, "seq", hd)), ("step", "int64", (1,))]
    assert step.outputs[0].name == "logits" and step.outputs[0].shape == (1, v)
    assert frame.variant == "static" and step.variant == "dynamic"

    m = onnx.load(str(exported["dir"] / frame.file))
    ops = {n.op_type for n in m.graph.node}
    assert not ops & {"Loop", "If", "Scan", "ScatterND", "ScatterElements"}, ops
    # 15 heads, each its own [cp_H, V] MatMul weight (no stacked [15, V, cp_H] Gather table)
    inits = {i.name: tuple(i.dims) for i in m.graph.initializer}
    head_w = [n.input[1] for n in m.graph.node if n.op_type == "MatMul" and inits.get(n.input[1], ())[-1:] == (v,)]
    assert len(set(head_w)) == 15
    assert not any(len(s) == 3 and s[0] == 15 for s in inits.values())

    s = onnx.load(str(exported["dir"] / step.file))
    heads = [i for i in s.graph.initializer if i.name.startswith("cp_head_")]
    assert len(heads) == 15 and all(tuple(i.dims)[-1] == v for i in heads)


# ---------------------------------------------------------------- in-graph sampler vs host sampler
def _draw_cases(rng: np.random.Generator):
    """(logits [B, V], seen [B, V], T, K, P, RP, U) batches covering the edge cases."""
    cases = []

    def batch(v, n, kind):
        if kind == "normal":
            x = rng.standard_normal((n, v)) * rng.choice([0.3, 2.0, 8.0], (n, 1))
        elif kind == "ties":  # few distinct values: exact ties everywhere
            x = rng.integers(-3, 4, (n, v)) * 0.5
        elif kind == "flat":
            x = np.zeros((n, v))
        else:  # "masked": some -inf (suppressed) entries
            x = rng.standard_normal((n, v)) * 3
            x[rng.random((n, v)) < 0.3] = -np.inf
            x[:, 0] = np.where(np.isinf(x[:, 0]), 0.0, x[:, 0])
        x = x.astype(np.float32)
        seen = rng.random((n, v)) < rng.choice([0.0, 0.01, 0.2], (n, 1))
        t = rng.choice(np.array([0.0, 1e-6, 1e-3, 0.3, 0.9, 1.0, 1.7, 100.0], np.float32), n)
        k = rng.choice(np.array([0, 1, 2, 3, 10, 50, v - 1, v, v + 7], np.int64), n)
        p = rng.choice(np.array([1.0, 0.999999, 0.95, 0.8, 0.5, 1e-3, 1e-7], np.float32), n)
        rp = rng.choice(np.array([1.0, 1.05, 1.3, 0.7], np.float32), n)
        u = rng.random(n).astype(np.float32)
        special = rng.random(n)
        u[special < 0.05] = 0.0
        u[(special >= 0.05) & (special < 0.1)] = np.float32(1 - 2 ** -24)
        u[(special >= 0.1) & (special < 0.15)] = 0.5  # on a boundary of equal probabilities
        cases.append((x, seen, t, k, p, rp, u))

    batch(2048, 3500, "normal")  # the code predictor's vocabulary
    batch(2048, 800, "ties")
    batch(2048, 500, "masked")
    batch(16, 2500, "ties")
    batch(4, 1000, "ties")
    batch(8, 700, "flat")
    batch(64, 1500, "normal")
    return cases


def _host(x, seen, t, k, p, rp, u):
    params = SamplingParams(float(t), int(k), float(p), float(rp))
    return sample_token(repetition_penalty(x, np.nonzero(seen)[0], float(rp)), params, float(u))


@pytest.mark.parametrize("select_k", [False, True])
def test_in_graph_sampler_matches_host_sampler(tmp_path_factory, select_k):
    """Every batch whole (mixed settings), and with ``select_k`` also the rows where top-k is on
    or greedy alone (a row without top-k makes the whole batch sort the vocabulary) and, for a
    sample, each row alone (its own limit: k plus the ties at its k-th score)."""
    from kztts.export.graphs.code_predictor_graph import export_sampler

    path = export_sampler(tmp_path_factory.mktemp("sampler") / "sampler.onnx", select_k=select_k)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    total = agree = 0
    bad = []

    def check(x, seen, t, k, p, rp, u):
        nonlocal total, agree
        tok, = sess.run(None, dict(logits=x, seen=seen, temperature=t, top_k=k, top_p=p, repetition_penalty=rp,
                                   uniform=u))
        host = np.array([_host(*row) for row in zip(x, seen, t, k, p, rp, u)])
        total += len(host)
        agree += int((tok == host).sum())
        bad.extend((x.shape[1], float(t[i]), int(k[i]), float(p[i]), float(rp[i]), float(u[i]))
                   for i in np.nonzero(tok != host)[0][:3])

    for case in _draw_cases(np.random.default_rng(2024)):
        x, _, t, k, *_ = case
        if not select_k or x.shape[1] < 2048:  # mixed batches: the small vocabularies (the host is slow on 2048)
            check(*case)
        if select_k:
            selective = ((k > 0) & (k < x.shape[1])) | (t <= 0) | (k == 1)
            check(*(a[selective] for a in case))
            for i in range(0, len(x), 50):
                check(*(a[i:i + 1] for a in case))
    assert total >= 10_000
    assert agree == total, f"{agree}/{total} agree; e.g. (V, T, k, p, rp, u) = {bad[:5]}"


def test_top_k_selection_reads_only_the_kept_ids(tmp_path_factory):
    """With ``select_k`` no TopK of the graph takes a constant k (the vocabulary): its k comes
    from the top_k input; the draw order is as long as top-k keeps, ties at the k-th included."""
    from kztts.export.graphs.code_predictor_graph import export_sampler

    path = export_sampler(tmp_path_factory.mktemp("sampler_k") / "sampler.onnx", select_k=True)
    m = onnx.load(str(path))
    consts = {o for n in m.graph.node if n.op_type == "Constant" for o in n.output}
    topk = [n for n in m.graph.node if n.op_type == "TopK"]
    assert len(topk) == 2 and not any(n.input[1] in consts for n in topk)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.array([[5, 4, 4, 4, 1, 0, 3, 2]], np.float32)
    f = np.ones(1, np.float32)
    for k, u, want in [(2, 0.99, 3), (2, 0.0, 0), (1, 0.5, 0), (5, 0.999, 6)]:  # k=2 keeps 0-3 (ties), k=5 0-3 and 6
        tok, = sess.run(None, dict(logits=x, seen=np.zeros_like(x, bool), temperature=f * 1e3, top_k=np.array([k]),
                                   top_p=f, repetition_penalty=f, uniform=f * u))
        assert int(tok[0]) == want == _host(x[0], np.zeros(8, bool), 1e3, k, 1.0, 1.0, u), (k, u)


def test_sample_rows_torch_function_matches_host():
    """The torch function itself (what the frame graph is traced from), in eager mode."""
    from kztts.export.graphs.code_predictor_graph import sample_rows

    rng = np.random.default_rng(7)
    n, v = 300, 2048
    x = (rng.standard_normal((n, v)) * 3).astype(np.float32)  # continuous: no ties (torch.topk tie order is unspecified)
    seen = rng.random((n, v)) < 0.01
    t = rng.choice(np.array([0.0, 0.7, 1.0], np.float32), n)
    k = rng.choice(np.array([0, 1, 50, v + 1]), n).astype(np.int64)
    p = rng.choice(np.array([1.0, 0.9, 0.3], np.float32), n)
    rp = rng.choice(np.array([1.0, 1.05], np.float32), n)
    u = rng.random(n).astype(np.float32)
    got = sample_rows(*(torch.from_numpy(a) for a in (x, seen, t, k, p, rp, u))).numpy()
    host = np.array([_host(*row) for row in zip(x, seen, t, k, p, rp, u)])
    assert (got == host).mean() == 1.0
