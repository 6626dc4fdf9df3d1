"""The static HTP graphs of a bundle against the CPU fp32 graphs (and qwen-tts).

The HTP side always runs in a child process (``kztts.core.worker_process`` runs this module's
``main``): once a process has opened a QNN session with ``soc_model`` (fp16), later QNN
sessions in it are fp16 too (docs/QNN_EP.md), so fp32 and fp16 results must never come from one
process. The parent builds the inputs, runs the CPU fp32
side, and compares.

Teacher forcing: both sides get the very same input embeddings (a real prompt, then
the embeddings of given codes), so the logits are comparable step by step.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from kztts.bundle.bundle import Bundle
from kztts.bundle.embeddings import EmbeddingTables
from kztts.core.errors import KzttsError
from kztts.core.metrics import cosine_rows
from kztts.core.progress import phase
from kztts.core.worker_process import run_worker, worker_main
from kztts.eval.replay import decode_input, decode_inputs, greedy_cb0, teacher_forced_talker
from kztts.export.common.checkpoint import load_reference
from kztts.export.common.reference import kind_modes, reference_run
from kztts.export.validate.tts import bundle_prompt
from kztts.generation.sampling import SamplingParams, XorShift32
from kztts.htp.qnn import Placement, bundle_target, session_precision
from kztts.htp.targets import load_target
from kztts.plan.resolve import resolve_plan
from kztts.runners.rope import rope_tables
from kztts.runners.talker_prefill_only import PrefillOnlyTalker
from kztts.runners.talker_static import DECODE, PREFILL, StaticTalker
from kztts.tts.prompt import build_prompt, language_id
from kztts.tts.text.tokenizer import TextTokenizer

DEFAULT_TEXTS = ("Hello world, this is a tiny test.",
                 "The quick brown fox jumps over the lazy dog, twice.")


# ------------------------------------------------------------------ sequences
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
    bundle = Bundle.open(bundle_dir, load_graphs=False)
    m = bundle.manifest
    tables = EmbeddingTables.from_bundle(bundle)
    tok = TextTokenizer(Path(bundle_dir) / "tokenizer.json")
    talker = resolve_plan(bundle, attention="plain").open_talker(context or 512)
    cp = None
    if "cp_frame" in m.graphs or "cp_step" in m.graphs:
        try:
            cp = resolve_plan(bundle, cp_mode="frame" if "cp_frame" in m.graphs else "step").open_code_predictor(tables)
        except Exception:  # the Code Predictor is optional here: seeded codes still teacher-force
            cp = None
    eos = int(m.special_ids["codec_eos"])
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
            c0 = greedy_cb0(logits, eos)  # EOS suppressed: keep the sequence going
            if cp is not None:
                rest, _ = cp.predict(hidden, c0, SamplingParams.greedy_params(), XorShift32(1))
            else:
                rest = rng.integers(0, tables.cp_vocab, groups)
            frame = np.concatenate([[c0], rest]).astype(np.int64)
            e = decode_input(tables, prompt, frame, k)
            decodes.append(e)
            codes.append(frame)
            logits, hidden = talker.decode(e)
        out.append({"prefill": prompt.embeds, "decodes": np.stack(decodes), "codes": np.stack(codes)})
    return out


def sequences_spec(seqs: list[dict]) -> dict:
    """The teacher-forcing inputs of ``seqs`` as a worker spec's entries (``kztts.core.worker_process``)."""
    spec: dict = {"sequences": len(seqs)}
    for i, s in enumerate(seqs):
        spec[f"prefill_{i}"], spec[f"decodes_{i}"] = s["prefill"], s["decodes"]
    return spec


def spec_sequences(spec: dict) -> list[dict]:
    """The inverse of ``sequences_spec``."""
    return [{"prefill": spec[f"prefill_{i}"], "decodes": spec[f"decodes_{i}"]} for i in range(spec["sequences"])]


def replay_sequences(talker, seqs: list[dict]) -> dict[str, np.ndarray]:
    """Teacher-forced ``talker`` over ``seqs``: ``logits_i`` and ``hidden_i`` per sequence."""
    out = {}
    for i, s in enumerate(seqs):
        out[f"logits_{i}"], out[f"hidden_{i}"] = teacher_forced_talker(talker, s["prefill"], s["decodes"])
    return out


# ------------------------------------------------------------------ the HTP side (child process)
def _talker_worker(spec: dict) -> dict:
    bundle_dir, target, strict = spec["bundle"], spec["target"], spec["strict"]
    bundle = Bundle.open(bundle_dir, load_graphs=False)
    plan = resolve_plan(bundle, target=target, placement="all-htp", strict=strict)
    if spec["cpu_static"]:  # the static graphs on the CPU EP (fp32): checks the graphs, not the HTP
        mask_value = bundle.manifest.graphs[PREFILL].extra.get("mask_value", -50.0)
        if plan.steps["talker_decode"].graphs == (DECODE,):
            talker = StaticTalker(plan.session(PREFILL, "cpu"), plan.session(DECODE, "cpu"), bundle.manifest.talker,
                                  mask_value)
        else:  # talker_graphs prefill-only

            talker = PrefillOnlyTalker(plan.session(PREFILL, "cpu"), bundle.manifest.talker, mask_value)
    else:
        talker = plan.open_talker()
    arrays = replay_sequences(talker, spec_sequences(spec))
    info = {}
    for name, sess in ((PREFILL, talker.prefill_session), (DECODE, talker.decode_session)):
        if sess is None:  # prefill-only: the prefill graph serves the decode steps
            continue
        pl = Placement.of(sess)
        info[name] = {"qnn_nodes": pl.qnn_nodes, "cpu_nodes": pl.cpu_nodes, "cpu_op_types": pl.cpu_op_types,
                      "precision": session_precision(bundle.manifest.graphs[name].precision, sess)}
    return {"info": info, **arrays}


