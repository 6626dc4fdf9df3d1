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
from kztts.eval.acceptance import VALIDATION_PROMPTS, VALIDATION_TEXTS, validation_voice
from kztts.export.common.reference import reference_run
from kztts.export.common.reference import teacher_forced_talker as reference_talker
from kztts.export.validate.decoder import htp_decoder_snr
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

CP_FRAMES = 4  # Code Predictor frames judged per prompt: 4 prompts x 4 frames x 15 heads = 240 code rows
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
    Returns [{"prefill": [T, H], "decodes": [F, H], "codes": [F, 16], "cp_hidden": [F, H]}] (``cp_hidden``: the
    CPU Talker's hidden state each frame's codes came from)."""
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
        decodes, codes, hiddens = [], [], []
        for k in range(frames):
            hiddens.append(np.asarray(hidden, np.float32))
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
        out.append({"prefill": prompt.embeds, "decodes": np.stack(decodes), "codes": np.stack(codes),
                    "cp_hidden": np.stack(hiddens).reshape(len(hiddens), -1)})
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


def reference_sequences(bundle, tts, prompts, frames: int, language: str) -> list[dict]:
    """Teacher-forcing inputs from qwen-tts itself: per (text, mode) of ``prompts`` (or a mode alone: the
    reference's default text and voice), its prompt (as the bundle builds
    it), the embeddings of its greedy codes, and its own Talker's hidden state at each frame (what the Code
    Predictor is judged on). The reference voice is ``VALIDATION_VOICE``, not the calibration's.
    [{"prefill", "decodes", "codes", "cp_hidden", "text", "mode"}]."""
    tables = EmbeddingTables.from_bundle(bundle)
    voice = validation_voice()
    seqs = []
    for i, item in enumerate(prompts):
        phase("validate: qwen-tts reference, %s (%d/%d)", item if isinstance(item, str) else item[1], i + 1,
              len(prompts))
        if isinstance(item, str):  # a mode alone: the reference's own text and voice (benchmarks, --placement)
            text, mode = None, item
            run = reference_run(tts, mode, frames=frames, language=language)
            text = run.text
        else:
            text, mode = item
            run = reference_run(tts, mode, frames=frames, language=language, text=text, ref_audio=voice)
        prompt = bundle_prompt(bundle, tables, run)
        _, ref_hidden = reference_talker(tts.model, run.prefill, run.trailing, run.tts_pad, run.codes)
        seqs.append({"prefill": prompt.embeds, "decodes": decode_inputs(tables, prompt, run.codes), "codes": run.codes,
                     "cp_hidden": ref_hidden[:len(run.codes)], "text": text, "mode": mode})
    return seqs


def validation_prompts(tts, texts=None) -> tuple[tuple[str, str], ...]:
    """(text, mode) pairs: ``VALIDATION_PROMPTS``, or the user's ``texts`` each in turn in the default modes; a
    CustomVoice / VoiceDesign checkpoint speaks each in its text mode (``kind_modes``)."""
    if texts:
        modes = tuple(m for _, m in VALIDATION_PROMPTS)
        pairs = tuple((t, modes[i % len(modes)]) for i, t in enumerate(texts))
    else:
        pairs = VALIDATION_PROMPTS
    if tts is not None and tts.model.tts_model_type != "base":  # no ICL: streaming or not, as the mode says
        pairs = tuple((t, "xvec_nonstream" if m.endswith("nonstream") else "xvec_stream") for t, m in pairs)
    return pairs


# ------------------------------------------------------------------ every graph the target places on the HTP
def _htp_talker(bundle, tcfg) -> bool:
    """Whether the bundle has static Talker graphs and the target runs the Talker on the HTP."""
    statics = [n for n, g in bundle.manifest.graphs.items() if g.variant == "static" and n.startswith("talker_")]
    return bool(statics) and (tcfg.on_htp("talker_prefill") or tcfg.on_htp("talker_decode"))


def judge_rows(bundle_dir: str | Path, target: str, seqs: list[dict], *, strict: bool = True,
               cp_frames: int | None = None) -> dict:
    """Each graph ``target`` places on the HTP against the bundle's fp32 CPU graphs, teacher-forced on ``seqs``
    (``reference_sequences`` or ``bundle_sequences``): the Talker's logits (cosine, argmax) and the Code
    Predictor's greedy codes and logits on each sequence's hidden states and CB0 (its first ``cp_frames`` frames;
    None: all). A graph on the CPU gets None for its metrics (not judged)."""
    bundle = Bundle.open(bundle_dir)
    tcfg = load_target(target)
    out: dict = {"talker_on_htp": _htp_talker(bundle, tcfg), "talker_rows": 0, "placement": {},
                 "talker_logits_cos_min": None, "talker_logits_cos_mean": None, "talker_argmax_match": None,
                 "fp16_max_abs_activation": None, "fp16_saturation_risk": [], "modes": []}
    if out["talker_on_htp"]:
        out.update(_judge_talker(bundle, bundle_dir, target, seqs, strict))
    plan = resolve_plan(bundle, target=tcfg, strict=False)
    out["cp_on_htp"] = plan.steps["code_predictor"].device == "htp"
    out.update(cp_rows=0, cp_codes_match=None, cp_argmax_match=None, cp_logits_cos_min=None,
               cp_logits_cos_mean=None)
    if out["cp_on_htp"]:
        out.update(_judge_code_predictor(bundle, bundle_dir, target, seqs, strict, cp_frames))
    return out


def _judge_talker(bundle, bundle_dir, target, seqs, strict) -> dict:
    ctx = max(s["prefill"].shape[0] + len(s["decodes"]) + 1 for s in seqs)
    cpu = resolve_plan(bundle, attention="plain").open_talker(max(ctx, 16))
    cpu_runs = [teacher_forced_talker(cpu, s["prefill"], s["decodes"]) for s in seqs]
    htp_runs, info = htp_talker_run(bundle_dir, target, seqs, strict=strict)
    per_mode, cos_all, match_all = [], [], []
    for (cl, ch), (hl, hh), s in zip(cpu_runs, htp_runs, seqs):
        c = cosine_rows(hl, cl)
        match = (hl.argmax(-1) == cl.argmax(-1))
        cos_all.append(c)
        match_all.append(match)
        per_mode.append({"mode": s.get("mode", "xvec_nonstream"), "text": s.get("text"),
                         "prompt_positions": int(s["prefill"].shape[0]), "frames": int(len(s["decodes"])),
                         "logits_cos_min": float(c.min()), "hidden_cos_min": float(cosine_rows(hh, ch).min()),
                         "argmax_match": float(match.mean()), "max_abs_cpu_logit": float(np.abs(cl).max())})
    return {"talker_logits_cos_min": float(np.concatenate(cos_all).min()),
            "talker_logits_cos_mean": float(np.concatenate(cos_all).mean()),
            "talker_argmax_match": float(np.concatenate(match_all).mean()),
            "talker_rows": int(sum(len(m) for m in match_all)), "modes": per_mode, "placement": info,
            **talker_fp16_headroom(bundle_dir, seqs)}


def _cp_inputs(seqs: list[dict], cp_frames: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The Code Predictor's inputs of ``seqs``: (hidden [N, H], CB0 [N]), each sequence's first ``cp_frames``."""
    hs, c0s = [], []
    for s in seqs:
        n = len(s["codes"]) if cp_frames is None else min(cp_frames, len(s["codes"]))
        hs.append(np.asarray(s["cp_hidden"][:n], np.float32))
        c0s.append(np.asarray(s["codes"])[:n, 0])
    return np.concatenate(hs).astype(np.float32), np.concatenate(c0s).astype(np.int64)


