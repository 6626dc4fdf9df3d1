"""The judging of a quantized export's HTP graphs on the simulator (``kztts.export.htp.export_check`` says what and
records it): the Talker teacher-forced on texts no calibration prompt holds, the Code Predictor's greedy codes, the
decoder's SNR, each against the bundle's own CPU fp32 graphs and by ``kztts validate --target``'s bounds; an LM
bundle's static graphs by ``kztts validate --target``'s LM rows (``check_lm_bundle``); below a bound,
``HtpCheckFailed`` (one line) refuses the export."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from kztts.bundle import graphs as G
from kztts.bundle.bundle import Bundle
from kztts.bundle.manifest import HTP_VALIDATED, read_manifest
from kztts.core.metrics import cosine_rows
from kztts.core.progress import phase
from kztts.eval.acceptance import BOUNDS, within
from kztts.eval.replay import teacher_forced_talker
from kztts.export.htp.export_check import (
    CHECK_FRAMES,
    CHECK_TEXTS,
    DECODER_FRAMES,
    TALKER_STEPS,
    LM_CHECK_STEPS,
    HtpCheckFailed,
    quantized_htp_steps,
)
from kztts.export.validate.decoder import htp_decoder_snr
from kztts.export.validate.htp import _cp_codes_match, bundle_sequences, htp_talker_run
from kztts.export.validate.lm import validate_lm_placement
from kztts.htp.targets import Target, load_target
from kztts.plan.resolve import resolve_plan

log = logging.getLogger(__name__)


def _talker_and_cp(bundle_dir: Path, target: str, roles: dict[str, str], figures: dict, bounds: dict) -> None:
    bundle = Bundle.open(bundle_dir, load_graphs=False)
    seqs = bundle_sequences(bundle_dir, texts=CHECK_TEXTS, frames=CHECK_FRAMES)
    ctx = max(s["prefill"].shape[0] + len(s["decodes"]) + 1 for s in seqs)
    cpu = resolve_plan(bundle, attention="plain").open_talker(max(ctx, 16))
    cpu_runs = [teacher_forced_talker(cpu, s["prefill"], s["decodes"]) for s in seqs]
    table = BOUNDS[G.htp_precision(G.least_precise(roles.values())).bounds]
    if any(r in roles for r in TALKER_STEPS):
        htp_runs, _ = htp_talker_run(bundle_dir, target, seqs, strict=True)
        cos = np.concatenate([cosine_rows(h, c) for (h, _), (c, _) in zip(htp_runs, cpu_runs)])
        match = np.concatenate([h.argmax(-1) == c.argmax(-1) for (h, _), (c, _) in zip(htp_runs, cpu_runs)])
        figures.update(talker_logits_cos_min=float(cos.min()), talker_argmax_match=float(match.mean()),
                       talker_rows=int(len(match)))
        bounds.update({k: table[k] for k in ("talker_logits_cos_min", "talker_argmax_match") if k in table})
    if "code_predictor" in roles:
        figures["cp_codes_match"] = _cp_codes_match(bundle_dir, target, bundle, cpu_runs, seqs, True)
        if "cp_codes_match" in table:
            bounds["cp_codes_match"] = table["cp_codes_match"]


def _judge(target_name: str, figures: dict, bounds: dict) -> None:
    failed = [k for k, b in bounds.items() if figures.get(k) is None or not within(figures[k], b)]
    if failed:
        what = "; ".join(f"{k} {figures.get(k)!s:.8} (needs {bounds[k][0]} {bounds[k][1]:g})" for k in failed)
        raise HtpCheckFailed(
            f"refusing the export: on the HTP simulator ({target_name}) the quantized graphs fall below their bounds: "
            f"{what}; export another precision (e.g. fp16 for that graph) or check it with `kztts validate --target`")


def check_lm_bundle(bundle_dir: str | Path, target: str | Path | Target) -> dict:
    """Judge an LM bundle's quantized static graphs on the simulator: ``kztts validate --target``'s rows
    (``kztts.export.validate.lm.validate_lm_placement``, strict, the target's placement) over
    :data:`LM_CHECK_STEPS` greedy tokens per accuracy text, against the bundle's own fp32 CPU graphs, by the
    precision's ``lm_bounds``; the manifest's record ("validated") or :class:`HtpCheckFailed`."""
    bundle_dir = Path(bundle_dir)
    tcfg = load_target(target)
    tname = str(target) if not isinstance(target, Target) else str(tcfg.path)
    static = {g.precision for g in read_manifest(bundle_dir).graphs.values() if g.variant == "static"}
    quantized = [p for p in static if (e := G.HTP_PRECISION_ENTRIES.get(p)) is not None and e.quantized]
    precision = G.least_precise(quantized)
    phase("checking the LM's %s static graphs on the simulator for %s", precision, tcfg.name)
    report = validate_lm_placement(bundle_dir, target=tname, placement=None, steps=LM_CHECK_STEPS, strict=True)
    table = BOUNDS[G.htp_precision(precision).lm_bounds]
    figures = {k: float(report[k]) for k in table}
    bounds = dict(table)
    _judge(tcfg.name, figures, bounds)
    log.info("HTP check passed: %s", ", ".join(f"{k} {v:.4g}" for k, v in figures.items()))
    return {"status": HTP_VALIDATED, "target": tcfg.name, "precisions": {"talker": precision},
            "texts": "kztts.eval.lm_accuracy.SAMPLES", "steps": LM_CHECK_STEPS, "tokens": report["tokens"],
            "figures": figures, "bounds": {k: list(b) for k, b in bounds.items()}}


def check_bundle(bundle_dir: str | Path, target: str | Path | Target) -> dict:
    """Judge the quantized HTP graphs of the bundle at ``bundle_dir`` on the simulator (module docstring); the
    manifest's ``htp_check`` record ("validated") or :class:`HtpCheckFailed` naming the graph, figure and bound.
    Needs the QNN execution provider (:func:`kztts.htp.qnn.qnn_available`)."""
    bundle_dir = Path(bundle_dir)
    tcfg = load_target(target)
    tname = str(tcfg.path)  # the worker processes read the target from its file
    roles = quantized_htp_steps(bundle_dir, tcfg)
    figures: dict = {}
    bounds: dict = {}
    phase("checking the quantized HTP graphs (%s) on the simulator for %s",
          ", ".join(f"{r} {p}" for r, p in roles.items()), tcfg.name)
    talker_roles = {r: p for r, p in roles.items() if r in TALKER_STEPS or r == "code_predictor"}
    if talker_roles:
        _talker_and_cp(bundle_dir, tname, talker_roles, figures, bounds)
    if "decoder" in roles:
        res = htp_decoder_snr(bundle_dir, tname, frames=DECODER_FRAMES, strict=True)
        figures["decoder_snr_db"] = res["decoder_snr_db"]
        bounds["decoder_snr_db"] = BOUNDS[G.htp_precision(roles["decoder"]).decoder_bounds]["decoder_snr_db"]
    _judge(tcfg.name, figures, bounds)
    log.info("HTP check passed: %s", ", ".join(f"{k} {v:.4g}" for k, v in figures.items() if v is not None))
    return {"status": HTP_VALIDATED, "target": tcfg.name, "precisions": roles, "texts": list(CHECK_TEXTS),
            "frames": CHECK_FRAMES, "decoder_frames": DECODER_FRAMES, "figures": figures,
            "bounds": {k: list(b) for k, b in bounds.items()}}
