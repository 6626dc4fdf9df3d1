"""The static HTP graphs of a bundle against the CPU fp32 graphs (and qwen-tts).

The HTP side always runs in a child process (``python -m kztts.export.validate_htp
talker-worker ...``): once a process has opened a QNN session with ``soc_model``
(fp16), later QNN sessions in it are fp16 too (QNN.md), so fp32 and fp16 results
must never come from one process. The parent builds the inputs, runs the CPU fp32
side, and compares.

Teacher forcing: both sides get the very same input embeddings (a real prompt, then
the embeddings of given codes), so the logits are comparable step by step.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

DEFAULT_TEXTS = ("Hello world, this is a tiny test.",
                 "The quick brown fox jumps over the lazy dog, twice.")


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return (a64 * b64).sum(-1) / (np.linalg.norm(a64, axis=-1) * np.linalg.norm(b64, axis=-1) + 1e-300)


# ------------------------------------------------------------------ sequences
def replay(talker, prefill: np.ndarray, decodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Teacher-forced run: logits [F+1, V] and hidden [F+1, H] (step 0 = after the prefill)."""
    lg, hd = talker.prefill(prefill)
    logits, hidden = [lg], [hd]
    for e in decodes:
        lg, hd = talker.decode(e)
        logits.append(lg)
        hidden.append(hd)
    return np.stack(logits), np.stack(hidden)


def _fixed_speaker(hidden: int) -> np.ndarray:
    """A deterministic x-vector stand-in (as the tiny model's own calibration prompt uses)."""
    return (np.ones(hidden, np.float32) / np.sqrt(hidden) * 4.0).astype(np.float32)


def bundle_sequences(bundle_dir: str | Path, texts=DEFAULT_TEXTS, frames: int = 16, seed: int = 0,
                     language: str = "english", context: int | None = None) -> list[dict]:
    """Teacher-forcing inputs from real text prompts, without torch.

    Per text: the x-vector non-streaming prompt built by the runtime, then ``frames``
    decode inputs: CB0 greedy from the CPU fp32 Talker (control ids suppressed),
    CB1..15 greedy from the bundle's Code Predictor when it has one, else seeded codes.
    Returns [{"prefill": [T, H], "decodes": [F, H], "codes": [F, 16]}]."""
    from kztts.bundle import Bundle
    from kztts.embeddings import EmbeddingTables
    from kztts.prompt import build_prompt, language_id
    from kztts.talker import Talker
    from kztts.text import TextTokenizer

    bundle = Bundle.open(bundle_dir, load_graphs=False)
    m = bundle.manifest
    tables = EmbeddingTables.from_bundle(bundle)
    tok = TextTokenizer(Path(bundle_dir) / "tokenizer.json")
    talker = Talker(bundle.session("talker"), m.talker, context=context or 512)
    cp = None
    if "cp_frame" in m.graphs or "cp_step" in m.graphs:
        try:
            from kztts.code_predictor import CodePredictor

            cp = CodePredictor.from_bundle(bundle, mode="frame" if "cp_frame" in m.graphs else "step",
                                           embeddings=tables)
        except Exception:  # the Code Predictor is optional here: seeded codes still teacher-force
            cp = None
    vocab, eos = int(m.talker["vocab"]), int(m.special_ids["codec_eos"])
    groups = tables.num_cp_groups
    rng = np.random.default_rng(seed)
    out = []
    for text in texts:
        prompt = build_prompt(tables, tok.assistant_ids(text), special_ids=m.special_ids,
                              language_id=language_id(m.languages, language), speaker=_fixed_speaker(tables.hidden),
                              mode="xvector", non_streaming=True)
        logits, hidden = talker.prefill(prompt.embeds)
        decodes, codes = [], []
        for k in range(frames):
            s = np.array(logits, dtype=np.float64)
            s[vocab - 1024:] = -np.inf  # control ids and EOS: keep the sequence going
            c0 = int(np.argmax(s))
            if cp is not None:
                from kztts.sampling import SamplingParams, XorShift32

                rest, _ = cp.predict(hidden, c0, SamplingParams.greedy_params(), XorShift32(1))
            else:
                rest = rng.integers(0, tables.cp_vocab, groups)
            frame = np.concatenate([[c0], rest]).astype(np.int64)
            text_part = prompt.trailing[k] if k < len(prompt.trailing) else prompt.tts_pad
            e = (tables.codec_sum(frame) + text_part).astype(np.float32)
            decodes.append(e)
            codes.append(frame)
            logits, hidden = talker.decode(e)
        out.append({"prefill": prompt.embeds, "decodes": np.stack(decodes), "codes": np.stack(codes)})
    return out