def htp_talker_run(bundle_dir: str | Path, target: str | Path | None, seqs: list[dict], *, strict: bool = True,
                   cpu_static: bool = False, timeout: float = 1800) -> tuple[list[tuple[np.ndarray, np.ndarray]], dict]:
    """Run the bundle's static Talker on ``target`` in a child process over ``seqs``
    (teacher forcing); returns [(logits, hidden)] per sequence and the placement info."""
    spec = {"job": "talker", "bundle": str(bundle_dir), "target": str(target) if target else None, "strict": strict,
            "cpu_static": cpu_static, **sequences_spec(seqs)}
    res = run_worker("kztts.export.validate.htp", spec, None, "htp-talker", timeout=timeout)
    runs = [(res[f"logits_{i}"], res[f"hidden_{i}"]) for i in range(len(seqs))]
    return runs, res["info"]


# ------------------------------------------------------------------ fp16 headroom
FP16_MAX = 65504.0
FP16_RISK = 3.0e4  # |x| above this is within 2x of saturation (HTP fp16 saturates silently)


def activation_peaks(graph_path: str | Path, feeds: list[dict]) -> dict[str, float]:
    """max |x| of every float tensor of an ONNX graph over ``feeds``, on the CPU in fp32.

    fp16 overflow on the HTP saturates silently (no inf/NaN, and cosine checks can miss
    it, docs/QNN_EP.md); an fp32 reference of per-tensor magnitudes is what detects it."""
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
    tables = EmbeddingTables.from_bundle(bundle)
    seqs = []
    for i, mode in enumerate(modes):
        phase("validate: qwen-tts reference, %s (%d/%d)", mode, i + 1, len(modes))
        run = reference_run(tts, mode, frames=frames, language=language)
        prompt = bundle_prompt(bundle, tables, run)
        seqs.append({"prefill": prompt.embeds, "decodes": decode_inputs(tables, prompt, run.codes), "codes": run.codes})
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
    if tts is None:  # tests pass a loaded one
        phase("validate: loading the qwen-tts reference from %s", reference_dir)
        tts = load_reference(Path(reference_dir))
    modes = kind_modes(tts, modes)
    seqs = reference_sequences(bundle, tts, modes, frames, language)
    names = list(modes)
    ctx = max(s["prefill"].shape[0] + len(s["decodes"]) + 1 for s in seqs)
    cpu = resolve_plan(bundle, attention="plain").open_talker(max(ctx, 16))
    cpu_runs = [teacher_forced_talker(cpu, s["prefill"], s["decodes"]) for s in seqs]
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
    cp_on_htp = resolve_plan(bundle, target=tcfg).steps["code_predictor"].device == "htp"
    cp_match = _cp_codes_match(bundle_dir, tname, bundle, cpu_runs, seqs, strict) if cp_on_htp else None
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
    spec = {"job": "cp", "bundle": str(bundle_dir), "target": str(target), "strict": strict, "hidden": h, "c0": c0}
    htp_codes = run_worker("kztts.export.validate.htp", spec, None, "htp-code-predictor", timeout=1800)["codes"]
    return float((htp_codes == cpu_codes).mean())


def _cp_codes(bundle_dir, target, hidden: np.ndarray, c0: np.ndarray, strict: bool) -> np.ndarray:
    bundle = Bundle.open(bundle_dir, load_graphs=False)
    # the plain cp_frame: on the CPU (target None) or where the target places it
    plan = resolve_plan(bundle, target=target, strict=strict, attention="plain")
    return greedy_cp_codes(plan.open_code_predictor(EmbeddingTables.from_bundle(bundle)), hidden, c0)


def greedy_cp_codes(cp, hidden: np.ndarray, c0: np.ndarray) -> np.ndarray:
    """CB1..15 of an opened Code Predictor runner, greedy, for each (hidden state, CB0) pair."""
    greedy = SamplingParams.greedy_params()
    return np.stack([cp.predict(h, int(c), greedy, XorShift32(1))[0] for h, c in zip(hidden, c0)])


def _cp_worker(spec: dict) -> dict:
    return {"codes": _cp_codes(spec["bundle"], spec["target"], spec["hidden"], spec["c0"], spec["strict"])}


def main(argv: list[str] | None = None) -> int:
    """The HTP side's child process (``kztts.core.worker_process``): ``job`` talker or cp."""
    return worker_main(lambda spec: {"talker": _talker_worker, "cp": _cp_worker}[spec["job"]](spec), argv)


if __name__ == "__main__":
    sys.exit(main())
