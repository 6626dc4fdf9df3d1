"""``kztts export`` of a hybrid causal LM (Qwen3-Next / Qwen3.5: ``qwen3_next``): an LM bundle (manifest kind "lm",
``model_type`` "qwen3_next") on the same manifest, registry and runtime as the dense LMs.

Graphs (``kztts.export.graphs.hybrid_graphs``; names and I/O in ``kztts.bundle.graphs``):

- ``hybrid_prefill`` (CPU, the chunked delta rule, up to ``SUB_CHUNK`` positions a call) and ``hybrid_decode``
  (CPU, one position, the recurrent form), KV of the attention layers and both DeltaNet states as I/O;
- with ``--target``: ``hybrid_static_prefill`` (a chunk of the target's ``prefill_chunk`` positions, padded,
  ``token_mask``) and ``hybrid_static_decode`` (one position) at the target's context, fp16 on the HTP (KV I/O
  of the target's ``kv_dtype``, default f16; the states f32), with every layer's magnitude probes. Both are
  always written, whatever the target's ``talker_graphs``: a decode step served by a padded prefill chunk
  re-runs the positions before it past ``C - S`` (``kztts.runners.talker_prefill_only``), which a recurrent
  state cannot undo.

Not for hybrids (refused in one line): ``--precision w8a16`` (the LM calibration drives the Talker-shaped
static graphs; no hybrid calibration path exists yet) and GGUF files (transformers 4.57 has no GGUF
loader for the DeltaNet tensors). ``--segments``: hybrids have no per-layer graphs; the whole-stack static
graphs carry each layer's probes (the fp16 guard and ``kztts calibrate`` read those), so a library call
asking for them gets the whole-stack graphs and a warning (``kztts export`` refuses the flag).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from kztts.bundle import graphs as G
from kztts.bundle.manifest import FORMAT, FORMAT_VERSION, KIND_LM, write_manifest
from kztts.core import progress
from kztts.core.build_cache import build_once, code_key
from kztts.core.cache import cache_dir
from kztts.core.errors import KzttsError
from kztts.export.common.bundle_output import bundle_output, check_output
from kztts.export.common.export_key import exporter_code_key
from kztts.export.common.graph_parts import share_graph_weights
from kztts.export.htp.export_plan import ExportPlan, plan_export
from kztts.export.graphs.hybrid_graphs import STATIC_DECODE, STATIC_PREFILL, export_hybrid_cpu, export_hybrid_static
from kztts.export.graphs.hybrid_stack import hybrid_shape
from kztts.export.htp.static_graphs import _spec, _with_context_binaries
from kztts.export.lm import lm_parts
from kztts.export.lm.checkpoint import load_causal_lm
from kztts.htp.targets import target_path
from kztts.lm import chatml

log = logging.getLogger(__name__)


def is_hybrid_source(source: str | Path) -> bool:
    """A Hugging Face directory whose config.json says ``model_type`` qwen3_next."""
    cfg = Path(source) / "config.json"
    if not cfg.is_file():
        return False
    try:
        return json.loads(cfg.read_text(encoding="utf-8")).get("model_type") in G.HYBRID_MODEL_TYPES
    except (OSError, ValueError, AttributeError):
        return False


def export_hybrid_htp(lm, work: Path, export_id: str, plan: ExportPlan) -> dict:
    """The two static hybrid graphs of ``plan.target`` (fp16), as {name: manifest spec}."""
    target, kv = plan.target, plan.htp_kv
    S, C = target.shapes.prefill_chunk, target.shapes.context
    limit = int(lm.config.max_position_embeddings)
    if C - 1 > limit:
        raise KzttsError(f"{target.path}: shapes.context {C} exceeds the model's {limit} positions")
    if target.talker_graphs == "prefill-only":
        log.info("%s: talker_graphs prefill-only, but a hybrid's decode steps need their own graph (a padded prefill "
                 "chunk cannot re-run positions through a recurrent state): writing both", target.name)
    common = {"context": C, "mask_value": target.attention_mask_value, "kv_dtype": kv,
              "target_shapes": {"prefill_chunk": S, "context": C, "decoder_chunk": target.shapes.decoder_chunk}}
    specs = {}
    for name, seq in ((STATIC_PREFILL, S), (STATIC_DECODE, 1)):
        rel = f"graphs/{name}.onnx"
        export_hybrid_static(lm, work / rel, seq, C, kv)
        specs[name] = _spec(work, name, rel, "fp16", export_id, target, seq=seq,
                            stats=list(G.DELTANET_STATS), **common)
    if plan.context_binary:
        specs.update(_with_context_binaries(work, specs, target, export_id))
    return specs


def export_hybrid_bundle(source: str | Path, out_dir: str | Path, *, overwrite: bool = False,
                         target: str | None = None, precision: str | None = None, context_binary: bool = False,
                         segments: bool = False, placement: str | None = None, cpu_graphs: str = "all",
                         plan: ExportPlan | None = None) -> Path:
    """Export a hybrid causal LM (a Hugging Face ``qwen3_next`` directory) to an LM bundle at ``out_dir``: the
    CPU graphs, and with ``target`` its static HTP graphs (module docstring). ``plan``: those options decided
    already (``kztts.export.htp.export_plan.plan_export``); without it they are planned here."""
    source, out_dir = Path(source), Path(out_dir)
    if plan is None:
        if segments:
            log.warning("hybrid LMs have no per-layer graphs: exporting the whole-stack static graphs, whose probes "
                        "cover every layer (the fp16 guard and kztts calibrate read them)")
        plan = plan_export(source, kind="hybrid", target=target, precision=precision, context_binary=context_binary,
                           placement=placement, cpu_graphs=cpu_graphs)
    target_cfg = plan.target
    check_output(out_dir, overwrite)
    with bundle_output(out_dir, overwrite) as work:
        steps = progress.Steps(4 + (target_cfg is not None), "export")
        steps.phase("loading checkpoint")
        # transformers warns that its CUDA fast path (fla, causal-conv1d) is missing: the export traces the torch path
        logging.getLogger("transformers.models.qwen3_next.modeling_qwen3_next").setLevel(logging.ERROR)
        loaded = load_causal_lm(source)
        lm = loaded.model
        if lm.config.model_type not in G.HYBRID_MODEL_TYPES:
            raise KzttsError(f"{source}: model_type {lm.config.model_type!r} is not a hybrid LM")
        steps.update()
        steps.phase("hashing checkpoint")
        src = lm_parts.fingerprint_source(source)
        export_id = src["sha256"][:16]
        steps.update()
        steps.phase("embedding + tokenizer")
        tables = lm_parts.write_token_embedding(lm, work)
        lm_parts.save_tokenizer(loaded.tokenizer_json, work)
        steps.update()
        steps.phase("CPU graphs")
        graphs, weights = share_graph_weights(work, export_hybrid_cpu(lm, work, export_id))
        steps.update()
        if target_cfg is not None:
            steps.phase(f"HTP graphs for {target_cfg.name}")
            graphs.update(export_hybrid_htp(lm, work, export_id, plan))
            steps.update()
        from tokenizers import Tokenizer

        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "kind": KIND_LM,
            "model_type": lm.config.model_type, "source": {**src, "gguf": False},
            "config": {"lm": hybrid_shape(lm).to_config()},
            "special_ids": lm_parts.special_ids(lm, Tokenizer.from_file(str(work / "tokenizer.json"))),
            "chat": lm_parts.chat_facts(loaded.hf_tokenizer), "generation": lm_parts.generation(lm),
            "embeddings": tables, "weights": weights, "graphs": {n: g.to_json() for n, g in graphs.items()},
        }
        write_manifest(work, manifest)
        steps.close()
    log.info("hybrid LM bundle written to %s", out_dir)
    return out_dir


def cached_hybrid_bundle(model_dir: str | Path, target: str | None = None) -> Path:
    """``model_dir`` exported once into the cache (tests, demos), keyed by the checkpoint path, the exporter
    code (``exporter_code_key``: the hybrid graphs and this module among it, and ``kztts.lm.chatml``) and the
    target file."""
    model_dir = Path(model_dir).resolve()
    extra = str(model_dir).encode() + (target_path(target).read_bytes() if target is not None else b"")
    key = code_key(chatml, extra=extra, length=10)
    out = cache_dir() / "bundles" / f"{model_dir.name}-{exporter_code_key('lm')}-{key}"
    return build_once(out, lambda work: export_hybrid_bundle(
        model_dir, work, overwrite=True, target=str(target_path(target)) if target else None))


__all__ = ["cached_hybrid_bundle", "export_hybrid_bundle", "is_hybrid_source"]
