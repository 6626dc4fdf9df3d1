"""``kztts validate``: a bundle against the official PyTorch model, side by side.

For each prompt mode the reference generates greedily with qwen-tts and its
prompt is captured; the bundle then builds the same prompt with its own numpy
code and replays the Talker on the reference's codes (teacher forcing). Metrics
compare the prefill embeddings, and the logits and hidden of every step; the
Code Predictor is given the reference's talker hidden and CB0 of every frame.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from kztts.bundle.bundle import Bundle
from kztts.bundle.embeddings import EmbeddingTables
from kztts.core.errors import KzttsError
from kztts.core.metrics import cosine_rows
from kztts.core.progress import phase
from kztts.eval import replay
from kztts.export.common.checkpoint import fingerprint, load_reference, read_config
from kztts.export.common.reference import (
    MODES,
    ReferenceRun,
    kind_modes,
    reference_run,
    teacher_forced_code_predictor,
    teacher_forced_talker,
)
from kztts.generation.sampling import SamplingParams, XorShift32
from kztts.plan.resolve import resolve_plan
from kztts.runners.code_predictor import CodePredictor
from kztts.runners.talker import Talker
from kztts.tts.prompt import build_prompt, speaker_language_id

log = logging.getLogger(__name__)


@dataclass
class ModeMetrics:
    mode: str
    prompt_positions: int
    frames: int
    prompt_max_abs: float
    talker_logits_cos_min: float
    talker_hidden_cos_min: float
    talker_argmax_match: float
    cp_codes_match_frame: float
    cp_codes_match_step: float
    cp_logits_cos_min: float


def bundle_prompt(bundle: Bundle, tables: EmbeddingTables, run: ReferenceRun):
    """The bundle's own prompt for a reference run (token ids, x-vector and ref codes as given)."""
    m = bundle.manifest
    if m.tts_kind != "base":  # a preset speaker's row (its dialect remaps the language) or none, an instruction
        dialect = m.speakers[run.preset]["dialect"] if run.preset else None
        return build_prompt(tables, run.input_ids, special_ids=m.special_ids,
                            language_id=speaker_language_id(m.languages, run.language, dialect),
                            speaker=tables.codec([m.speakers[run.preset]["id"]])[0] if run.preset else None,
                            mode="xvector", non_streaming=run.non_streaming, instruct_ids=run.instruct_ids)
    lang = None if run.language.lower() == "auto" else m.languages[run.language.lower()]
    return build_prompt(tables, run.input_ids, special_ids=m.special_ids, language_id=lang,
                        speaker=run.speaker, mode="xvector" if run.xvector_mode else "icl",
                        non_streaming=run.non_streaming, ref_text_ids=run.ref_ids, ref_codes=run.ref_codes)


def code_predictor_metrics(model, predictors: dict[str, CodePredictor], hidden: np.ndarray,
                           codes: np.ndarray) -> dict[str, float]:
    """Greedy codes of each Code Predictor mode, and teacher-forced step logits, on the reference's
    talker hiddens and CB0 per frame."""
    greedy = SamplingParams.greedy_params()
    out = {}
    for mode, cp in predictors.items():
        got = np.stack([cp.predict(hidden[k], int(codes[k, 0]), greedy, XorShift32(k))[0]
                        for k in range(len(codes))])
        out[f"cp_codes_match_{mode}"] = float((got == codes[:, 1:]).mean())
    ref = teacher_forced_code_predictor(model, hidden, codes)
    ours = np.stack([predictors["step"].teacher_forced_logits(hidden[k], int(codes[k, 0]), codes[k, 1:])
                     for k in range(len(codes))])
    out["cp_logits_cos_min"] = float(cosine_rows(ours, ref).min())
    return out


def validate_mode(tts, bundle: Bundle, tables: EmbeddingTables, talker: Talker,
                  predictors: dict[str, CodePredictor], mode: str, frames: int, language: str) -> ModeMetrics:
    run = reference_run(tts, mode, frames=frames, language=language)
    prompt = bundle_prompt(bundle, tables, run)
    if prompt.embeds.shape != run.prefill.shape or prompt.trailing.shape != run.trailing.shape:
        prompt_err = float("inf")
    else:
        prompt_err = float(max(np.abs(prompt.embeds - run.prefill).max(),
                               np.abs(prompt.trailing - run.trailing).max() if run.trailing.size else 0.0,
                               np.abs(prompt.tts_pad - run.tts_pad).max()))
    ref_l, ref_h = teacher_forced_talker(tts.model, run.prefill, run.trailing, run.tts_pad, run.codes)
    got_l, got_h = replay.teacher_forced_talker(talker, prompt.embeds, replay.decode_inputs(tables, prompt, run.codes))
    cp = code_predictor_metrics(tts.model, predictors, ref_h[:len(run.codes)], run.codes)
    return ModeMetrics(
        mode=mode, prompt_positions=int(run.prefill.shape[0]), frames=int(len(run.codes)),
        prompt_max_abs=prompt_err,
        talker_logits_cos_min=float(cosine_rows(got_l, ref_l).min()),
        talker_hidden_cos_min=float(cosine_rows(got_h, ref_h).min()),
        talker_argmax_match=float((got_l.argmax(-1) == ref_l.argmax(-1)).mean()),
        **cp,
    )


