"""``kztts validate`` of an LM bundle: its CPU graphs against transformers on the checkpoint.

For each prompt of ``kztts.eval.lm_accuracy.SAMPLES``: transformers' greedy search (argmax, no
repetition penalty, no stop id) for ``steps`` tokens, the bundle's greedy tokens over the same
steps (equal or not), and the teacher-forced logits at every generated position (the reference
tokens fed one by one through the bundle's decode steps; transformers in one forward) compared
by cosine. The reference is the checkpoint the bundle was exported from (directory or GGUF,
checked by the manifest's sha256), loaded as the exporter loads it.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import numpy as np

from kztts.bundle.manifest import read_manifest
from kztts.core.errors import KzttsError
from kztts.core.metrics import cosine_rows
from kztts.core.progress import phase
from kztts.eval.lm_accuracy import SAMPLES, RowSpec, greedy, run_rows, tokenize
from kztts.export.lm.bundle_writer import _load
from kztts.export.lm.lm_parts import fingerprint_source
from kztts.lm.lm import LM

log = logging.getLogger(__name__)


def samples_named(names: Sequence[str] | None) -> tuple:
    """The text set's samples of ``names`` (all for None); an unknown name is refused, naming the set."""
    if not names:
        return SAMPLES
    known = {s.name: s for s in SAMPLES}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise KzttsError(f"--texts: unknown {', '.join(unknown)} (the set: {', '.join(known)})")
    return tuple(known[n] for n in names)


def check_lm_reference(bundle_dir: Path, reference: Path) -> None:
    """Refuse a reference other than the checkpoint the LM bundle was exported from (its sha256)."""
    if not reference.exists():
        raise KzttsError(f"{reference}: no such checkpoint directory or GGUF file")
    source = read_manifest(bundle_dir).data.get("source") or {}
    if source.get("sha256"):
        phase("validate: hashing the reference checkpoint %s", reference)
        got = fingerprint_source(reference)["sha256"]
        if got == source["sha256"]:
            return
        raise KzttsError(f"{reference}: not the checkpoint this LM bundle was exported from (sha256 {got[:12]}..., "
                         f"the bundle's {source['sha256'][:12]}..., exported from {source.get('path', '?')}); "
                         "give that checkpoint (directory or GGUF file) as --reference")
    log.warning("%s: no checkpoint sha256 in the manifest; the reference's identity is not checked", bundle_dir)


def validate_lm(bundle_dir: str | Path, reference: str | Path, *, steps: int = 32, context: int = 512,
                session_config=None, texts: Sequence[str] | None = None) -> dict:
    """Per prompt and worst case: greedy tokens equal over ``steps``, teacher-forced logits cosine.
    ``context``: the CPU KV cache's positions (the texts are cut to it); ``texts``: a subset of the text
    set by name (default all)."""
    import torch
    from transformers import GenerationConfig

    samples = samples_named(texts)
    lm = LM(bundle_dir, session_config=session_config, context=context)
    tokens = tokenize(lm, samples, lm.context, steps)
    phase("validate: loading the reference %s", reference)
    model, _tok, _info = _load(Path(reference))
    model.generation_config = GenerationConfig()  # plain greedy: not the checkpoint's sampling defaults
    config = GenerationConfig(max_new_tokens=steps, do_sample=False, repetition_penalty=1.0)
    prompts = []
    for t in tokens:
        phase("validate: %s", t.name)
        ids = torch.tensor([t.prompt])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config,
                                 eos_token_id=None, pad_token_id=0)
            ref = out[0, len(t.prompt):].tolist()
            ref_logits = model(out[:, :-1]).logits[0, len(t.prompt) - 1:].float().numpy()
        got_ids = greedy(lm, t, steps)
        lm._claim(object())
        got = [lm.feed(t.prompt)] + [lm.feed([x]) for x in ref[:-1]]
        cos = cosine_rows(np.stack(got), ref_logits)
        prompts.append({"name": t.name, "prompt_tokens": len(t.prompt), "steps": len(ref),
                        "greedy_equal": got_ids == ref,
                        "greedy_first_divergence": next((i for i, (a, b) in enumerate(zip(got_ids, ref)) if a != b),
                                                        None),
                        "logits_cos_min": float(cos.min()), "logits_cos_mean": float(cos.mean()),
                        "logits_max_abs_diff": float(np.abs(np.stack(got) - ref_logits).max()),
                        "text": lm.decode(ref)})
    return {"bundle": str(bundle_dir), "reference": str(reference), "steps": steps, "prompts": prompts,
            "logits_cos_min": min(p["logits_cos_min"] for p in prompts),
            "logits_cos_mean": float(np.mean([p["logits_cos_mean"] for p in prompts])),
            "greedy_match": float(np.mean([p["greedy_equal"] for p in prompts]))}


def validate_lm_placement(bundle_dir: str | Path, *, target: str | None, placement: str | None,
                          steps: int = 32, strict: bool = True, context: int = 512) -> dict:
    """An LM bundle on ``target`` under ``placement`` (a mode, a placement file, or None: the target's
    placement keys) against its fp32 CPU graphs, which plain ``kztts validate`` checks against
    transformers: the ``kztts.eval.lm_accuracy`` metrics over its text set (teacher-forced logits cosine and
    top-1, perplexity, ``steps`` greedy tokens per prompt), with the fp16 guard counting flagged HTP
    calls. A row that cannot run (QNN refusing a graph under strict, a missing graph) raises."""
    bundle_dir = Path(bundle_dir)
    specs = [RowSpec("cpu fp32", bundle_dir),
             RowSpec(f"{target or 'cpu'} {placement or 'target placement'}", bundle_dir, target=target,
                     placement=placement, check_saturation=True, strict=strict, guard_counts=True)]
    ref, row = run_rows(specs, samples=SAMPLES, threads=0, steps=steps, context=context)
    if row["error"]:
        raise KzttsError(f"{bundle_dir}: {row['error']}")
    return {"bundle": str(bundle_dir), "target": target, "placement": placement, "runner": row.get("runner"),
            "steps": steps, "tokens": row["tokens"], "logits_cos_min": row["logits_cos_min"],
            "logits_cos_mean": row["logits_cos_mean"], "top1_agree": row["top1_agree"],
            "ppl": row["ppl"], "ppl_fp32": ref["ppl"], "ppl_ratio": row["ppl"] / ref["ppl"],
            "greedy_match": row["greedy_equal"] / row["greedy_prompts"],
            "greedy_prefix_mean": row["greedy_prefix_mean"], "guard_flagged": row.get("guard_flagged", 0),
            "htp_hosts": row.get("htp_hosts", [])}
