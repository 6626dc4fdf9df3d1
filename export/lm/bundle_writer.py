"""``kztts export`` of a Qwen2/Qwen3 causal LM: an LM bundle (manifest kind "lm").

The LM's decoder stack is exported through the Talker's exporters, so an LM bundle holds the
Talker's graph kinds (``kztts.bundle.graphs.LM_GRAPH_KINDS``) and the runtime's Talker runners, plan,
placements and calibration serve it unchanged:

- ``talker`` (plain, dynamic CPU) and ``talker_gqa`` (fused attention, when head_dim allows) with its
  batched form ``talker_batched`` (rows of several conversations, ``kztts.server.chat``);
- with ``--target``: ``talker_prefill`` / ``talker_decode`` (static HTP; fp16, or a quantized precision's QDQ
  graphs calibrated on text by ``kztts.export.lm.text_calibration``), and with ``--segments`` (fp16) the
  per-layer graphs with magnitude probes, plus the QDQ variants a precision plan (``--placement``) runs;
- the LM head is the graphs' head (``logits`` [.., vocab]); the token embedding is the table
  ``embeddings/token_embedding.npy`` (bf16 when exact, else fp32), gathered on the host.

``LmAsTalker`` lets the Talker exporters see the LM: they borrow ``model.layers``,
``model.norm``, ``codec_head`` and ``config``. Qwen2's q/k/v biases ride on the borrowed Linear
modules and its missing q/k norms are identity (``kztts.export.common.qwen3_stack.head_norm``).
The tokenizer is saved as ``tokenizer.json``; the checkpoint's chat template is rendered by
transformers at export and compared with the runtime's ChatML (``kztts.lm.chatml``): the manifest's
``chat`` records the default system prompt and whether they agree.
"""
from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

from torch import nn

from kztts.bundle import graphs as G
from kztts.bundle.manifest import FORMAT, FORMAT_VERSION, KIND_LM, write_manifest
from kztts.core import progress
from kztts.core.build_cache import build_once, code_key
from kztts.core.cache import cache_dir
from kztts.core.errors import KzttsError
from kztts.export.common.bundle_output import bundle_output, check_output
from kztts.export.common.export_key import exporter_code_key
from kztts.export.common.graph_parts import share_graph_weights, share_with_static
from kztts.export.graphs.gqa_graphs import export_talker_batched, export_talker_gqa
from kztts.export.graphs.talker_graph import export_talker, talker_shape
from kztts.export.htp.export_check import lm_htp_check_record
from kztts.export.htp.export_plan import ExportPlan, plan_export
from kztts.export.htp.static_graphs import export_htp_graphs
from kztts.export.lm.checkpoint import load_causal_lm
from kztts.export.lm.gguf_meta import gguf_layer_count
from kztts.export.lm.hybrid import export_hybrid_bundle, is_hybrid_source
from kztts.export.lm.lm_parts import (
    chat_facts,
    fingerprint_source,
    generation,
    save_tokenizer,
    special_ids,
    write_token_embedding,
)
from kztts.export.lm.text_calibration import LmTexts
from kztts.htp.targets import target_path
from kztts.lm import chatml

log = logging.getLogger(__name__)

