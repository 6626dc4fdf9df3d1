"""Every choice of one ``kztts export``, resolved and checked once, before any work: an :class:`ExportPlan`.

The export's counterpart of ``kztts.plan.resolve.resolve_plan``: the command (or a library call) gives the
options as the user wrote them (a target name or file, precisions that may be left to the target, a precision
plan's name or file); :func:`plan_export` reads the source's config, parses the target once, resolves the HTP
precision (given, the precision plan's, or the target's), the HTP KV type and the decoder's precisions, and refuses
what cannot be exported in one line. Every exporter below (``kztts.export.tts.bundle_writer``,
``kztts.export.lm.bundle_writer``, ``kztts.export.lm.hybrid``, ``kztts.export.htp.static_graphs``) reads the plan
and decides nothing of this again. Light: no torch (the command builds it before loading a model).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path

from kztts.bundle import graphs as G
from kztts.bundle.manifest import LM_MODEL_TYPES
from kztts.core.errors import KzttsError
from kztts.export.common.checkpoint import read_config
from kztts.export.htp.qdq import QDQ_WEIGHT_BITS
from kztts.htp.placement import LayerPlacement
from kztts.htp.qnn import qnn_available, qnn_unavailable_reason
from kztts.htp.targets import Target, load_target
from kztts.plan.resolve import resolve_placement

log = logging.getLogger(__name__)

KINDS = ("tts", "lm", "hybrid")
CPU_GRAPH_SETS = {
    "all": "the plain and the fused-attention Talker and its batched form (kztts serve's conversations at once)",
    "fused": "the fused-attention Talker alone: a third of the export's time and disk; no plain-attention "
             "fallback (KZTTS_ATTENTION=plain), and kztts serve answers one conversation at a time",
}


@dataclass(frozen=True)
class ExportPlan:
    """One export, decided: what the source is, its CPU precision variant, and (with a target) its HTP graphs.

    ``kind``: "tts" (a Qwen3-TTS checkpoint), "lm" (a Qwen2/Qwen3 directory or GGUF file), "hybrid" (Qwen3-Next).
    ``weights``/``kv``/``decoder``: the CPU variant (``kztts.export.common.variants``). ``target``: parsed once, or
    None; then ``precision`` is the HTP Talker graphs' (given, the precision plan's, or the target's),
    ``htp_kv`` their KV I/O type and ``decoder_precision`` the HTP ``decoder_chunk``'s. ``placement``: the
    precision plan, resolved for the model's layer count (``num_layers``). ``cpu_graphs``: an LM's CPU graph
    set."""

    source: Path
    kind: str
    num_layers: int
    weights: str = "fp32"
    kv: str = "fp32"
    decoder: str = "fp32"
    target: Target | None = None
    precision: str | None = None
    htp_kv: str | None = None
    decoder_precision: str = G.FLOAT_HTP_PRECISION
    context_binary: bool = False
    segments: bool = False
    placement: LayerPlacement | None = None
    cpu_graphs: str = "all"

    @property
    def whole_stack_plan(self) -> LayerPlacement | None:
        """The precision plan the whole-stack static graphs follow (None with ``segments``: the layer graphs do)."""
        return self.placement if self.placement is not None and not self.segments else None


def plan_export(source: str | Path, *, gguf: bool = False, kind: str | None = None, target: str | Path | Target | None = None,
                precision: str | None = None, weights: str = "fp32", kv: str = "fp32", decoder: str = "fp32",
                decoder_precision: str | None = None, context_binary: bool = False, segments: bool = False,
                placement: str | Path | LayerPlacement | None = None, cpu_graphs: str = "all",
                num_layers: int | None = None) -> ExportPlan:
    """The checked plan of exporting ``source`` (module docstring). ``decoder``: ``--decoder`` as the command takes
    it, a CPU decoder precision or an HTP one (w8a16: the HTP ``decoder_chunk``'s, the CPU decoder stays fp32);
    ``decoder_precision``: the HTP one given apart (library calls). ``kind``: found from the source when None.
    ``num_layers``: the model's layer count, which a GGUF file's caller reads (``kztts.export.lm.gguf_meta``)."""
    source = Path(source)
    if decoder in G.HTP_DECODER_PRECISIONS and decoder not in G.DECODER_PRECISIONS:
        decoder_precision, decoder = decoder, "fp32"
    decoder_precision = decoder_precision or G.FLOAT_HTP_PRECISION
    for what, value, allowed in (("weights", weights, G.CPU_WEIGHT_PRECISIONS), ("kv", kv, G.KV_PRECISIONS),
                                 ("decoder", decoder, G.DECODER_PRECISIONS)):
        if value not in allowed:
            raise KzttsError(f"{what} precision {value!r} is not one of {', '.join(allowed)}")
    if decoder_precision not in G.HTP_DECODER_PRECISIONS:
        raise KzttsError(f"decoder precision {decoder_precision!r} on the HTP: expected one of "
                         f"{', '.join(G.HTP_DECODER_PRECISIONS)}")
    kind = kind or source_kind(source, gguf)
    if kind not in KINDS:
        raise ValueError(f"export kind {kind!r}: one of {', '.join(KINDS)}")
    if segments and target is None:
        raise KzttsError("--segments needs --target (the layer segments are static graphs of a target)")
    if placement is not None and target is None:
        raise KzttsError("--placement needs --target (a precision plan is for a target's static graphs)")
    if kind != "tts" and (decoder != "fp32" or decoder_precision != G.FLOAT_HTP_PRECISION):
        flag = decoder if decoder != "fp32" else decoder_precision
        raise KzttsError(f"--decoder {flag}: an LM bundle has no speech decoder; export without it")
    check = {"tts": _check_tts, "lm": _check_lm, "hybrid": _check_hybrid}[kind]
    layers = check(source, weights=weights, kv=kv, segments=segments, placement=placement, cpu_graphs=cpu_graphs)
    num_layers = num_layers if num_layers is not None else layers
    if num_layers is None:
        raise ValueError(f"{source}: plan_export needs num_layers for a GGUF file")
    plan = ExportPlan(source, kind, num_layers, weights=weights, kv=kv, decoder=decoder,
                      decoder_precision=decoder_precision, context_binary=context_binary, segments=segments,
                      cpu_graphs=cpu_graphs)
    if target is None:
        if decoder_precision != G.FLOAT_HTP_PRECISION:
            raise KzttsError(f"--decoder {decoder_precision} is the decoder on the HTP: it needs --target TARGET whose "
                             "placement.decoder is htp (e.g. x_elite_htp_decoder)")
        return plan
    target = load_target(target)  # the one parse of the export
    if placement is not None:
        placement = resolve_placement(placement, num_layers)
    precision, htp_kv = _htp_precision(kind, target, precision, context_binary, segments, placement)
    if decoder_precision != G.FLOAT_HTP_PRECISION and not target.on_htp("decoder"):
        raise KzttsError(f"--decoder {decoder_precision}: target {target.name} ({target.path}) keeps the decoder "
                         "on the CPU (placement.decoder); pick a target whose placement.decoder is htp "
                         "(e.g. x_elite_htp_decoder), or a CPU decoder precision")
    return replace(plan, target=target, precision=precision, htp_kv=htp_kv, placement=placement)


def source_kind(source: Path, gguf: bool = False) -> str:
    """"lm" for a GGUF file or a Qwen2/Qwen3 directory, "hybrid" for a Qwen3-Next one, else "tts"."""
    if gguf:
        return "lm"
    cfg = _config(source)
    if cfg is not None and cfg.get("model_type") in G.HYBRID_MODEL_TYPES:
        return "hybrid"
    return "lm" if cfg is not None and cfg.get("model_type") in LM_MODEL_TYPES else "tts"


def _config(source: Path) -> dict | None:
    try:
        cfg = json.loads((source / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return cfg if isinstance(cfg, dict) else None


def _check_tts(source: Path, *, cpu_graphs: str, **_) -> int:
    cfg = read_config(source)  # a wrong directory is refused in one line
    if cpu_graphs != "all":
        raise KzttsError(f"--cpu-graphs {cpu_graphs}: {source} is a Qwen3-TTS checkpoint, whose runners use the plain "
                         "and the fused graphs both; --cpu-graphs applies to LM exports")
    return int(cfg["talker_config"]["num_hidden_layers"])


def _check_lm(source: Path, *, cpu_graphs: str, **_) -> int | None:
    if cpu_graphs not in CPU_GRAPH_SETS:
        raise KzttsError(f"cpu_graphs {cpu_graphs!r}: choose one of {', '.join(CPU_GRAPH_SETS)}")
    if source.is_file():  # a GGUF file: its caller gives the layer count (plan_export's num_layers)
        return None
    if not source.is_dir():
        raise KzttsError(f"{source}: no such directory or GGUF file")
    return int((_config(source) or {}).get("num_hidden_layers", 0))


def _check_hybrid(source: Path, *, weights: str, kv: str, segments: bool, placement, cpu_graphs: str) -> int:
    if segments:
        raise KzttsError(f"--segments: {source} is a hybrid LM (qwen3_next), which has no per-layer graphs; its "
                         "whole-stack static graphs (--target) carry every layer's fp16 probes: drop --segments")
    if kv != "fp32":
        raise KzttsError(f"--kv {kv}: a hybrid LM's graphs keep their KV and DeltaNet states in fp32 (no fp16 "
                         "cache variant); export without --kv")
    if weights != "fp32":
        # no bound holds: on the tiny random hybrids int8 / int4 MatMulNBits give logits cosine min -0.03 / -0.25
        # against fp32 (benchmarks/hybrid_lm: their small delta-rule outputs, rescaled by the gated norm, turn
        # small weight errors into large ones); no trained hybrid could be fetched to show a model where they hold
        raise KzttsError(f"--weights {weights}: a hybrid LM's {weights} CPU weights have no accuracy bound "
                         "(tiny hybrids: logits cosine min -0.03 at int8, -0.25 at int4 against fp32, "
                         "benchmarks/hybrid_lm); export fp32 weights")
    if cpu_graphs != "all":
        raise KzttsError(f"--cpu-graphs {cpu_graphs}: {source} is a hybrid LM, whose CPU graphs are one prefill "
                         "and one decode graph (nothing to leave out); export without it")
    if placement is not None:
        raise KzttsError("--placement: a hybrid LM (qwen3_next) has no precision plans (no layer graphs, one "
                         "precision per static graph)")
    return int((_config(source) or {}).get("num_hidden_layers", 0))


def plan_precision(plan: LayerPlacement) -> str:
    """The precision of whole-stack graphs exported with ``plan``: its least precise quantized one."""
    return G.least_precise(p for p in plan.whole_stack_precisions().values())


def _htp_precision(kind: str, target: Target, precision: str | None, context_binary: bool, segments: bool,
                   placement: LayerPlacement | None) -> tuple[str, str]:
    """(the HTP Talker graphs' precision, their KV I/O type), checked: a precision QDQ graphs can hold, the QNN EP
    there for context binaries, the target's KV type suiting the precision."""
    if placement is not None and not segments and placement.quantized:
        precision = precision or plan_precision(placement)
        if precision in G.HTP_PRECISIONS and not G.htp_precision(precision).quantized:
            raise KzttsError(f"--precision {precision} with a quantized precision plan: whole-stack graphs with a "
                             "precision per MatMul are QDQ graphs; drop --precision or export with --segments")
    precision = precision or target.precision
    if precision not in G.HTP_PRECISIONS:
        raise KzttsError(f"precision {precision!r}: expected one of {', '.join(G.HTP_PRECISIONS)}")
    entry = G.htp_precision(precision)
    if kind == "hybrid" and entry.quantized:
        raise KzttsError(f"--precision {precision} is not available for hybrid LMs (qwen3_next): their static graphs "
                         "are fp16 (the QDQ calibration drives the Talker-shaped LM graphs only); export with "
                         f"--precision {G.FLOAT_HTP_PRECISION}")
    if kind == "lm" and entry.quantized and (placement is None or segments):
        _check_lm_quantized(precision, target, segments)
    if entry.quantized and entry.weight_bits not in QDQ_WEIGHT_BITS:
        raise KzttsError(f"HTP precision {precision!r} is listed in kztts.bundle.graphs.HTP_PRECISIONS but "
                         f"kztts.export.htp.qdq writes no {entry.weight_bits}-bit weights (QDQ_WEIGHT_BITS)")
    if context_binary and not qnn_available():
        raise KzttsError(f"--context-binary needs the QNN execution provider: {qnn_unavailable_reason()}")
    try:
        return precision, G.htp_kv_dtype(precision, target.kv_dtype)
    except ValueError as exc:
        if kind == "hybrid":
            raise KzttsError(f"{target.path}: kv_dtype: {exc}") from None
        raise KzttsError(f"{target.path}: kv_dtype: {exc}; with --precision {precision} drop the key or pick one "
                         "of those") from None


def _check_lm_quantized(precision: str, target: Target, segments: bool) -> None:
    """An LM bundle's quantized HTP graphs: the whole-stack static graphs, calibrated on text by
    ``kztts.export.lm.text_calibration``, fp32 KV I/O; a precision per layer needs ``--segments --placement PLAN``
    over fp16 layer graphs."""
    if segments:
        raise KzttsError(
            f"--segments with --precision {precision} is not supported for LM bundles: the layer graphs are float "
            "graphs (fp16 on the HTP) whose magnitude probes the fp16 guard and `kztts calibrate` read, so a placement "
            f"over them would run fp16, not {precision}. Export the {precision} graphs without --segments (placements "
            "all-htp and prefill-htp-decode-cpu), or quantized layer graphs beside the float ones with a precision "
            "plan: --precision fp16 --segments --placement PLAN (`kztts calibrate` writes one)")
    if G.htp_kv_dtype(precision, target.kv_dtype) == "uint8":
        raise KzttsError(f"{target.path}: kv_dtype uint8 (8-bit KV with fixed scales) is measured on TTS prompts "
                         f"only (kztts.export.htp.kv_quant); an LM bundle's {precision} graphs keep fp32 KV: drop the "
                         "key or give kv_dtype fp32")


__all__ = ["CPU_GRAPH_SETS", "ExportPlan", "plan_export", "plan_precision", "source_kind"]
