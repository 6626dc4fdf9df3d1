"""``kztts validate --placement``: a layer placement checked against the CPU fp32 Talker.

Nothing about a placement is assumed: the Talker runs teacher-forced on qwen-tts's own
prompts and greedy codes with the placement (HTP parts in a child process, since fp16
leaks across QNN sessions of one process, see ``validate_htp``) and with everything
on the CPU in fp32, and the report gives the metrics of ``kztts validate --target``
(logits cosine, greedy CB0 agreement), the cosine of every segment's output against
the same point of the fp32 run, free-running greedy codes (Code Predictor on the CPU, so
the Talker placement alone decides) against the all-CPU codes, and, when the target puts
``cp_frame`` on the HTP, the Code Predictor's greedy codes there.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

from kztts.bundle.bundle import Bundle
from kztts.bundle.segments import segment_graph_name
from kztts.core.audio import synthetic_voice
from kztts.core.metrics import cosine_rows
from kztts.core.worker_process import run_worker, worker_main
from kztts.eval.replay import greedy_cb0
from kztts.export.common.checkpoint import load_reference
from kztts.export.validate.htp import (
    _cp_codes_match,
    reference_sequences,
    replay_sequences,
    sequences_spec,
    spec_sequences,
    talker_fp16_headroom,
)
from kztts.htp.placement import builtin, write_placement
from kztts.htp.qnn import Placement, bundle_target
from kztts.plan.resolve import resolve_placement, resolve_plan
from kztts.tts.tts import TTS

GREEDY_TEXTS = ("Hello world, this is a tiny test.", "The quick brown fox jumps over the lazy dog.")


def _recorder(talker) -> dict:
    """Collect every layer-segment graph's valid hidden rows, keyed ``phase/unit``."""
    rec: dict[str, list[np.ndarray]] = {}
    if hasattr(talker, "on_unit"):
        talker.on_unit = lambda phase, unit, out: rec.setdefault(f"{phase}/{unit}", []).append(
            np.array(out["hidden"], np.float32))
    return rec


def _greedy_codes(bundle, talker, frames: int, texts: tuple[str, ...] = GREEDY_TEXTS) -> np.ndarray:
    """Greedy codes of ``texts`` (x-vector voice from the synthetic recording) with ``talker``
    and the bundle's CPU Code Predictor: [len(texts), frames, 16]."""
    tts = TTS(bundle, talker=talker)
    voice = tts.voice_from_wav(synthetic_voice(), 24000)
    out = []
    for text in texts:
        codes = tts.generate_codes(text, voice, language="english", greedy=True, max_frames=frames)
        out.append(np.pad(codes, ((0, frames - len(codes)), (0, 0)), constant_values=-1))
    return np.stack(out)


def _run_side(bundle_dir: str, placement, target, strict: bool, seqs: list[dict], greedy_frames: int,
              layer_graphs: bool = False, greedy_texts: int = len(GREEDY_TEXTS)) -> dict:
    """Teacher-forced replays, per-unit hiddens and greedy codes with ``placement`` (on the runner
    the runtime would pick, or on the layer graphs whatever the placement with ``layer_graphs``)."""
    bundle = Bundle.open(bundle_dir, load_graphs=False)  # only the graphs this run needs
    talker = resolve_plan(bundle, target=target, placement=placement, strict=strict,
                          segments=layer_graphs).open_talker()
    rec = _recorder(talker)
    arrays: dict = replay_sequences(talker, seqs)
    for key, rows in rec.items():
        arrays[f"unit:{key}"] = np.concatenate(rows)
    info = {"runner": type(talker).__name__}
    if hasattr(talker, "seconds"):  # of the teacher-forced replays only
        info["seconds"], info["steps"] = dict(talker.seconds), dict(talker.steps)
    if greedy_frames:
        arrays["greedy_codes"] = _greedy_codes(bundle, talker, greedy_frames, GREEDY_TEXTS[:greedy_texts])
    # a prefill-only static Talker (target talker_graphs: prefill-only) has no decode session: its
    # decode steps run through the prefill graph
    sessions = getattr(talker, "sessions", None) or {
        n: getattr(talker, a) for n, a in (("talker_prefill", "prefill_session"), ("talker_decode", "decode_session"))
        if getattr(talker, a, None) is not None}
    if sessions:
        info["graphs"] = {n: {"qnn_nodes": Placement.of(s).qnn_nodes, "cpu_nodes": Placement.of(s).cpu_nodes}
                          for n, s in sessions.items()}
    arrays["info"] = info
    return arrays