def check_reference(bundle_dir: Path, reference_dir: Path) -> None:
    """Refuse, in one line naming both, a reference checkpoint other than the one the bundle was
    exported from (the manifest's ``source.sha256``): a replay against it only prints a FAIL table."""
    source = Bundle.open(bundle_dir, load_graphs=False).manifest.data.get("source") or {}
    read_config(reference_dir)
    expected = source.get("sha256")
    if not expected:
        log.warning("%s: the manifest records no checkpoint sha256; the reference's identity is not checked",
                    bundle_dir)
        return
    phase("validate: hashing the reference checkpoint %s", reference_dir)
    got = fingerprint(reference_dir)["sha256"]
    if got != expected:
        raise KzttsError(f"{reference_dir}: not the checkpoint this bundle was exported from (sha256 {got[:12]}..., "
                         f"the bundle's {expected[:12]}..., exported from {source.get('path', '?')}); "
                         "give that checkpoint as --reference")


def validate(bundle_dir: str | Path, reference_dir: str | Path, *, frames: int = 32,
             modes: tuple[str, ...] = MODES, languages: tuple[str, ...] = ("English", "Auto")) -> dict:
    """Run every mode (and language setting) and aggregate: worst case over all of them."""
    bundle = Bundle.open(bundle_dir)
    tables = EmbeddingTables.from_bundle(bundle)
    talker = resolve_plan(bundle, attention="plain").open_talker(4096)  # the plain graph, as the reference
    predictors = {m: resolve_plan(bundle, cp_mode=m).open_code_predictor(tables) for m in ("frame", "step")}
    phase("validate: loading the qwen-tts reference from %s", reference_dir)
    tts = load_reference(Path(reference_dir))
    modes = kind_modes(tts, modes)
    per_mode = []
    for language in languages:
        for mode in modes:
            phase("validate: %s, language %s (%d/%d)", mode, language, len(per_mode) + 1,
                  len(languages) * len(modes))
            m = validate_mode(tts, bundle, tables, talker, predictors, mode, frames, language)
            log.info("%s/%s: %s", mode, language, m)
            per_mode.append({"language": language, **asdict(m)})
    return {
        "bundle": str(bundle_dir), "reference": str(reference_dir),
        "frames": min(m["frames"] for m in per_mode),
        "prompt_max_abs": max(m["prompt_max_abs"] for m in per_mode),
        "talker_logits_cos_min": min(m["talker_logits_cos_min"] for m in per_mode),
        "talker_hidden_cos_min": min(m["talker_hidden_cos_min"] for m in per_mode),
        "talker_argmax_match": min(m["talker_argmax_match"] for m in per_mode),
        "cp_codes_match": min(min(m["cp_codes_match_frame"], m["cp_codes_match_step"]) for m in per_mode),
        "cp_codes_match_frame": min(m["cp_codes_match_frame"] for m in per_mode),
        "cp_codes_match_step": min(m["cp_codes_match_step"] for m in per_mode),
        "cp_logits_cos_min": min(m["cp_logits_cos_min"] for m in per_mode),
        # over every mode's rows together (each mode has ``frames`` frames): the argmax-like scores a quantized
        # bundle is bounded by, where one flip moves the score by 1/(modes x frames), not 1/frames
        "talker_argmax_match_all": _pooled(per_mode, "talker_argmax_match"),
        "cp_codes_match_all": _pooled(per_mode, "cp_codes_match_frame", "cp_codes_match_step"),
        "modes": per_mode,
    }


def _pooled(per_mode: list[dict], *keys: str) -> float:
    """The mean over the modes' rows of the worst of ``keys`` per mode (weighted by each mode's frames)."""
    weight = sum(m["frames"] for m in per_mode)
    return sum(min(m[k] for k in keys) * m["frames"] for m in per_mode) / weight
