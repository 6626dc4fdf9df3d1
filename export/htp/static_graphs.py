"""Static-shape graphs for the Qualcomm HTP (QNN execution provider).

Layout (after Qualcomm AI Hub's own LLM exports): two Talker graphs
over one set of weights, a prompt processor of ``S = shapes.prefill_chunk``
positions (``talker_prefill``) and a token generator of one position
(``talker_decode``), both over a fixed context ``C = shapes.context``:

inputs
  ``inputs_embeds``        f32 [1, S, H]
  ``attention_mask``       f32 [1, 1, S, C]   additive: 0 = attend, ``mask_value`` = masked
  ``rope_cos``/``rope_sin`` f32 [1, S, head_dim]
  ``past_key_{l}_in``      kv [kv, 1, head_dim, C-S]   keys transposed
  ``past_value_{l}_in``    kv [kv, 1, C-S, head_dim]
outputs
  ``logits``               f32 [1, S, vocab]   every position (the host picks the last valid one)
  ``hidden``               f32 [1, S, H]       final-norm hidden, every position
  ``new_key_{l}``          kv [kv, 1, head_dim, S]   only the new entries
  ``new_value_{l}``        kv [kv, 1, S, head_dim]

``kv`` is the KV I/O type (``kztts.bundle.graphs.HTP_KV_DTYPES``, manifest ``kv_dtype``, target key
``kv_dtype``): float16 by default for fp16 graphs (the HTP computes in fp16 anyway; a Cast at each
end keeps the CPU EP's math in fp32), float32 for QDQ graphs unless the target asks for uint8.

Key slots 0..C-S-1 are the host's cache (the first C-S of its C-1 slots), slots
C-S..C-1 are the S new positions; the mask says which are valid
(``kztts.runners.talker_static`` builds it). The mask value is finite (default -50, the
target's ``attention_mask_value``): -inf or -65504 overflow in fp16 arithmetic
and ruin 16-bit activation quantization. It is not added to the scores: a masked
score becomes the row's smallest score plus the mask value
(``kztts.export.common.qwen3_stack.mask_scores``; Qwen2.5's scores reach 1e4).

Also for the HTP: ``cp_frame`` (the Code Predictor's 15 steps unrolled with in-graph
sampling, from ``kztts.export.graphs.code_predictor_graph``; it is static already) and,
when the target places the decoder on the HTP, ``decoder_chunk`` (the streaming
speech decoder over ``shapes.decoder_chunk`` frames with explicit state; fp16, or w8a16 with
``kztts export --decoder w8a16``).

RMSNorm is rewritten fp16-safe (``x / s`` with ``s = max(1, max|x|)`` before
squaring, mathematically identical): a plain RMSNorm squares activations and
saturates at 65504 in fp16 (an activation of 2000 already gives a wrong norm).
"""
from __future__ import annotations

import gc
import logging
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from kztts.bundle import graphs as G
from kztts.bundle.manifest import GraphSpec, read_manifest, write_manifest
from kztts.bundle.segments import STATIC_STATS
from kztts.core.errors import KzttsError
from kztts.export.common.decoder_qdq import HTP_RECIPE, quantize_decoder_graph
from kztts.export.common.onnx_export import export_onnx
from kztts.export.common.qwen3_stack import Qwen3Stack
from kztts.export.graphs.code_predictor_graph import export_cp_frame
from kztts.export.graphs.codec_graphs import DecoderOptions, DecoderStep, _decoder_of, _example_codes
from kztts.export.common.graph_parts import graph_spec, stamp_graph, with_file_bytes
from kztts.export.graphs.segment_graphs import export_talker_segments
from kztts.export.graphs.static_layers import MagnitudeProbe, SafeRMSNorm, StaticLayer, check_static, probed_layer
from kztts.export.graphs.talker_graph import check_rope_is_1d, talker_shape
from kztts.export.htp.calibration import CP_FRAME, DECODER_CHUNK, CalibrationSource
from kztts.export.htp.kv_quant import quantize_uint8_kv, read_kv_scales
from kztts.export.htp.qdq import QDQ_WEIGHT_BITS, quantize_graphs
from kztts.htp.placement import LayerPlacement
from kztts.htp.qnn import bundle_target, create_session, qnn_available, qnn_unavailable_reason
from kztts.htp.targets import Target, load_target
from kztts.export.htp.export_plan import ExportPlan