def _worker(spec: dict) -> dict:
    return _run_side(spec["bundle"], spec["placement"], spec["target"], spec["strict"], spec_sequences(spec),
                     spec["greedy_frames"], spec["layer_graphs"], spec["greedy_texts"])


def _child_run(bundle_dir, placement_arg: str, target, strict: bool, seqs, greedy_frames: int,
               layer_graphs: bool = False, greedy_texts: int = len(GREEDY_TEXTS), timeout: float = 3 * 3600) -> dict:
    """``_run_side`` in a child process (HTP fp16 is per process)."""
    spec = {"bundle": str(bundle_dir), "placement": placement_arg, "target": str(target) if target else None,
            "strict": strict, "greedy_frames": greedy_frames, "layer_graphs": layer_graphs,
            "greedy_texts": greedy_texts, **sequences_spec(seqs)}
    return run_worker("kztts.export.validate.placement", spec, None, "placement", timeout=timeout)


def _per_mode(ref: dict, got: dict, modes: tuple[str, ...], seqs: list[dict], eos: int):
    """Per prompt mode: the placement's Talker logits and hidden against fp32's, and whether greedy
    CB0 (a codec id or EOS) picks the same; with the cosines and matches of every step."""
    def cb0(logits: np.ndarray) -> np.ndarray:
        return np.array([greedy_cb0(row, eos, allow_eos=True) for row in logits])

    per_mode, cos_all, match_all = [], [], []
    for i, (name, s) in enumerate(zip(modes, seqs)):
        cl, hl = ref[f"logits_{i}"], got[f"logits_{i}"]
        c = cosine_rows(hl, cl)
        match = cb0(hl) == cb0(cl)
        cos_all.append(c)
        match_all.append(match)
        per_mode.append({"mode": name, "prompt_positions": int(s["prefill"].shape[0]), "frames": int(len(s["decodes"])),
                         "logits_cos_min": float(c.min()),
                         "hidden_cos_min": float(cosine_rows(got[f"hidden_{i}"], ref[f"hidden_{i}"]).min()),
                         "argmax_match": float(match.mean())})
    return per_mode, cos_all, match_all


def _per_segment(ref: dict, got: dict, placement, n_seqs: int) -> list[dict]:
    """Per placement segment: its phase, device, layers and the cosine of its output hidden to fp32's
    (for a runner without segment outputs, the phase's final hidden at the head)."""
    segments = []
    for ph in ("prefill", "decode"):
        for seg in placement.segments(ph):
            end = "head" if seg.head else seg.stop - 1
            key = f"unit:{ph}/{end}"
            entry = {"phase": ph, "device": seg.device, "layers": seg.label}
            if key in got and key in ref:
                entry["hidden_cos_min"] = float(cosine_rows(got[key], ref[key]).min())
            elif seg.head:
                rows = [(got[f"hidden_{i}"], ref[f"hidden_{i}"]) for i in range(n_seqs)]
                pick = (lambda a: a[:1]) if ph == "prefill" else (lambda a: a[1:])
                a = np.concatenate([pick(g) for g, _ in rows])
                b = np.concatenate([pick(r) for _, r in rows])
                entry["hidden_cos_min"] = float(cosine_rows(a, b).min()) if len(a) else None
            segments.append(entry)
    return segments