def _judge_code_predictor(bundle, bundle_dir, target, seqs, strict, cp_frames) -> dict:
    """Greedy codes of the HTP ``cp_frame`` (child process) against the fp32 CPU ``cp_frame``'s on the same hidden
    states and CB0, and the HTP's head logits against the fp32 ``cp_step``'s teacher-forced on the HTP's own codes
    (each head's logits then see the same earlier codes on both sides: one flip does not carry into the rows after
    it)."""
    h, c0 = _cp_inputs(seqs, cp_frames)
    if len(h) == 0:
        return {}
    cpu_codes = _cp_codes(bundle_dir, None, h, c0, strict=False)
    spec = {"job": "cp", "bundle": str(bundle_dir), "target": str(target), "strict": strict, "hidden": h, "c0": c0}
    res = run_worker("kztts.export.validate.htp", spec, None, "htp-code-predictor", timeout=3600)
    htp_codes, htp_logits = res["codes"], res["logits"]
    tables = EmbeddingTables.from_bundle(bundle)
    step = resolve_plan(bundle, cp_mode="step").open_code_predictor(tables)
    cpu_logits = np.stack([step.teacher_forced_logits(hk, int(ck), codes) for hk, ck, codes in zip(h, c0, htp_codes)])
    cos = cosine_rows(htp_logits.reshape(-1, htp_logits.shape[-1]), cpu_logits.reshape(-1, cpu_logits.shape[-1]))
    return {"cp_codes_match": float((htp_codes == cpu_codes).mean()),
            "cp_argmax_match": float((htp_logits.argmax(-1) == cpu_logits.argmax(-1)).mean()),
            "cp_logits_cos_min": float(cos.min()), "cp_logits_cos_mean": float(cos.mean()),
            "cp_rows": int(htp_codes.size), "cp_frames": int(len(h)), "cp_placement": res["info"]}