log = logging.getLogger(__name__)

PREFILL = "talker_prefill"
DECODE = "talker_decode"
# no Pow and no ConvTranspose on the HTP: see export_decoder_chunk
HTP_DECODER_OPTIONS = DecoderOptions(fold_snake=True, tconv_as_conv=True)
CP_QUANTIZED_SCOPES = ("/proj", "/stack", "/heads.")  # cp_frame's nodes a QDQ graph quantizes: its sampler stays float


class TalkerStaticGraph(nn.Module):
    """forward(inputs_embeds, attention_mask, rope_cos, rope_sin, past_key_0_in, past_value_0_in, ...)
    -> (logits [1,S,V], hidden [1,S,H], new_key_0, new_value_0, ..., layer_stats [L, len(LAYER_STATS)],
    head_stats [len(HEAD_STATS)]), shapes in the module docstring. The stats are the layer graphs'
    magnitude probes (``kztts.bundle.segments``), so the run-time fp16 guard covers the whole-stack
    graphs too."""

    def __init__(self, talker, seq: int, context: int, safe_norm: bool = True, kv_dtype: str = "fp32"):
        super().__init__()
        self.kv_dtype = getattr(torch, G.KV_NUMPY[kv_dtype])  # fp16: Casts at the KV ends, math in fp32
        check_rope_is_1d(talker)
        if not 0 < seq < context:
            raise ValueError(f"static talker: need 0 < seq ({seq}) < context ({context})")
        s = talker_shape(talker)
        self.shape, self.seq, self.context = s, seq, context
        layers = nn.ModuleList(StaticLayer(layer, safe_norm) for layer in talker.model.layers)
        norm = SafeRMSNorm(talker.model.norm) if safe_norm else talker.model.norm
        self.stack = Qwen3Stack(layers, norm, num_heads=s.num_heads, num_kv_heads=s.num_kv_heads,
                                head_dim=s.head_dim)
        self.probe = MagnitudeProbe()
        self.codec_head = talker.codec_head

    @property
    def past(self) -> int:
        return self.context - self.seq

    def forward(self, inputs_embeds, attention_mask, rope_cos, rope_sin, *past):
        s = self.shape
        kv, hd, S, P = s.num_kv_heads, s.head_dim, self.seq, self.past
        if self.kv_dtype != torch.float32:  # (a float32 graph gets no identity Casts)
            past = [p.float() for p in past]
        pk = [p.reshape(1, kv, hd, P) for p in past[0::2]]  # [kv,1,..] -> [1,kv,..]: no data movement
        pv = [p.reshape(1, kv, P, hd) for p in past[1::2]]
        mask = attention_mask.reshape(1, 1, 1, S, self.context)
        h, kv_out, stats = inputs_embeds, [], []
        for layer, k_in, v_in in zip(self.stack.layers, pk, pv):
            h, k, v, layer_stats = probed_layer(self.stack, layer, self.probe, h, rope_cos, rope_sin, k_in, v_in, mask)
            kv_out += [k.reshape(kv, 1, hd, S), v.reshape(kv, 1, S, hd)]
            stats.append(layer_stats)
        hidden = self.stack.norm(h)
        logits = self.codec_head(hidden)
        if self.kv_dtype != torch.float32:
            kv_out = [t.to(self.kv_dtype) for t in kv_out]
        return (logits, hidden, *kv_out, torch.stack(stats), self.probe((h,), (logits,)))

    def io_names(self) -> tuple[list[str], list[str]]:
        layers = range(self.shape.num_layers)
        kv_in = [G.STATIC_KV.past_name(kind, i) for i in layers for kind in ("key", "value")]
        kv_out = [G.STATIC_KV.new_name(kind, i) for i in layers for kind in ("key", "value")]
        return (["inputs_embeds", "attention_mask", "rope_cos", "rope_sin", *kv_in],
                ["logits", "hidden", *kv_out, STATIC_STATS[0], STATIC_STATS[1]])

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        s, S, P = self.shape, self.seq, self.past
        g = torch.Generator().manual_seed(0)
        x = torch.randn(1, S, s.hidden, generator=g)
        mask = torch.zeros(1, 1, S, self.context)
        cos, sin = torch.randn(1, S, s.head_dim, generator=g), torch.randn(1, S, s.head_dim, generator=g)
        past = []
        for _ in range(s.num_layers):
            past += [torch.randn(s.num_kv_heads, 1, s.head_dim, P, generator=g).to(self.kv_dtype),
                     torch.randn(s.num_kv_heads, 1, P, s.head_dim, generator=g).to(self.kv_dtype)]
        return (x, mask, cos, sin, *past)