def validate_placement(bundle_dir: str | Path, reference_dir: str | Path, placement, target=None, *,
                       frames: int = 16, greedy_frames: int | None = None, strict: bool = True,
                       modes: tuple[str, ...] = ("xvec_nonstream", "icl_stream"), language: str = "English",
                       tts=None, layer_graphs: bool = False, headroom: bool = True,
                       greedy_texts: int = len(GREEDY_TEXTS), seqs: list[dict] | None = None,
                       fp32_cache: dict | None = None) -> dict:
    """The placement's Talker vs the all-CPU fp32 Talker (module docstring).

    ``placement``: a mode, a placement file or a LayerPlacement. Keys: ``placement`` (mode,
    segments), ``talker_logits_cos_min``/``_mean``, ``talker_argmax_match``, ``segments`` (per
    segment: phase, device, layers, ``hidden_cos_min`` against fp32 at its output),
    ``greedy_codes_match`` and ``greedy_frames_equal`` (leading frames identical, per text),
    ``cpu_layer_fraction`` per phase, ``modes`` (per prompt mode). ``layer_graphs``: run the
    placement on the layer segments whatever it is (benchmarks: the same graphs for every
    placement, and per-device timings in ``seconds``/``steps``). As ``kztts validate --target``:
    ``cp_codes_match`` when the target puts ``cp_frame`` on the HTP, and with ``headroom`` the
    fp16 headroom of the fp32 Talker on these prompts. Benchmarks comparing several placements
    pass ``seqs`` (from ``reference_sequences``) and one ``fp32_cache`` dict, so the reference
    model and the fp32 run are not repeated."""
    bundle = Bundle.open(bundle_dir, load_graphs=False)
    m = bundle.manifest
    L = int(m.talker["num_layers"])
    placement = resolve_placement(placement, L)
    greedy_frames = frames if greedy_frames is None else greedy_frames
    target = str(target) if target is not None else bundle_target(bundle)
    if seqs is None:
        tts = tts if tts is not None else load_reference(Path(reference_dir))
        seqs = reference_sequences(bundle, tts, modes, frames, language)
    segmented = segment_graph_name("prefill", 0) in m.graphs
    with tempfile.TemporaryDirectory(prefix="kztts-place-") as tmp:
        pfile = write_placement(placement, Path(tmp) / "placement.json")
        # fp32: the layer graphs on the CPU when the bundle has them (segment outputs to compare)
        key = (str(bundle_dir), greedy_frames, greedy_texts, tuple(s["prefill"].tobytes().__hash__() for s in seqs))
        ref = (fp32_cache or {}).get(key)
        if ref is None:
            ref = _run_side(str(bundle_dir), builtin("all-cpu", L), None, False, seqs, greedy_frames,
                            layer_graphs=segmented, greedy_texts=greedy_texts)
            if fp32_cache is not None:
                fp32_cache[key] = ref
        got = _child_run(bundle_dir, str(pfile), target, strict, seqs, greedy_frames, layer_graphs, greedy_texts)

    per_mode, cos_all, match_all = _per_mode(ref, got, modes, seqs, int(m.special_ids["codec_eos"]))
    segments = _per_segment(ref, got, placement, len(seqs))
    report = {
        "bundle": str(bundle_dir), "reference": str(reference_dir), "target": target,
        "placement": {"mode": placement.mode, "source": placement.source, "describe": placement.describe(),
                      **placement.to_json()},
        "runner": got["info"]["runner"],
        "talker_logits_cos_min": float(np.concatenate(cos_all).min()),
        "talker_logits_cos_mean": float(np.concatenate(cos_all).mean()),
        "talker_argmax_match": float(np.concatenate(match_all).mean()),
        "cp_codes_match": None,
        "segments": segments,
        "cpu_layer_fraction": {ph: len(placement.cpu_layers(ph)) / L for ph in ("prefill", "decode")},
        "frames": min(p["frames"] for p in per_mode), "modes": per_mode,
        "graphs": got["info"].get("graphs", {}),
        "seconds": got["info"].get("seconds"), "steps": got["info"].get("steps"),
    }

    if resolve_plan(bundle, target=target).steps["code_predictor"].device == "htp":
        fp32_runs = [(ref[f"logits_{i}"], ref[f"hidden_{i}"]) for i in range(len(seqs))]
        report["cp_codes_match"] = _cp_codes_match(bundle_dir, target, bundle, fp32_runs, seqs, strict)
    if headroom:
        report.update(talker_fp16_headroom(bundle_dir, seqs))
    if greedy_frames:
        a, b = got["greedy_codes"], ref["greedy_codes"]
        same = (a == b).all(axis=2)
        report["greedy_codes_match"] = float((a == b).mean())
        report["greedy_frames_equal"] = [int(np.argmin(r)) if not r.all() else int(len(r)) for r in same]
        report["greedy_frames"] = int(greedy_frames)
    return report


def main(argv: list[str] | None = None) -> int:
    """The placement side's child process (``kztts.core.worker_process``)."""
    return worker_main(_worker, argv)


if __name__ == "__main__":
    sys.exit(main())