# conversations rendered by both the checkpoint's template and kztts.lm.chatml at export
class LmAsTalker(nn.Module):
    """A causal LM seen through the attributes the Talker exporters use (weights shared)."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        cfg = lm.config
        if getattr(cfg, "use_sliding_window", False):
            raise KzttsError(f"{cfg.model_type}: sliding-window attention is not supported (full causal only)")
        self.model = lm.model
        self.codec_head = lm.lm_head
        self.config = cfg


def as_tts_like(lm: nn.Module) -> SimpleNamespace:
    """What the Talker-graph exporters take as ``model``: ``.talker`` and ``.config.talker_config``."""
    return SimpleNamespace(talker=LmAsTalker(lm), config=SimpleNamespace(talker_config=lm.config))


def lm_config(lm: nn.Module) -> dict:
    """The manifest's ``config.lm``: the Talker keys the runners read, plus the LM's facts."""
    s = talker_shape(LmAsTalker(lm))
    cfg = lm.config
    return {"num_layers": s.num_layers, "hidden": s.hidden, "num_heads": s.num_heads,
            "num_kv_heads": s.num_kv_heads, "head_dim": s.head_dim, "rope_theta": s.rope_theta,
            "vocab": s.vocab, "max_positions": int(cfg.max_position_embeddings),
            "rms_norm_eps": float(cfg.rms_norm_eps), "tie_word_embeddings": bool(cfg.tie_word_embeddings),
            "qkv_bias": lm.model.layers[0].self_attn.q_proj.bias is not None,
            "qk_norm": hasattr(lm.model.layers[0].self_attn, "q_norm")}


def _load(source: Path):
    """(model fp32, tokenizer.json path, transformers tokenizer) of a Qwen2/Qwen3 directory or GGUF file
    (``kztts.export.lm.checkpoint``: GGUF head_dim and special tokens as the original checkpoint has them)."""
    loaded = load_causal_lm(source)
    return loaded.model, loaded.tokenizer_json, loaded.hf_tokenizer


def export_lm_bundle(source: str | Path, out_dir: str | Path, *, overwrite: bool = False,
                     target: str | None = None, precision: str | None = None, context_binary: bool = False,
                     segments: bool = False, placement: str | None = None, cpu_graphs: str = "all",
                     plan: ExportPlan | None = None, check_htp: Callable | None = None) -> Path:
    """Export a causal LM (a Hugging Face directory or a GGUF file) to an LM bundle at ``out_dir``:
    the CPU graphs, and with ``target`` its static HTP graphs (``segments``: per layer; ``placement``: a precision
    plan, ``kztts.export.htp.static_graphs.export_htp_graphs``). ``cpu_graphs`` ``"fused"`` writes the
    fused-attention Talker alone (``kztts.export.htp.export_plan.CPU_GRAPH_SETS``). ``plan``: those options
    decided already (``kztts.export.htp.export_plan.plan_export``); without it they are planned here.
    ``check_htp``: what judges quantized static graphs on the simulator and refuses the export below their bounds
    (``kztts.export.validate.htp_check.check_lm_bundle``, given by the command); without it the manifest says they
    are unvalidated (``kztts.export.htp.export_check``). A hybrid LM (Qwen3-Next / Qwen3.5, float static graphs
    only) goes to ``kztts.export.lm.hybrid``."""
    source, out_dir = Path(source), Path(out_dir)
    if plan is None and is_hybrid_source(source):
        return export_hybrid_bundle(source, out_dir, overwrite=overwrite, target=target, precision=precision,
                                    context_binary=context_binary, segments=segments, placement=placement,
                                    cpu_graphs=cpu_graphs)
    if plan is None:
        plan = plan_export(source, gguf=source.is_file(), target=target, precision=precision,
                           context_binary=context_binary, segments=segments, placement=placement,
                           cpu_graphs=cpu_graphs, num_layers=gguf_layer_count(source) if source.is_file() else None)
    if plan.kind == "hybrid":
        return export_hybrid_bundle(source, out_dir, overwrite=overwrite, plan=plan)
    target_cfg, cpu_graphs = plan.target, plan.cpu_graphs
    check_output(out_dir, overwrite)
    with bundle_output(out_dir, overwrite) as work:
        steps = progress.Steps(4 + (target_cfg is not None), "export")
        steps.phase("loading checkpoint")
        lm, tokenizer, hf_tok = _load(source)
        steps.update()
        steps.phase("hashing checkpoint")
        src = fingerprint_source(source)
        export_id = src["sha256"][:16]
        steps.update()
        steps.phase("embedding + tokenizer")
        tables = write_token_embedding(lm, work)
        save_tokenizer(tokenizer, work)
        steps.update()
        steps.phase("CPU graphs")
        model = as_tts_like(lm)
        fused = export_talker_gqa(model, work, export_id)
        if fused is None and cpu_graphs == "fused":
            raise KzttsError(f"--cpu-graphs fused: {source}'s head_dim has no fused-attention graph "
                             "(ORT GroupQueryAttention); export without --cpu-graphs")
        graphs = {} if cpu_graphs == "fused" else {"talker": export_talker(model, work, export_id)}
        if fused is not None:
            graphs["talker_gqa"] = fused
            if cpu_graphs == "all":
                # its batched form: several conversations per run (kztts serve), each row alone in the graph
                graphs["talker_batched"] = export_talker_batched(model, work, export_id)
        graphs, weights = share_graph_weights(work, graphs)  # each weight once, before the HTP graphs read any
        steps.update()
        if target_cfg is not None:
            steps.phase(f"HTP graphs for {target_cfg.name}")
            static = export_htp_graphs(model, work, export_id=export_id, plan=plan,
                                       calibration=LmTexts(lm_config(lm)), talker_only=True)
            graphs.update(static)
            shared, weights = share_with_static(work, graphs, static, weights)
            graphs.update(shared)
            steps.update()
        unknown = [n for n in graphs if n not in G.LM_GRAPH_KINDS and not n.startswith(G.SEGMENT_PREFIXES)]
        if unknown:
            raise RuntimeError(f"LM export wrote graphs outside kztts.bundle.graphs.LM_GRAPH_KINDS: {unknown}")
        from tokenizers import Tokenizer

        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "kind": KIND_LM,
            "model_type": lm.config.model_type, "source": {**src, "gguf": source.is_file()},
            "config": {"lm": lm_config(lm)},
            "special_ids": special_ids(lm, Tokenizer.from_file(str(work / "tokenizer.json"))),
            "chat": chat_facts(hf_tok), "generation": generation(lm), "embeddings": tables, "weights": weights,
            "graphs": {n: g.to_json() for n, g in graphs.items()},
        }
        write_manifest(work, manifest)
        if target_cfg is not None:
            del model, lm  # the check's simulator runs need the memory more
            record = lm_htp_check_record(work, target_cfg.path, check=check_htp)
            if record is not None:
                manifest["htp_check"] = record
                write_manifest(work, manifest)
        steps.close()
    log.info("LM bundle written to %s", out_dir)
    return out_dir


def cached_lm_bundle(model_dir: str | Path, target: str | None = None, segments: bool = False,
                     precision: str | None = None, placement: str | Path | None = None) -> Path:
    """``model_dir`` exported once into the cache (tests, demos), keyed by the checkpoint path, the
    exporter code (``exporter_code_key``, and ``kztts.lm.chatml``), the target file, the HTP precision and the
    precision plan (its file's bytes)."""
    model_dir = Path(model_dir).resolve()
    extra = str(model_dir).encode()
    tfile = None
    if target is not None:
        tfile = target_path(target)
        extra += tfile.read_bytes() + (b"|segments" if segments else b"") + (f"|{precision}".encode() if precision else b"")
        if placement is not None:
            extra += b"|plan" + (Path(placement).read_bytes() if Path(placement).is_file() else str(placement).encode())
    key = code_key(chatml, extra=extra, length=10)
    out = cache_dir() / "bundles" / f"{model_dir.name}-{exporter_code_key('lm')}-{key}"
    return build_once(out, lambda work: export_lm_bundle(model_dir, work, overwrite=True,
                                                         target=str(tfile) if tfile else None, segments=segments,
                                                         precision=precision,
                                                         placement=str(placement) if placement else None))