def export_static_talker(talker, path: Path, seq: int, context: int, safe_norm: bool = True,
                         kv_dtype: str = "fp32") -> Path:
    graph = TalkerStaticGraph(talker, seq, context, safe_norm, kv_dtype).eval()
    ins, outs = graph.io_names()
    export_onnx(graph, graph.example_inputs(), path, ins, outs, None)
    check_static(path)
    return path


def _spec(work_dir: Path, name: str, rel: str, precision: str, export_id: str, target: Target,
          **extra) -> GraphSpec:
    spec = graph_spec(work_dir, name, rel, "static", precision, export_id)
    return replace(spec, extra={**spec.extra, "target": target.name, "soc_model": target.soc.soc_model,
                                "htp_arch": target.soc.htp_arch, **extra})


def _release_torch_weights(model, calibration: CalibrationSource) -> None:
    """Once the float graphs are written, a calibration source that reads only them (an LM's texts) lets the
    torch weights go: 6.2 GB at 1.5B in fp32, not held beside the calibration sessions and the quantizer's
    ModelProto. "meta" keeps their shapes (the manifest reads the config only)."""
    if not calibration.reads_torch_model:
        model.talker.to("meta")


def _talker_at_precision(model, work_dir: Path, float_files: dict[str, str], target: Target, precision: str,
                         kv: str, calibration: CalibrationSource | None,
                         matmul_precisions: dict | None = None) -> dict[str, str]:
    """{graph: file to ship} of the Talker's float static graphs ``float_files`` at ``precision``. A float precision
    (fp16) ships them as they are: the HTP computes them in fp16. A quantized one ships QDQ graphs calibrated on
    ``calibration`` (``kztts.export.htp.qdq``; ``matmul_precisions`` {graph: {MatMul key: precision}} from a
    precision plan), with 8-bit KV I/O of fixed scales where the target's KV type is uint8
    (``kztts.export.htp.kv_quant``)."""
    if not G.htp_precision(precision).quantized:
        return dict(float_files)
    _release_torch_weights(model, calibration)
    if kv == "uint8":
        return quantize_uint8_kv(work_dir, float_files, target, calibration, precision=precision,
                                 matmul_precisions=matmul_precisions)
    return quantize_graphs(work_dir, float_files, calibration, target, precision=precision,
                           matmul_precisions=matmul_precisions)


def _check_calibration(plan: ExportPlan, calibration: CalibrationSource | None) -> None:
    """A QDQ graph needs its calibration data."""
    quantized = G.htp_precision(plan.precision).quantized or (plan.placement is not None and plan.placement.quantized)
    if calibration is None and quantized:
        raise ValueError("QDQ graphs need calibration data: export_htp_graphs(calibration=None) writes float "
                         "graphs only")


