"""The brief HTP check of a quantized export (``kztts export --target T`` at w8a16/w4a16, ``--decoder w8a16``).

Where the QNN execution provider is present, each quantized graph the target places on the HTP is run on the
simulator (a child process, as ``kztts validate --target`` does) against the bundle's own CPU fp32 graphs, on
texts that no calibration prompt holds (:data:`CHECK_TEXTS`), and judged by the bounds of ``kztts validate
--target`` (``kztts.eval.acceptance.BOUNDS``: the Talker's table ``htp_precision(p).bounds``, the decoder's
``decoder_bounds``):

- the Talker, teacher-forced on :data:`CHECK_FRAMES` greedy frames per text: logits cosine and argmax agreement;
- the Code Predictor (``cp_frame`` on the HTP): greedy codes against the CPU's on the CPU Talker's hidden states
  (judged when the bound table has ``cp_codes_match``, recorded either way);
- the speech decoder (``decoder_chunk`` on the HTP): SNR of seeded random codes against the fp32 CPU decoder.

A graph below its bound refuses the export (:class:`HtpCheckFailed`, one line): the bundle is staged, so nothing is
written. Otherwise the manifest's ``htp_check`` records "validated" with the figures and bounds; without the QNN
execution provider, or when the caller skipped the check, it records "unvalidated" with the reason, and ``synth``
and ``serve`` warn once when they run such a bundle's HTP graphs (``kztts.plan.resolve.warn_unvalidated``).
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from kztts.bundle import graphs as G
from kztts.bundle.bundle import Bundle
from kztts.bundle.manifest import HTP_UNVALIDATED, HTP_VALIDATED
from kztts.core.errors import KzttsError
from kztts.core.metrics import cosine_rows
from kztts.core.progress import phase
from kztts.eval.acceptance import BOUNDS, within
from kztts.eval.replay import teacher_forced_talker
from kztts.htp.qnn import qnn_available, qnn_unavailable_reason
from kztts.htp.targets import Target, load_target
from kztts.plan.resolve import resolve_plan

log = logging.getLogger(__name__)

# Not among the calibration prompts (kztts.export.tts.prompt_calibration.CALIBRATION_PROMPTS, a test asserts it).
CHECK_TEXTS = ("Seven green boxes arrived at the station on a rainy Tuesday morning.",
               "Please close the window quietly; the baby is finally asleep.")
CHECK_FRAMES = 8  # teacher-forced Talker frames per text: 2 x (8 + 1) argmax rows
DECODER_FRAMES = 10
TALKER_STEPS = ("talker_prefill", "talker_decode")


class HtpCheckFailed(KzttsError):
    """A quantized HTP graph of an export fell below its bound on the simulator."""


def quantized_htp_steps(bundle_dir: str | Path, target: str | Path | Target) -> dict[str, str]:
    """{plan role: precision} of the quantized graphs ``target`` places on the HTP (empty: nothing to check)."""
    bundle = Bundle.open(bundle_dir, load_graphs=False)
    plan = resolve_plan(bundle, target=target)
    return _quantized_steps(bundle, plan)


def _quantized_steps(bundle, plan) -> dict[str, str]:
    out = {}
    for role, step in plan.steps.items():
        if step.device != "htp":
            continue
        found = [bundle.manifest.graphs[g].precision for g in step.graphs if g in bundle.manifest.graphs]
        quantized = [p for p in found if (e := G.HTP_PRECISION_ENTRIES.get(p)) is not None and e.quantized]
        if quantized:
            out[role] = G.least_precise(quantized)
    return out


def unvalidated(reason: str) -> dict:
    """The manifest's ``htp_check`` when no simulator run judged the quantized HTP graphs."""
    return {"status": HTP_UNVALIDATED, "reason": reason}


def _talker_and_cp(bundle_dir: Path, target: str, roles: dict[str, str], figures: dict, bounds: dict) -> None:
    from kztts.export.validate.htp import _cp_codes_match, bundle_sequences, htp_talker_run

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


def check_bundle(bundle_dir: str | Path, target: str | Path | Target) -> dict:
    """Judge the quantized HTP graphs of the bundle at ``bundle_dir`` on the simulator (module docstring); the
    manifest's ``htp_check`` record ("validated") or :class:`HtpCheckFailed` naming the graph, figure and bound.
    Needs the QNN execution provider (:func:`kztts.htp.qnn.qnn_available`)."""
    from kztts.export.validate.decoder import htp_decoder_snr

    bundle_dir = Path(bundle_dir)
    tcfg = load_target(target)
    tname = str(target) if not isinstance(target, Target) else tcfg.name
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
    failed = [k for k, b in bounds.items() if figures.get(k) is None or not within(figures[k], b)]
    if failed:
        what = "; ".join(f"{k} {figures.get(k)!s:.8} (needs {bounds[k][0]} {bounds[k][1]:g})" for k in failed)
        raise HtpCheckFailed(
            f"refusing the export: on the HTP simulator ({tcfg.name}) the quantized graphs fall below their bounds: "
            f"{what}; export another precision (e.g. fp16 for that graph) or check it with `kztts validate --target`")
    log.info("HTP check passed: %s", ", ".join(f"{k} {v:.4g}" for k, v in figures.items() if v is not None))
    return {"status": HTP_VALIDATED, "target": tcfg.name, "precisions": roles, "texts": list(CHECK_TEXTS),
            "frames": CHECK_FRAMES, "decoder_frames": DECODER_FRAMES, "figures": figures,
            "bounds": {k: list(b) for k, b in bounds.items()}}


def htp_check_record(bundle_dir: str | Path, target: str | Path | Target, *, check: bool) -> dict | None:
    """The manifest's ``htp_check`` for a bundle exported for ``target``: None without quantized HTP graphs;
    :func:`check_bundle`'s record when ``check`` and the QNN execution provider is present (raising
    :class:`HtpCheckFailed` below a bound); else "unvalidated" with the reason."""
    if not quantized_htp_steps(bundle_dir, target):
        return None
    if not check:
        return unvalidated("the export skipped the HTP check")
    if not qnn_available():
        reason = f"no QNN execution provider where it was exported ({qnn_unavailable_reason()})"
        log.warning("the quantized HTP graphs are not checked: %s; the manifest says unvalidated "
                    "(check them with `kztts validate --target` where onnxruntime-qnn runs)", reason)
        return unvalidated(reason)
    return check_bundle(bundle_dir, target)


__all__ = ["CHECK_FRAMES", "CHECK_TEXTS", "DECODER_FRAMES", "HtpCheckFailed", "check_bundle", "htp_check_record",
           "quantized_htp_steps", "unvalidated"]
