"""``kztts export``: a Qwen3-TTS checkpoint directory -> a bundle directory."""
from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import Callable

from kztts.bundle.graphs import FLOAT_HTP_PRECISION
from kztts.bundle.manifest import FORMAT, FORMAT_VERSION, MODEL_TYPE, TOKENIZER_TYPE, write_manifest
from kztts.bundle.table_views import view_tables
from kztts.core import progress
from kztts.core.build_cache import build_once, code_key
from kztts.core.cache import cache_dir
from kztts.export.common.bundle_output import bundle_output, check_output
from kztts.export.common.checkpoint import fingerprint, load_reference, read_config
from kztts.export.common.embeddings import export_embeddings
from kztts.export.common.export_key import exporter_code_key
from kztts.export.common.graph_parts import share_graph_weights, share_with_static
from kztts.export.common.tokenizer import export_tokenizer
from kztts.export.graphs.code_predictor_graph import export_code_predictor
from kztts.export.graphs.codec_graphs import export_decoder, export_encoder
from kztts.export.graphs.gqa_graphs import export_gqa_graphs
from kztts.export.graphs.speaker_graph import export_speaker_encoder
from kztts.export.graphs.talker_graph import export_talker
from kztts.export.htp.export_check import htp_check_record
from kztts.export.htp.static_graphs import export_htp_graphs
from kztts.export.htp.export_plan import ExportPlan, plan_export
from kztts.export.tts.prompt_calibration import TtsPrompts
from kztts.export.tts.tiny_build import MARKER
from kztts.export.tts.tts_parts import kind_entries, model_config, special_ids
from kztts.htp.targets import target_path

log = logging.getLogger(__name__)


def export_bundle(model_dir: str | Path, out_dir: str | Path, *, overwrite: bool = False,
                  target: str | None = None, precision: str | None = None,
                  context_binary: bool = False, segments: bool = False, placement: str | None = None,
                  decoder_precision: str = FLOAT_HTP_PRECISION, check_htp: Callable | None = None,
                  plan: ExportPlan | None = None) -> Path:
    """Export everything the CPU runtime needs, plus the static HTP graphs of ``target``
    when given (and its per-layer Talker segments with ``segments``; ``placement``: a precision plan;
    ``decoder_precision``: the HTP decoder's, ``kztts.export.htp.static_graphs.export_htp_graphs``); written to a
    temp dir, then moved into place, under the lock of ``out_dir`` (``build_cache.exclusive_output``).
    ``plan``: those options decided already (``kztts.export.htp.export_plan.plan_export``, what the command
    builds); without it they are planned here.
    ``check_htp``: what judges the quantized HTP graphs on the simulator and refuses the export below their bounds
    (``kztts.export.validate.htp_check.check_bundle``, given by the command); without it the manifest says they
    are unvalidated (``kztts.export.htp.export_check``)."""
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    if plan is None:
        plan = plan_export(model_dir, kind="tts", target=target, precision=precision, context_binary=context_binary,
                           segments=segments, placement=placement, decoder_precision=decoder_precision)
    target = plan.target
    cfg = read_config(model_dir)
    check_output(out_dir, overwrite)
    with bundle_output(out_dir, overwrite) as work, tempfile.TemporaryDirectory(
            prefix=".fp32-checkpoint.", dir=Path(work).parent, ignore_cleanup_errors=True) as staging:
        steps = progress.Steps(6 + (target is not None), "export")
        steps.phase("loading checkpoint")
        tts = load_reference(model_dir, staging=Path(staging))  # a bf16 checkpoint widened on disk, mapped
        model = tts.model
        steps.update()
        steps.phase("hashing checkpoint")
        source = fingerprint(model_dir)
        steps.update()
        steps.phase("embeddings + tokenizer")
        tables = export_embeddings(model, work)
        export_tokenizer(model_dir, work)
        steps.update()
        steps.phase("talker + code predictor graphs")
        export_id = source["sha256"][:16]
        graphs = {"talker": export_talker(model, work, export_id)}
        graphs.update(export_code_predictor(model, work, export_id))
        graphs.update(export_gqa_graphs(model, work, export_id))
        steps.update()
        steps.phase("speech tokenizer + speaker encoder")
        graphs.update(export_decoder(model, work, export_id))
        graphs.update(export_encoder(model, work, export_id))
        if model.speaker_encoder is not None:  # Base only: the other kinds clone no voice
            graphs.update(export_speaker_encoder(model, work, export_id))
        graphs, weights = share_graph_weights(work, graphs)  # each weight once, before the HTP graphs read any
        steps.update()
        if target is not None:
            steps.phase(f"HTP graphs for {target.name}")
            static = export_htp_graphs(model, work, export_id=export_id, plan=plan, calibration=TtsPrompts(model))
            graphs.update(static)
            shared, weights = share_with_static(work, graphs, static, weights)
            graphs.update(shared)
            steps.update()
        tables = view_tables(work, tables, weights)  # the codec tables the graphs hold: read from their weights file
        steps.phase("manifest")
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "model_type": MODEL_TYPE,
            "tts_model_type": cfg["tts_model_type"], **kind_entries(model), "tokenizer_type": TOKENIZER_TYPE,
            "source": source, "config": model_config(model), "special_ids": special_ids(model),
            "languages": dict(model.config.talker_config.codec_language_id or {}),
            "generation": dict(getattr(model, "generate_config", None) or {}),
            "embeddings": tables, "weights": weights, "graphs": {n: g.to_json() for n, g in graphs.items()},
            "random_weights": random_weight_provenance(model_dir),
        }
        write_manifest(work, manifest)
        if target is not None:
            del model, tts  # the check's simulator runs need the memory more
            record = htp_check_record(work, target, check=check_htp)
            if record is not None:
                manifest["htp_check"] = record
                write_manifest(work, manifest)
        steps.update()
        steps.close()
    log.info("bundle written to %s", out_dir)
    return out_dir