def _static_talker(model, work_dir: Path, export_id: str, target, precision: str, kv: str,
                   calibration: CalibrationSource | None, plan: LayerPlacement | None = None) -> dict[str, GraphSpec]:
    """The whole-stack Talker graphs the target places on the HTP, float then built at ``precision`` (a quantized
    ``plan``: each MatMul at its ``whole_stack_precisions``)."""
    S, C = target.shapes.prefill_chunk, target.shapes.context
    common = dict(context=C, mask_value=target.attention_mask_value, target_shapes={
        "prefill_chunk": S, "context": C, "decoder_chunk": target.shapes.decoder_chunk})
    float_files: dict[str, tuple[str, int]] = {}
    # an HTP prefill also needs the decode graph: prompt positions past C - S run through it
    talker_graphs = [(n, seq) for n, seq in ((PREFILL, S), (DECODE, 1))
                     if target.on_htp(n) or (n == DECODE and target.on_htp(PREFILL))]
    for name, seq in talker_graphs:
        rel = f"graphs/{name}.onnx"
        export_static_talker(model.talker, work_dir / rel, seq, C, kv_dtype=kv if kv != "uint8" else "fp32")
        float_files[name] = (rel, seq)
    specs: dict[str, GraphSpec] = {}
    if not float_files:
        return specs
    matmuls = None
    if plan is not None and plan.quantized:
        per_matmul = plan.whole_stack_precisions()
        matmuls = {n: per_matmul for n in float_files}
        common["matmul_precisions"] = {k: p for k, p in per_matmul.items() if p != precision}
        log.info("whole-stack Talker graphs at %s, %d MatMuls at another precision (plan %s)", precision,
                 len(common["matmul_precisions"]), plan.source or plan.mode)
    files = _talker_at_precision(model, work_dir, {n: r for n, (r, _) in float_files.items()}, target, precision, kv,
                                 calibration, matmuls)
    for name, (rel, seq) in float_files.items():
        if kv == "uint8":  # the fixed scales the host needs to read the cache back as floats
            common["kv_scales"] = read_kv_scales(work_dir / files[name], talker_shape(model.talker).num_layers)
        specs[name] = _spec(work_dir, name, files[name], precision, export_id, target, seq=seq, kv_dtype=kv,
                            **common)
    if target.talker_graphs == "prefill-only" and PREFILL in specs:
        _drop_graph(work_dir, specs, DECODE, {float_files[DECODE][0], files[DECODE]})
    return specs


def _segment_variants(model, work_dir: Path, specs: dict[str, GraphSpec], plan: LayerPlacement, target,
                      seg_spec, calibration: CalibrationSource) -> dict[str, GraphSpec]:
    """The QDQ layer graphs ``plan`` runs (``quantized_units``): ``talker_{phase}_layer_{l}_{precision}`` beside the
    float ones, each calibrated on its own inputs while the float layer graphs run ``calibration``'s data."""
    from kztts.bundle.segments import segment_graph_name

    drive = {n: s.file for n, s in specs.items() if s.extra.get("segment")}
    out: dict[str, GraphSpec] = {}
    by_precision: dict[str, dict[str, str]] = {}
    for phase, unit, precision in plan.quantized_units():
        by_precision.setdefault(precision, {})[segment_graph_name(phase, unit)] = (phase, unit)
    for precision, units in by_precision.items():
        files = {name: drive[name] for name in units}
        matmuls = {name: plan.unit_matmuls(ph, u) for name, (ph, u) in units.items()}
        first = {name: (u if u != "head" else 0) for name, (_, u) in units.items()}
        _release_torch_weights(model, calibration)
        q = quantize_graphs(work_dir, files, calibration, target, precision=precision, drive=drive,
                            matmul_precisions=matmuls, first_layers=first, keep_float=True)
        for name in files:  # a float layer graph may now read its weights from its twin's data file
            specs[name] = with_file_bytes(work_dir, specs[name])
        for name, (phase, unit) in units.items():
            base = specs[name].extra
            variant = segment_graph_name(phase, unit, precision)
            out[variant] = seg_spec(variant, q[name], precision=precision, seq=base["seq"], context=base["context"],
                                    phase=phase, unit=unit, stats=base["stats"], base=name,
                                    matmul_precisions=matmuls[name])
    return out