def _save_sequences(path: Path, seqs: list[dict]) -> None:
    arrays = {}
    for i, s in enumerate(seqs):
        arrays[f"prefill_{i}"] = s["prefill"]
        arrays[f"decodes_{i}"] = s["decodes"]
    np.savez(path, n=np.array(len(seqs)), **arrays)


# ------------------------------------------------------------------ the HTP side (child process)
def _talker_worker(bundle_dir: str, target: str, strict: bool, in_npz: str, out_npz: str,
                   cpu_static: bool = False) -> None:
    import onnxruntime as ort

    from kztts.bundle import Bundle
    from kztts.qnn import Placement, session_precision
    from kztts.talker_static import DECODE, PREFILL, StaticTalker

    bundle = Bundle.open(bundle_dir, load_graphs=False)
    if cpu_static:  # the static graphs on the CPU EP (fp32): checks the graphs, not the HTP
        def cpu(name):
            return ort.InferenceSession(str(Path(bundle_dir) / bundle.manifest.graphs[name].file),
                                        providers=["CPUExecutionProvider"])

        spec = bundle.manifest.graphs[PREFILL]
        talker = StaticTalker(cpu(PREFILL), cpu(DECODE), bundle.manifest.talker, spec.extra.get("mask_value", -50.0))
    else:
        talker = StaticTalker.from_bundle(bundle, target, strict=strict)
    data = np.load(in_npz)
    arrays = {}
    for i in range(int(data["n"])):
        lg, hd = replay(talker, data[f"prefill_{i}"], data[f"decodes_{i}"])
        arrays[f"logits_{i}"], arrays[f"hidden_{i}"] = lg, hd
    info = {}
    for name, sess in ((PREFILL, talker.prefill_session), (DECODE, talker.decode_session)):
        pl = Placement.of(sess)
        info[name] = {"qnn_nodes": pl.qnn_nodes, "cpu_nodes": pl.cpu_nodes, "cpu_op_types": pl.cpu_op_types,
                      "precision": session_precision(bundle.manifest.graphs[name].precision, sess)}
    np.savez(out_npz, info=np.array(json.dumps(info)), **arrays)


def htp_talker_run(bundle_dir: str | Path, target: str | Path | None, seqs: list[dict], *, strict: bool = True,
                   cpu_static: bool = False, timeout: float = 1800) -> tuple[list[tuple[np.ndarray, np.ndarray]], dict]:
    """Run the bundle's static Talker on ``target`` in a child process over ``seqs``
    (teacher forcing); returns [(logits, hidden)] per sequence and the placement info."""
    with tempfile.TemporaryDirectory(prefix="kztts-htp-") as tmp:
        src, dst = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        _save_sequences(src, seqs)
        cmd = [sys.executable, "-m", "kztts.export.validate_htp", "talker-worker", str(bundle_dir),
               str(target or ""), "1" if strict else "0", str(src), str(dst), "1" if cpu_static else "0"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=dict(os.environ))
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-12:])
            from kztts.errors import KzttsError

            raise KzttsError(f"the HTP worker failed (exit {proc.returncode}):\n{tail}")
        res = np.load(dst)
        runs = [(res[f"logits_{i}"], res[f"hidden_{i}"]) for i in range(len(seqs))]
        return runs, json.loads(str(res["info"]))


# ------------------------------------------------------------------ fp16 headroom
FP16_MAX = 65504.0
FP16_RISK = 3.0e4  # |x| above this is within 2x of saturation (HTP fp16 saturates silently)


def activation_peaks(graph_path: str | Path, feeds: list[dict]) -> dict[str, float]:
    """max |x| of every float tensor of an ONNX graph over ``feeds``, on the CPU in fp32.

    fp16 overflow on the HTP saturates silently (no inf/NaN, and cosine checks can miss
    it, QNN.md); an fp32 reference of per-tensor magnitudes is what detects it."""
    import onnx
    import onnxruntime as ort

    m = onnx.shape_inference.infer_shapes(onnx.load(str(graph_path)))
    known = {o.name for o in m.graph.output}
    for vi in m.graph.value_info:
        if vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT and vi.name not in known:
            m.graph.output.append(onnx.helper.make_tensor_value_info(vi.name, onnx.TensorProto.FLOAT, None))
            known.add(vi.name)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), sess_options=so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    peaks: dict[str, float] = {}
    for feed in feeds:
        for name, v in zip(names, sess.run(names, feed)):
            if isinstance(v, np.ndarray) and v.dtype.kind == "f" and v.size:
                finite = np.abs(v[np.isfinite(v)])  # the CPU graph's causal mask is -inf by design
                if finite.size:
                    peaks[name] = max(peaks.get(name, 0.0), float(finite.max()))
    return peaks


