"""The brief HTP check of a quantized export (``kztts export --target T`` at w8a16/w4a16, ``--decoder w8a16``): what
it checks, and the manifest's record of it (``htp_check_record``); the judging itself is
``kztts.export.validate.htp_check.check_bundle``, which ``kztts export`` hands the bundle writer.

Where the QNN execution provider is present, each quantized graph the target places on the HTP is run on the
simulator (a child process, as ``kztts validate --target`` does) against the bundle's own CPU fp32 graphs, on
texts that no calibration prompt holds (:data:`CHECK_TEXTS`), and judged by the bounds of ``kztts validate
--target`` (``kztts.eval.acceptance.BOUNDS``: the Talker's table ``htp_precision(p).bounds``, the decoder's
``decoder_bounds``):

- the Talker, teacher-forced on :data:`CHECK_FRAMES` greedy frames per text: logits cosine and argmax agreement;
- the Code Predictor (``cp_frame`` on the HTP): greedy codes against the CPU's on the CPU Talker's hidden states
  (judged when the bound table has ``cp_codes_match``, recorded either way);
- the speech decoder (``decoder_chunk`` on the HTP): SNR of seeded random codes against the fp32 CPU decoder;
- an LM bundle's quantized static graphs (``lm_htp_check_record``): ``kztts validate --target``'s LM rows over
  :data:`LM_CHECK_STEPS` greedy tokens of its accuracy texts (``kztts.eval.lm_accuracy.SAMPLES``, disjoint from
  the LM calibration texts), judged by the precision's ``lm_bounds``.

A graph below its bound refuses the export (:class:`HtpCheckFailed`, one line): the bundle is staged, so nothing is
written. Otherwise the manifest's ``htp_check`` records "validated" with the figures and bounds; without the QNN
execution provider, or when the caller skipped the check, it records "unvalidated" with the reason, and ``synth``
and ``serve`` warn once when they run such a bundle's HTP graphs (``kztts.plan.resolve.warn_unvalidated``).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from kztts.bundle import graphs as G
from kztts.bundle.bundle import Bundle
from kztts.bundle.manifest import HTP_UNVALIDATED, read_manifest
from kztts.core.errors import KzttsError
from kztts.htp.qnn import qnn_available, qnn_unavailable_reason
from kztts.htp.targets import Target
from kztts.plan.resolve import resolve_plan

log = logging.getLogger(__name__)

# Not among the calibration prompts (kztts.export.tts.prompt_calibration.CALIBRATION_PROMPTS, a test asserts it).
CHECK_TEXTS = ("Seven green boxes arrived at the station on a rainy Tuesday morning.",
               "Please close the window quietly; the baby is finally asleep.")
CHECK_FRAMES = 8  # teacher-forced Talker frames per text: 2 x (8 + 1) argmax rows
DECODER_FRAMES = 10
TALKER_STEPS = ("talker_prefill", "talker_decode")
LM_CHECK_STEPS = 8  # greedy tokens per accuracy text, each teacher-forced: ~7 texts x (prompt + 8) positions


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


def _checked(bundle_dir: str | Path, target: str | Path | Target, check: Callable | None) -> dict:
    if check is None:
        return unvalidated("the export skipped the HTP check")
    if not qnn_available():
        reason = f"no QNN execution provider where it was exported ({qnn_unavailable_reason()})"
        log.warning("the quantized HTP graphs are not checked: %s; the manifest says unvalidated "
                    "(check them with `kztts validate --target` where onnxruntime-qnn runs)", reason)
        return unvalidated(reason)
    return check(Path(bundle_dir), target)


def htp_check_record(bundle_dir: str | Path, target: str | Path | Target, *,
                     check: Callable[[Path, str | Path | Target], dict] | None) -> dict | None:
    """The manifest's ``htp_check`` for a bundle exported for ``target``: None without quantized HTP graphs;
    ``check``'s record (``kztts.export.validate.htp_check.check_bundle``, which the command passes: the judging
    lives above the exporters) when given and the QNN execution provider is present (raising
    :class:`HtpCheckFailed` below a bound); else "unvalidated" with the reason."""
    if not quantized_htp_steps(bundle_dir, target):
        return None
    return _checked(bundle_dir, target, check)


def lm_htp_check_record(bundle_dir: str | Path, target: str | Path | Target, *,
                        check: Callable[[Path, str | Path | Target], dict] | None) -> dict | None:
    """The manifest's ``htp_check`` for the LM bundle at ``bundle_dir`` exported for ``target``: None when its
    static graphs are all float; else as :func:`htp_check_record` (``check``:
    ``kztts.export.validate.htp_check.check_lm_bundle``)."""
    static = [g.precision for g in read_manifest(Path(bundle_dir)).graphs.values() if g.variant == "static"]
    if not any((e := G.HTP_PRECISION_ENTRIES.get(p)) is not None and e.quantized for p in static):
        return None
    return _checked(bundle_dir, target, check)


__all__ = ["CHECK_FRAMES", "CHECK_TEXTS", "DECODER_FRAMES", "LM_CHECK_STEPS", "TALKER_STEPS", "HtpCheckFailed",
           "htp_check_record", "lm_htp_check_record", "quantized_htp_steps", "unvalidated"]