def export_htp_graphs(model, work_dir: Path, *, export_id: str, plan: ExportPlan,
                      calibration: CalibrationSource | None, talker_only: bool = False) -> dict[str, GraphSpec]:
    """The static HTP graphs of ``plan.target`` into ``work_dir/graphs`` (``plan``:
    ``kztts.export.htp.export_plan.ExportPlan``, which decided the precisions).

    Returns manifest specs by graph name: ``talker_prefill`` and ``talker_decode`` (when placed on the HTP) at
    ``plan.precision`` (``kztts.bundle.graphs.HTP_PRECISIONS``: a float graph the HTP computes in fp16, or a QDQ
    graph calibrated on ``calibration``'s data, ``kztts.export.htp.calibration``: the TTS prompts or an LM's texts;
    None writes float graphs only). ``plan.context_binary`` adds EPContext models prepared for the target
    (``extra.context_file``). ``plan.segments`` adds the Talker as per-layer graphs
    (``kztts.export.graphs.segment_graphs``; float, fp16 on the HTP) so a layer placement can be chosen at load
    time. ``talker_only``: no Code Predictor or decoder graphs (a causal LM, ``kztts.export.lm.bundle_writer``, is
    a Talker-shaped stack only).
    ``plan.placement``: a precision plan (``kztts.htp.placement``): with ``segments`` the QDQ variants of the layer
    graphs it runs quantized, else whole-stack QDQ graphs with its precision per MatMul; its ``graphs.cp_frame``
    precision for the Code Predictor. ``plan.decoder_precision``: the ``decoder_chunk``'s (``kztts export --decoder
    w8a16``; fp16 by default) when the target places the decoder on the HTP.
    """
    _check_calibration(plan, calibration)
    target, precision, kv, segments = plan.target, plan.precision, plan.htp_kv, plan.segments
    placement = plan.placement
    work_dir = Path(work_dir)
    limit = int(model.config.talker_config.max_position_embeddings)
    if target.shapes.context - 1 > limit:
        raise KzttsError(f"{target.path}: shapes.context {target.shapes.context} exceeds the model's {limit} "
                         "positions")
    specs = _static_talker(model, work_dir, export_id, target, precision, kv, calibration, plan.whole_stack_plan)
    if segments:
        def seg_spec(name: str, rel: str, precision: str = G.FLOAT_HTP_PRECISION, **extra) -> GraphSpec:
            return _spec(work_dir, name, rel, precision, export_id, target, mask_value=target.attention_mask_value,
                         segment=True, **extra)

        specs.update(export_talker_segments(model, work_dir, export_id=export_id, target=target, spec_fn=seg_spec))
        if placement is not None and placement.quantized_units():
            specs.update(_segment_variants(model, work_dir, specs, placement, target, seg_spec, calibration))

    if target.on_htp("cp_frame") and not talker_only:
        cp_precision = (placement.graphs.get("cp_frame") if placement is not None else None) or \
            (precision if placement is None else G.FLOAT_HTP_PRECISION)
        spec = export_cp_frame_htp(model, work_dir, export_id, target, cp_precision, calibration)
        if spec is not None:
            specs["cp_frame"] = spec
    if target.on_htp("decoder") and not talker_only:
        specs[DECODER_CHUNK] = export_decoder_chunk(model, work_dir, export_id, target, plan.decoder_precision,
                                                    calibration)

    if plan.context_binary and specs:
        binaries = {n: s for n, s in specs.items() if not s.extra.get("segment")}  # segments: chosen at load
        specs.update(_with_context_binaries(work_dir, binaries, target, export_id))
    return specs