def talker_fp16_headroom(bundle_dir: str | Path, seqs: list[dict]) -> dict:
    """Per-tensor peaks of the fp32 Talker graph on the prompts of ``seqs`` (prefill)."""
    from kztts.bundle import Bundle
    from kztts.rope import rope_tables

    bundle = Bundle.open(bundle_dir, load_graphs=False)
    t = bundle.manifest.talker
    kv, hd, L = int(t["num_kv_heads"]), int(t["head_dim"]), int(t["num_layers"])
    feeds = []
    for s in seqs:
        n = s["prefill"].shape[0]
        cos, sin = rope_tables(n, hd, float(t["rope_theta"]))
        feed = {"inputs_embeds": s["prefill"][None].astype(np.float32), "rope_cos": cos[None], "rope_sin": sin[None]}
        for i in range(L):
            feed[f"past_key_{i}"] = feed[f"past_value_{i}"] = np.zeros((1, kv, 0, hd), np.float32)
        feeds.append(feed)
    peaks = activation_peaks(Path(bundle_dir) / bundle.manifest.graphs["talker"].file, feeds)
    risky = sorted(((v, k) for k, v in peaks.items() if v >= FP16_RISK), reverse=True)
    return {"fp16_max_abs_activation": max(peaks.values()) if peaks else 0.0,
            "fp16_saturation_risk": [{"tensor": k, "max_abs": v} for v, k in risky[:20]]}


def reference_sequences(bundle, tts, modes, frames: int, language: str) -> list[dict]:
    """Teacher-forcing inputs from qwen-tts itself: per mode, its prompt (as the bundle builds it)
    and the embeddings of its greedy codes. [{"prefill", "decodes", "codes"}]."""
    from kztts.embeddings import EmbeddingTables
    from kztts.export.reference import reference_run
    from kztts.export.validate import bundle_prompt

    tables = EmbeddingTables.from_bundle(bundle)
    seqs = []
    for mode in modes:
        run = reference_run(tts, mode, frames=frames, language=language)
        prompt = bundle_prompt(bundle, tables, run)
        dec = [tables.codec_sum(f) + (prompt.trailing[k] if k < len(prompt.trailing) else prompt.tts_pad)
               for k, f in enumerate(run.codes)]
        seqs.append({"prefill": prompt.embeds, "decodes": np.asarray(dec, np.float32).reshape(-1, tables.hidden),
                     "codes": run.codes})
    return seqs


# ------------------------------------------------------------------ kztts validate --target
def validate_target(bundle_dir: str | Path, reference_dir: str | Path, target: str | Path | None = None,
                    precision: str | None = None, frames: int = 16, *, strict: bool = True,
                    modes: tuple[str, ...] = ("xvec_nonstream", "icl_stream"), language: str = "English",
                    tts=None) -> dict:
    """Teacher-forced Talker on the HTP (child process) vs CPU fp32, on qwen-tts's own prompts
    and greedy codes; Code Predictor greedy codes HTP vs CPU when the bundle has a static
    ``cp_frame`` placed on the HTP.

    Keys: ``target``, ``precision``, ``talker_logits_cos_min`` / ``_mean`` (HTP vs CPU fp32),
    ``talker_argmax_match`` (greedy CB0 agreement), ``cp_codes_match`` (None without an HTP
    Code Predictor), ``frames``, ``modes``, ``placement``, ``fp16_max_abs_activation`` and
    ``fp16_saturation_risk`` (Talker tensors whose fp32 magnitude comes within 2x of the fp16
    limit on these prompts: silent saturation on the HTP; route such layers to the CPU or
    quantize).
    """
    from kztts.bundle import Bundle
    from kztts.errors import KzttsError
    from kztts.export.checkpoint import load_reference
    from kztts.qnn import bundle_target
    from kztts.talker import Talker
    from kztts.targets import load_target

    bundle = Bundle.open(bundle_dir)
    m = bundle.manifest
    statics = {n: g for n, g in m.graphs.items() if g.variant == "static" and n.startswith("talker_")}
    if not statics:
        raise KzttsError(f"{bundle_dir}: no static HTP graphs; export with --target")
    tname = str(target) if target is not None else bundle_target(bundle)
    tcfg = load_target(tname)
    have = {g.precision for g in statics.values()}
    if precision is not None and precision not in have:
        raise KzttsError(f"{bundle_dir}: the static graphs are {sorted(have)}, not {precision}; "
                         f"re-export with --precision {precision}")
    tts = tts if tts is not None else load_reference(Path(reference_dir))  # tests pass a loaded one
    seqs = reference_sequences(bundle, tts, modes, frames, language)
    names = list(modes)
    ctx = max(s["prefill"].shape[0] + len(s["decodes"]) + 1 for s in seqs)
    cpu = Talker(bundle.session("talker"), m.talker, context=max(ctx, 16))
    cpu_runs = [replay(cpu, s["prefill"], s["decodes"]) for s in seqs]
    htp_runs, info = htp_talker_run(bundle_dir, tname, seqs, strict=strict)
    per_mode, cos_all, match_all = [], [], []
    for name, (cl, ch), (hl, hh), s in zip(names, cpu_runs, htp_runs, seqs):
        c = cosine_rows(hl, cl)
        match = (hl.argmax(-1) == cl.argmax(-1))
        cos_all.append(c)
        match_all.append(match)
        per_mode.append({"mode": name, "prompt_positions": int(s["prefill"].shape[0]), "frames": int(len(s["decodes"])),
                         "logits_cos_min": float(c.min()), "hidden_cos_min": float(cosine_rows(hh, ch).min()),
                         "argmax_match": float(match.mean()), "max_abs_cpu_logit": float(np.abs(cl).max())})
    headroom = talker_fp16_headroom(bundle_dir, seqs)
    cp_match = _cp_codes_match(bundle_dir, tname, bundle, cpu_runs, seqs, strict) if (
        "cp_frame" in m.graphs and m.graphs["cp_frame"].variant == "static" and tcfg.on_htp("cp_frame")) else None
    return {
        "bundle": str(bundle_dir), "reference": str(reference_dir), "target": tcfg.name, "soc": tcfg.soc.name,
        "precision": sorted(have)[0] if len(have) == 1 else sorted(have),
        "talker_logits_cos_min": float(np.concatenate(cos_all).min()),
        "talker_logits_cos_mean": float(np.concatenate(cos_all).mean()),
        "talker_argmax_match": float(np.concatenate(match_all).mean()),
        "cp_codes_match": cp_match, "frames": min(p["frames"] for p in per_mode), "modes": per_mode,
        "placement": info, **headroom,
    }