def random_weight_provenance(model_dir: Path) -> dict | None:
    """What a random-weight checkpoint is (``kztts make-tiny`` leaves its marker file in it), or None for
    a real one: the manifest carries it so that every measure of speech quality can say it means nothing."""
    marker = Path(model_dir) / MARKER
    if not marker.is_file():
        return None
    info = json.loads(marker.read_text(encoding="utf-8"))
    return {"made_by": "kztts make-tiny", **{k: info.get(k) for k in ("size", "variant", "seed", "eos_bias")}}


def cached_bundle(model_dir: str | Path) -> Path:
    """Export ``model_dir`` once into the cache (keyed by checkpoint path and exporter code)."""
    model_dir = Path(model_dir).resolve()
    where = code_key(extra=str(model_dir).encode(), length=8)  # two checkpoints may share a name
    out = cache_dir() / "bundles" / f"{model_dir.name}-{where}-{exporter_code_key('tts')}"
    return build_once(out, lambda work: export_bundle(model_dir, work, overwrite=True))


def cached_target_bundle(model_dir: str | Path, target: str | Path, *, precision: str | None = None,
                         context_binary: bool = False, segments: bool = False, tag: str = "",
                         placement: str | Path | None = None, decoder_precision: str = FLOAT_HTP_PRECISION) -> Path:
    """A CPU + HTP bundle of ``model_dir`` for ``target`` in the cache (tests, demos), keyed by the
    checkpoint, the exporter code, the target file and the options (a precision plan by its file's bytes)."""
    model_dir = Path(model_dir)
    tfile = target_path(target)
    opts = f"{precision}|{context_binary}|{tag}" + ("|segments" if segments else "")
    if decoder_precision != FLOAT_HTP_PRECISION:
        opts += f"|decoder-{decoder_precision}"
    if placement is not None:
        opts += "|plan" + (Path(placement).read_text() if Path(placement).is_file() else str(placement))
    h = code_key(tfile, extra=opts.encode(), length=8)
    out = cache_dir() / "bundles" / f"{model_dir.name}-{exporter_code_key('tts')}-{tfile.stem}-{h}"
    return build_once(out, lambda work: export_bundle(model_dir, work, overwrite=True, target=str(tfile),
                                                      precision=precision, context_binary=context_binary,
                                                      segments=segments,
                                                      placement=str(placement) if placement else None,
                                                      decoder_precision=decoder_precision))