def _drop_graph(work_dir: Path, specs: dict[str, GraphSpec], name: str, files: set[str]) -> None:
    """Remove graph ``name`` from the export (``talker_graphs: prefill-only``: the decode graph was
    only needed to calibrate a QDQ graph; ``kztts.runners.talker_prefill_only`` serves decode steps)."""
    specs.pop(name, None)
    for rel in files:
        for f in (work_dir / rel, work_dir / f"{rel}.data"):
            f.unlink(missing_ok=True)


def export_cp_frame_htp(model, work_dir: Path, export_id: str, target: Target,
                        precision: str = G.FLOAT_HTP_PRECISION,
                        calibration: CalibrationSource | None = None) -> GraphSpec | None:
    """The Code Predictor frame graph (15 unrolled steps, in-graph sampling) for the HTP.

    It is static already, so the CPU bundle's ``graphs/cp_frame.onnx`` is reused when the CPU export wrote
    it, and the CPU keeps running it (fp32). At a quantized ``precision`` the HTP runs a QDQ version beside it
    (``extra.htp_file``, calibrated on ``calibration``'s data at each frame while the CPU Talker speaks): its stack
    and heads quantized (``CP_QUANTIZED_SCOPES``), its in-graph sampling (TopK, CumSum, comparisons) float (fp16
    on the HTP)."""
    rel = "graphs/cp_frame.onnx"
    if not (work_dir / rel).is_file():
        export_cp_frame(model, work_dir / rel)
    extra = {}
    if G.htp_precision(precision).quantized:
        htp_rel = quantize_graphs(work_dir, {CP_FRAME: rel}, calibration, target, precision=precision, drive={},
                                  scopes={CP_FRAME: CP_QUANTIZED_SCOPES}, keep_float=True)[CP_FRAME]
        stamp_graph(work_dir / htp_rel, "cp_frame", export_id)
        extra["htp_file"] = htp_rel
    return _spec(work_dir, "cp_frame", rel, precision, export_id, target, cpu_precision="fp32", **extra)