def _report(bundle_dir, target, tcfg, have, rows: dict, decoder_frames: int, strict: bool) -> dict:
    report = {"bundle": str(bundle_dir), "target": tcfg.name, "soc": tcfg.soc.name,
              "precision": (sorted(have)[0] if len(have) == 1 else sorted(have)) if have else None, **rows}
    report.update(htp_decoder_snr(bundle_dir, target, decoder_frames, strict=strict))
    report["frames"] = min((p["frames"] for p in report["modes"]), default=0)
    return report


def _static_precisions(bundle_dir, precision: str | None) -> set[str]:
    """The precisions of the bundle's graphs exported for a target (the decoder's is reported apart)."""
    graphs = Bundle.open(bundle_dir, load_graphs=False).manifest.graphs
    htp = {n: g for n, g in graphs.items() if g.extra.get("target")}
    if not htp:
        raise KzttsError(f"{bundle_dir}: no static HTP graphs; export with --target")
    have = {g.precision for n, g in htp.items() if n != "decoder_chunk"}
    if precision is not None and precision not in have:
        raise KzttsError(f"{bundle_dir}: the static graphs are {sorted(have)}, not {precision}; "
                         f"re-export with --precision {precision}")
    return have


# ------------------------------------------------------------------ kztts validate --target
def validate_target(bundle_dir: str | Path, reference_dir: str | Path, target: str | Path | None = None,
                    precision: str | None = None, frames: int = 16, *, strict: bool = True, texts=None,
                    language: str = "English", cp_frames: int | None = CP_FRAMES, decoder_frames: int = 10,
                    tts=None) -> dict:
    """Every graph the target places on the HTP (each in a child process) against the bundle's fp32 CPU graphs,
    teacher-forced on qwen-tts's own prompts, greedy codes and Talker hidden states, over ``VALIDATION_PROMPTS``
    (or the user's ``texts``; never a calibration prompt): the Talker's logits, the Code Predictor's codes and
    logits (``cp_frames`` frames per prompt), the decoder's SNR (seeded random codes, ``decoder_frames``).

    Keys: ``target``, ``precision``; ``talker_logits_cos_min`` / ``_mean`` and ``talker_argmax_match`` (greedy
    CB0 agreement) over ``talker_rows``; ``cp_codes_match`` (greedy CB1..15 agreement), ``cp_argmax_match`` and
    ``cp_logits_cos_min`` / ``_mean`` (each head's logits, both sides fed the HTP's codes) over ``cp_rows``;
    ``decoder_snr_db`` (``kztts.export.validate.decoder``); each None when its graph is on the CPU. ``modes``,
    ``placement``, ``fp16_max_abs_activation`` and ``fp16_saturation_risk`` (Talker tensors whose fp32 magnitude
    comes within 2x of the fp16 limit on these prompts: silent saturation on the HTP)."""
    bundle = Bundle.open(bundle_dir, load_graphs=False)
    tname = str(target) if target is not None else bundle_target(bundle)
    tcfg = load_target(tname)
    have = _static_precisions(bundle_dir, precision)
    seqs: list[dict] = []
    if _htp_talker(bundle, tcfg) or resolve_plan(bundle, target=tcfg).steps["code_predictor"].device == "htp":
        if tts is None:  # tests pass a loaded one
            phase("validate: loading the qwen-tts reference from %s", reference_dir)
            tts = load_reference(Path(reference_dir))
        seqs = reference_sequences(bundle, tts, validation_prompts(tts, texts), frames, language)
    rows = judge_rows(bundle_dir, tname, seqs, strict=strict, cp_frames=cp_frames)
    report = _report(bundle_dir, tname, tcfg, have, rows, min(frames, decoder_frames), strict)
    report["reference"] = str(reference_dir)
    report["texts"] = [s["text"] for s in seqs]  # none when only the decoder is on the HTP (random codes)
    return report


def check_htp_graphs(bundle_dir: str | Path, target: str | Path | None = None, *, texts=VALIDATION_TEXTS,
                     frames: int = 16, cp_frames: int | None = CP_FRAMES, decoder_frames: int = 10,
                     strict: bool = True) -> dict:
    """``validate_target`` without qwen-tts (an export can run it): every graph ``target`` places on the HTP
    against the bundle's own fp32 CPU graphs, teacher-forced on the bundle's own greedy frames of ``texts``
    (x-vector non-streaming, the fixed speaker vector of ``bundle_sequences``). The same keys, to be judged
    with the same bounds (``kztts.eval.acceptance``: ``htp_bounds(report)``)."""
    bundle = Bundle.open(bundle_dir, load_graphs=False)
    tname = str(target) if target is not None else bundle_target(bundle)
    tcfg = load_target(tname)
    have = _static_precisions(bundle_dir, None)
    seqs = bundle_sequences(bundle_dir, texts=texts, frames=frames, context=4096)
    for s, text in zip(seqs, texts):
        s.update(text=text, mode="xvec_nonstream")
    rows = judge_rows(bundle_dir, tname, seqs, strict=strict, cp_frames=cp_frames)
    return _report(bundle_dir, tname, tcfg, have, rows, min(frames, decoder_frames), strict)