def _cp_codes_match(bundle_dir, target, bundle, cpu_runs, seqs, strict) -> float | None:
    """Greedy Code Predictor codes with cp_frame on the HTP (child process) vs the CPU, on the
    CPU Talker's hiddens and the given CB0 codes."""
    hiddens, c0s = [], []
    for (_, ch), s in zip(cpu_runs, seqs):
        hiddens.append(ch[:len(s["codes"])])
        c0s.append(np.asarray(s["codes"])[:, 0])
    h, c0 = np.concatenate(hiddens).astype(np.float32), np.concatenate(c0s).astype(np.int64)
    if len(h) == 0:
        return None
    cpu_codes = _cp_codes(bundle_dir, None, h, c0, strict=False)
    with tempfile.TemporaryDirectory(prefix="kztts-cp-") as tmp:
        src, dst = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        np.savez(src, hidden=h, c0=c0)
        cmd = [sys.executable, "-m", "kztts.export.validate_htp", "cp-worker", str(bundle_dir), str(target),
               "1" if strict else "0", str(src), str(dst)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            from kztts.errors import KzttsError

            raise KzttsError("the HTP code-predictor worker failed:\n" + "\n".join(proc.stderr.splitlines()[-12:]))
        htp_codes = np.load(dst)["codes"]
    return float((htp_codes == cpu_codes).mean())


def _cp_codes(bundle_dir, target, hidden: np.ndarray, c0: np.ndarray, strict: bool) -> np.ndarray:
    from kztts.bundle import Bundle
    from kztts.code_predictor import CodePredictor
    from kztts.embeddings import EmbeddingTables
    from kztts.sampling import SamplingParams, XorShift32

    bundle = Bundle.open(bundle_dir, load_graphs=False)
    m = bundle.manifest
    if target is None:
        sessions = bundle.session
    else:
        from kztts.qnn import open_target_session

        sess = open_target_session(bundle, "cp_frame", target, strict)
        sessions = {"cp_frame": sess}
    cp = CodePredictor(sessions, m.code_predictor, m.talker, EmbeddingTables.from_bundle(bundle), mode="frame")
    greedy = SamplingParams.greedy_params()
    return np.stack([cp.predict(h, int(c), greedy, XorShift32(1))[0] for h, c in zip(hidden, c0)])


def _cp_worker(bundle_dir: str, target: str, strict: bool, in_npz: str, out_npz: str) -> None:
    d = np.load(in_npz)
    np.savez(out_npz, codes=_cp_codes(bundle_dir, target, d["hidden"], d["c0"], strict))


def main(argv: list[str]) -> int:
    if argv and argv[0] == "talker-worker":
        _, bundle_dir, target, strict, src, dst, cpu_static = argv
        _talker_worker(bundle_dir, target or None, strict == "1", src, dst, cpu_static == "1")
        return 0
    if argv and argv[0] == "cp-worker":
        _, bundle_dir, target, strict, src, dst = argv
        _cp_worker(bundle_dir, target, strict == "1", src, dst)
        return 0
    print("usage: python -m kztts.export.validate_htp talker-worker|cp-worker ...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