def export_decoder_chunk(model, work_dir: Path, export_id: str, target: Target,
                         precision: str = G.FLOAT_HTP_PRECISION,
                         calibration: CalibrationSource | None = None) -> GraphSpec:
    """The streaming speech decoder (``kztts.export.graphs.codec_graphs.DecoderStep``) over a fixed
    chunk of ``shapes.decoder_chunk`` frames: graph ``decoder_chunk`` with the I/O of
    ``decoder_stream`` (codes [1, F, 16], position [1], state_* -> wav [1, F*1920], new_state_*)
    at static shapes, with SnakeBeta folded (``HTP_DECODER_OPTIONS``), at ``precision``
    (``kztts.bundle.graphs.HTP_DECODER_PRECISIONS``): fp16 (a float graph), or w8a16
    (``kztts.export.common.decoder_qdq.HTP_RECIPE``: the float graph quantized, ``graphs/decoder_chunk.w8a16.onnx``).

    Why folded: SnakeBeta's ``pow(sin(x * alpha), 2)`` is inexact on the HTP in fp16 (measured on the
    simulator, tiny model, one 5-frame run, per-tensor SNR vs the CPU EP: 55 dB at the third ``Sin``,
    25.7 dB at the ``Add`` after its ``Pow``); written ``s * s`` it stays exact to fp16. Whole
    decoder on 10 frames: 21 dB plain, 46.9 dB folded (``tests/export/validate/test_decoder.py``).

    Why no ConvTranspose (each written as a Conv giving ``stride`` samples per input position in its channels,
    interleaved by Reshape/Transpose: ``tconv_as_conv``, the same function): at the 0.6B's widths the simulator
    computes the w8a16 graph with ConvTranspose nodes wrongly (-0.05 dB against the fp32 CPU decoder, while the
    CPU EP on the same QDQ graph gives 17.6 dB; no shift of the output explains it, and the same graph with its
    intermediate tensors exposed as outputs comes out right, 49.5 dB against the CPU EP: a fault of the HTP's graph
    preparation around those nodes, onnxruntime-qnn 2.7.0). Without ConvTranspose it gives 17.7 dB
    (docs/PRECISION.md, "The HTP decoder at w8a16").

    w8a16's calibration: the frames the model speaks on ``calibration``'s prompts (``TtsPrompts``: the Talker
    and Code Predictor graphs' calibration prompts, CB0 greedy, CB1..15 from the Code Predictor), decoded by the
    float graph as the runtime decodes them, carried state included. Those are the codes a bundle's decoder
    is given, from the same route as the Talker's and ``cp_frame``'s QDQ graphs. Not the codec encoder's codes
    of a test signal: its decoder never gets them at run time, and on a random-weight model they are no more
    speech than the model's own. The fixed 16-bit ranges then fit speech codes; ``kztts validate --target``
    decodes seeded random codes, which reach codebook entries these frames do not (its bound is set on those)."""
    entry = G.htp_precision(precision)
    if not entry.decoder_bounds:
        raise KzttsError(f"decoder precision {precision!r} on the HTP: expected one of "
                         f"{', '.join(G.HTP_DECODER_PRECISIONS)}")
    if entry.quantized and calibration is None:
        raise ValueError(f"a {precision} decoder_chunk needs calibration data")
    st = _decoder_of(model)
    step = DecoderStep(st.decoder, HTP_DECODER_OPTIONS).eval()
    frames = target.shapes.decoder_chunk
    names = [n for n, _ in step.state_specs]
    ins = ["codes", "position"] + [f"state_{n}" for n in names]
    outs = ["wav"] + [f"new_state_{n}" for n in names]
    rel = f"graphs/{DECODER_CHUNK}.onnx"
    example = (_example_codes(frames, step.bins), torch.tensor([0], dtype=torch.int64), *step.zero_state())
    export_onnx(step, example, work_dir / rel, ins, outs, None)
    check_static(work_dir / rel)
    if entry.quantized:
        float_rel, rel = rel, rel.replace(".onnx", f".{precision}.onnx")
        quantize_decoder_graph(work_dir / float_rel, work_dir / rel,
                               calibration.feeds(work_dir, {DECODER_CHUNK: float_rel}, DECODER_CHUNK, target),
                               recipe=HTP_RECIPE)
        (work_dir / float_rel).unlink()
    return _spec(work_dir, DECODER_CHUNK, rel, precision, export_id, target, frames=frames,
                 samples_per_frame=step.samples_per_frame,
                 state=[{"name": n, "shape": list(sh)} for n, sh in step.state_specs])