def _cp_codes_match(bundle_dir, target, bundle, cpu_runs, seqs, strict) -> float | None:
    """Greedy Code Predictor codes with cp_frame on the HTP (child process) vs the CPU, on the
    CPU Talker's hiddens and the given CB0 codes (``kztts validate --placement``)."""
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


def head_logits_graph(src: str | Path, out: str | Path, cp_hidden: int, vocab: int) -> list[str]:
    """Write ``src`` (a ``cp_frame`` graph, float or QDQ) to ``out`` with each Code Predictor head's logits as an
    extra output (after its output's Q/DQ pair in a QDQ graph: the values the HTP hands on); returns their names in
    head order. The heads are the MatMul/Gemm nodes whose weight is [cp_hidden, vocab] (or its transpose)."""
    import onnx

    model = onnx.load(str(src))
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)

    def weight_dims(name: str):
        for _ in range(4):  # through DequantizeLinear / Transpose / Cast to an initializer or a Constant
            if name in inits:
                return tuple(inits[name].dims)
            node = producer.get(name)
            if node is None:
                return None
            if node.op_type == "Constant":
                return next((tuple(a.t.dims) for a in node.attribute if a.name == "value"), None)
            if not node.input:
                return None
            name = node.input[0]
        return None

    names = []
    for n in g.node:  # the graph's nodes are in topological order: head 0 first
        if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1 and weight_dims(n.input[1]) in (
                (cp_hidden, vocab), (vocab, cp_hidden)):
            out_name = n.output[0]
            q = [c for c in consumers.get(out_name, []) if c.op_type == "QuantizeLinear"]
            if q:
                dq = [c for c in consumers.get(q[0].output[0], []) if c.op_type == "DequantizeLinear"]
                if dq:
                    out_name = dq[0].output[0]
            names.append(out_name)
    have = {o.name for o in g.output}
    for name in names:
        if name not in have:
            g.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    onnx.save_model(model, str(out))
    return names


def _cp_worker(spec: dict) -> dict:
    """The HTP's greedy codes and head logits: the target's ``cp_frame`` graph with its heads as outputs."""
    import tempfile

    from kztts.htp.qnn import create_session, graph_files

    bundle = Bundle.open(spec["bundle"], load_graphs=False)
    tcfg = load_target(spec["target"])
    plan = resolve_plan(bundle, target=tcfg, strict=spec["strict"], attention="plain")
    graph = plan.steps["code_predictor"].graphs[0]
    _, src = graph_files(bundle, graph)  # the source graph (a context binary cannot take extra outputs)
    m = bundle.manifest
    tables = EmbeddingTables.from_bundle(bundle)
    groups = int(m.code_predictor["num_code_groups"]) - 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cp_frame_heads.onnx"
        heads = head_logits_graph(src, path, int(m.code_predictor["hidden"]), int(m.code_predictor["vocab"]))
        if len(heads) != groups:
            raise KzttsError(f"{src}: found {len(heads)} Code Predictor heads, expected {groups}")
        sess = create_session(path, tcfg, strict=spec["strict"], config=bundle.session_config)
        codes, logits = [], []
        for h, c0 in zip(spec["hidden"], spec["c0"]):
            feed = {"hidden": np.asarray(h, np.float32)[None],
                    "c0_embed": np.asarray(tables.codec([int(c0)]), np.float32).reshape(1, -1),
                    "temperature": np.zeros(1, np.float32), "top_k": np.ones(1, np.int64),
                    "top_p": np.ones(1, np.float32), "repetition_penalty": np.ones(1, np.float32),
                    "uniforms": np.full(groups, 0.5, np.float32)}
            out = sess.run(["codes"] + heads, feed)
            codes.append(np.asarray(out[0], np.int64).reshape(-1))
            logits.append(np.stack([np.asarray(x, np.float32).reshape(-1) for x in out[1:]]))
        pl = Placement.of(sess)
        info = {"graph": graph, "qnn_nodes": pl.qnn_nodes, "cpu_nodes": pl.cpu_nodes, "cpu_op_types": pl.cpu_op_types,
                "precision": session_precision(m.graphs[graph].precision, sess)}
    return {"codes": np.stack(codes), "logits": np.stack(logits), "info": info}


def main(argv: list[str] | None = None) -> int:
    """The HTP side's child process (``kztts.core.worker_process``): ``job`` talker or cp."""
    return worker_main(lambda spec: {"talker": _talker_worker, "cp": _cp_worker}[spec["job"]](spec), argv)


if __name__ == "__main__":
    sys.exit(main())