def make_context_binaries(work_dir: Path, files: dict[str, str], target: Target,
                          on_session=None, share: bool | None = None) -> dict[str, dict]:
    """EPContext models ``graphs/<graph>_ctx.onnx`` (+ ``_qnn.bin``) prepared for ``target``.

    Device targets: the graphs are compiled in one process with ``ep.share_ep_contexts``
    so that they land in one QNN context with shared weights (the last session ends the
    sharing group and writes the one ``.bin`` all models point to; measured on the
    tiny Talker: 0.76 MB shared vs 1.37 MB separate). The simulator target gets one
    context per graph: the x86 HTP emulator segfaults reloading a multi-graph,
    weight-shared context (measured with onnxruntime-qnn 2.7.0), so it could not be
    checked here. ``on_session(name, session)`` sees each generating session (tests
    compare its outputs with the reloaded model's). ``share`` overrides the choice (tests make a
    weight-shared context for the simulator to show how it fails: SIGSEGV in ``libQnnHtp.so``,
    ``QnnBackendManager::CreateContextHandleFromBinary``, right after ``Graph count from QNN
    context: 2``). Targets with ``talker_graphs: prefill-only`` have one Talker graph: one weight
    copy without sharing.
    """
    if not qnn_available():
        raise KzttsError(f"--context-binary needs the QNN execution provider: {qnn_unavailable_reason()}")
    names = list(files)
    shared = len(names) > 1 and (target.runs_on == "device" if share is None else share)
    out: dict[str, dict] = {}
    for i, name in enumerate(names):
        src = work_dir / files[name]
        ctx_rel = f"graphs/{name}_ctx.onnx"
        for old in (work_dir / "graphs").glob(f"{name}_ctx*"):
            old.unlink()
        cfg = {"ep.context_enable": "1", "ep.context_file_path": str(work_dir / ctx_rel),
               "ep.context_embed_mode": "0"}
        if shared:
            cfg["ep.share_ep_contexts"] = "1"
            if i == len(names) - 1:
                cfg["ep.stop_share_ep_contexts"] = "1"
        sess = create_session(src, target, strict=True, context=cfg)
        if on_session is not None:
            on_session(name, sess)
        del sess  # its graph and buffers go before the next graph compiles (a shared context is the EP's to keep)
        gc.collect()
        out[name] = {"file": ctx_rel, "shared": shared}
    for name, d in out.items():
        import onnx

        node = onnx.load(str(work_dir / d["file"]), load_external_data=False).graph.node
        bins = sorted({a.s.decode() for n in node for a in n.attribute if a.name == "ep_cache_context"})
        d["binaries"] = [f"graphs/{b}" for b in bins]
    return out


def add_context_binaries(bundle_dir: str | Path, target=None, on_session=None,
                         graphs: list[str] | None = None) -> dict[str, GraphSpec]:
    """Prepare context binaries for the static graphs (or ``graphs``) of an existing bundle and
    record them in its manifest (what ``kztts export --context-binary`` does during the export)."""
    bundle_dir = Path(bundle_dir)
    manifest = read_manifest(bundle_dir)
    specs = {n: g for n, g in manifest.graphs.items() if g.variant == "static" and (graphs is None or n in graphs)}
    if not specs:
        raise RuntimeError(f"{bundle_dir}: no static graphs to prepare")
    if target is None:
        from types import SimpleNamespace

        target = bundle_target(SimpleNamespace(manifest=manifest))
    target = load_target(target)
    new = _with_context_binaries(bundle_dir, specs, target, manifest.data["graphs"][next(iter(specs))]
                                 .get("export_id", ""), on_session)
    data = dict(manifest.data)
    data["graphs"] = {**data["graphs"], **{n: g.to_json() for n, g in new.items()}}
    write_manifest(bundle_dir, data)
    return new


def _with_context_binaries(work_dir: Path, specs: dict[str, GraphSpec], target: Target, export_id: str,
                           on_session=None) -> dict[str, GraphSpec]:
    # one context per sharing group: the two Talker graphs share their weights, the others stand alone
    groups = [[n for n in (PREFILL, DECODE) if n in specs]] + [[n] for n in specs if n not in (PREFILL, DECODE)]
    ctx: dict[str, dict] = {}
    for group in filter(None, groups):
        ctx.update(make_context_binaries(work_dir, {n: specs[n].extra.get("htp_file", specs[n].file) for n in group},
                                         target, on_session))
    out = {}
    for name, d in ctx.items():
        stamp_graph(work_dir / d["file"], name, export_id)
        extra = {**specs[name].extra, "context_file": d["file"], "context_binaries": d["binaries"],
                 "shared_context": d["shared"], "context_target": target.name,
                 "context_bytes": sum((work_dir / b).stat().st_size for b in d["binaries"])}
        out[name] = replace(specs[name], extra=extra)
    return out
