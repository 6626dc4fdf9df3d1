"""Precision variants of an exported bundle: int8 / int4 weights, fp16 KV-cache I/O, int8 decoder.

A variant is a new bundle directory built from an exported fp32 bundle. The graphs it
changes are rewritten; every other file is a hard link to the base (same bytes, no copy), but for the CPU graphs'
shared weights file (``kztts.export.common.onnx_export.share_weights``): the variant writes its own, each weight at
the variant's precision once (the unchanged graphs' weights included), and rewrites every graph file to point there.
``cached_variant`` builds one next to a cached bundle (``kztts bench``); ``variant_output`` is where
``kztts export --weights/--kv/--decoder`` exports a checkpoint (TTS or LM) so that its variant becomes a bundle
of its own.

- weights ``int8`` / ``int4``: every MatMul with a constant weight in ``talker``,
  ``cp_step`` (the 15 heads inside the ``If`` tree included) and ``cp_frame`` becomes a
  ``com.microsoft.MatMulNBits`` (``onnxruntime.quantization.matmul_nbits_quantizer``,
  round-to-nearest, blocks of 128 along K). ``accuracy_level`` 4 lets ONNX Runtime
  quantize the activation row to int8 and use its integer kernels: at M = 1 the
  frame is bound by weight bandwidth, and this is what reads 4 or 8 bits per weight
  instead of 32.
- kv ``fp16``: the KV inputs/outputs of ``talker`` and ``cp_step`` become float16 (a
  Cast at each end; the attention still runs in fp32), halving the host's KV buffers and
  the bytes moved per step. In ``talker_gqa`` the cache is the fused attention's own
  buffer, so there the attention itself runs in float16 (``fp16_gqa``).
- decoder ``int8``: ``decoder`` and ``decoder_stream`` with their MatMuls (transformer,
  projections) as 8-bit MatMulNBits; its convolutions stay fp32 (ONNX Runtime's int8
  ``ConvInteger`` is slower than its fp32 convolution on x86).
- decoder ``int8-static``: ``decoder`` and ``decoder_stream`` with every Conv and MatMul in static int8 QDQ
  (per-channel int8 weights, uint8 activations calibrated on the graph's own calls), which ONNX Runtime runs
  with its int8 convolution kernels (``kztts.export.common.decoder_qdq``).
- decoder ``fp16``: ``decoder`` and ``decoder_stream`` with their weights stored in float16, each behind a Cast
  back to float32 (``fp16_weights``): half the bytes on disk (a device bundle's CPU decoder, ``kztts pack``), and
  ONNX Runtime folds the Casts at load, so the arithmetic stays fp32 over weights rounded to fp16. The variant
  judges its decoder against the base's on seeded random codes and refuses itself below
  ``decoder_snr_db`` of the ``cpu-decoder-fp16`` bounds (``kztts.eval.acceptance``); the manifest's
  ``decoder_check`` keeps the figure.

Changed graphs get the export id ``<base id>-<tag>`` so a graph copied from another variant
is refused at open; unchanged graphs keep the base's entries. The manifest gains
``variant`` = {base, weights, kv, decoder}.
"""
from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Iterator

from kztts.bundle import graphs as G
from kztts.bundle.bundle import Bundle
from kztts.bundle.graphs import DYNAMIC_KV, FUSED_KV
from kztts.bundle.manifest import read_manifest, write_manifest
from kztts.core.build_cache import build_once, code_key, exclusive_output, scratch_dir, staged_dir
from kztts.core.errors import KzttsError
from kztts.core.metrics import snr_db
from kztts.eval.acceptance import BOUNDS
from kztts.runners.codec import Decoder, decoder_codes, decoder_kwargs
from kztts.export.common.decoder_qdq import decoder_feeds, quantize_decoder_graph
from kztts.bundle.manifest import GraphSpec
from kztts.bundle.table_compact import COMPACT_TABLES, compact_tables
from kztts.bundle.table_views import view_tables
from kztts.export.common.graph_parts import graph_spec, share_graph_weights
from kztts.export.common.onnx_export import unshare_weights
from kztts.export.common.bundle_output import check_output, link_tree

log = logging.getLogger(__name__)

WEIGHT_GRAPHS = ("talker", "cp_step", "cp_frame", "talker_gqa", "cp_frame_gqa", "talker_batched", "cp_frame_batched",
                 *G.HYBRID_CPU_GRAPHS)
KV_GRAPHS = ("talker", "cp_step", "talker_gqa", "talker_batched")
FUSED_KV_GRAPHS = ("talker_gqa", "talker_batched")  # the cache is the fused attention's own buffer
DECODER_GRAPHS = ("decoder", "decoder_stream")
BLOCK_SIZE = 128
ACCURACY_LEVEL = 4  # int8 activations: ONNX Runtime's integer MatMulNBits kernels


def variant_tag(weights: str, kv: str, decoder: str = "fp32") -> str:
    """Short name of a variant, e.g. ``w-int4.kv-fp16.dec-fp32``."""
    _check(weights, kv, decoder)
    return f"w-{weights}.kv-{kv}.dec-{decoder}"


def _check(weights: str, kv: str, decoder: str) -> None:
    for what, value, allowed in (("weights", weights, G.CPU_WEIGHT_PRECISIONS), ("kv", kv, G.KV_PRECISIONS),
                                 ("decoder", decoder, G.DECODER_PRECISIONS)):
        if value not in allowed:
            raise KzttsError(f"{what} precision {value!r} is not one of {', '.join(allowed)}")


# ---------------------------------------------------------------- graph rewrites
def quantize_matmuls(model, bits: int, *, block_size: int = BLOCK_SIZE, accuracy_level: int = ACCURACY_LEVEL,
                     symmetric: bool | None = None):
    """``model`` (onnx.ModelProto) with its constant-weight MatMuls as ``bits``-bit MatMulNBits.

    Symmetric for 8 bits (no zero points to read), asymmetric for 4 bits (the zero point
    buys accuracy where 16 levels are all there is), unless ``symmetric`` says otherwise."""
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    _fold_weight_identities(model.graph)
    sym = (bits == 8) if symmetric is None else symmetric
    cfg = DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=sym, accuracy_level=accuracy_level,
                                       bits=bits)
    q = MatMulNBitsQuantizer(model, bits=bits, block_size=block_size, is_symmetric=sym,
                             accuracy_level=accuracy_level, algo_config=cfg)
    qlog = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = qlog.level
    qlog.setLevel(logging.WARNING)  # it logs every node it visits at INFO
    try:
        q.process()
    finally:
        qlog.setLevel(level)
    out = q.model.model
    _share_quantized_weights(out.graph, bits)
    return out


def _fold_weight_identities(graph) -> int:
    """Let MatMuls read shared weights directly: the TorchScript exporter reaches a weight used
    by several unrolled steps (``cp_frame``) through ``Identity`` nodes, which the quantizer does
    not look through (those MatMuls would stay fp32). Returns the number of nodes removed."""
    inits = {i.name for i in graph.initializer}
    alias = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Identity" and n.input[0] in inits}
    outputs = {o.name for o in graph.output}
    alias = {k: v for k, v in alias.items() if k not in outputs}
    if not alias:
        return 0
    keep = [n for n in graph.node if not (n.op_type == "Identity" and n.output[0] in alias)]
    for n in keep:
        for i, name in enumerate(n.input):
            if name in alias:
                n.input[i] = alias[name]
    del graph.node[:]
    graph.node.extend(keep)
    return len(alias)


def _share_quantized_weights(graph, bits: int) -> int:
    """Turn the MatMuls left on a weight the quantizer already packed for another MatMul
    (it quantizes each initializer once, then drops it) into MatMulNBits over the same
    packed weight. Returns the number of nodes rewritten."""
    from onnx import helper

    inits = {i.name for i in graph.initializer}
    packed = {}
    for n in graph.node:
        if n.op_type == "MatMulNBits" and n.input[1].endswith(f"_Q{bits}"):
            packed.setdefault(n.input[1][: -len(f"_Q{bits}")], n)
    count = 0
    nodes = []
    for n in graph.node:
        src = packed.get(n.input[1]) if n.op_type == "MatMul" and len(n.input) == 2 else None
        if src is not None and n.input[1] not in inits:
            attrs = {a.name: helper.get_attribute_value(a) for a in src.attribute}
            n = helper.make_node("MatMulNBits", [n.input[0], *src.input[1:]], list(n.output),
                                 name=n.name + f"_Q{bits}", domain="com.microsoft", **attrs)
            count += 1
        nodes.append(n)
    del graph.node[:]
    graph.node.extend(nodes)
    return count


def _rename_uses(graph, old: str, new: str) -> None:
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
    for vi in graph.value_info:
        if vi.name == old:
            vi.name = new


def fp16_kv_io(model, prefixes: tuple[str, ...] = (DYNAMIC_KV.past_name("key", ""), DYNAMIC_KV.past_name("value", "")),
               out_prefixes: tuple[str, ...] = (DYNAMIC_KV.new_name("key", ""), DYNAMIC_KV.new_name("value", ""))):
    """Make the KV graph inputs/outputs float16: Cast to float32 after each input, Cast to
    float16 before each output. The arithmetic in between is unchanged."""
    from onnx import TensorProto, helper

    g = model.graph
    casts = []
    for inp in g.input:
        if inp.name.startswith(prefixes) and inp.type.tensor_type.elem_type == TensorProto.FLOAT:
            inner = inp.name + "_f32"
            _rename_uses(g, inp.name, inner)
            inp.type.tensor_type.elem_type = TensorProto.FLOAT16
            casts.append(helper.make_node("Cast", [inp.name], [inner], to=TensorProto.FLOAT,
                                          name=f"kv_in_cast_{inp.name}"))
    for out in g.output:
        if out.name.startswith(out_prefixes) and out.type.tensor_type.elem_type == TensorProto.FLOAT:
            inner = out.name + "_f32"
            for node in g.node:
                for i, name in enumerate(node.output):
                    if name == out.name:
                        node.output[i] = inner
            _rename_uses(g, out.name, inner)
            out.type.tensor_type.elem_type = TensorProto.FLOAT16
            casts.append(helper.make_node("Cast", [inner], [out.name], to=TensorProto.FLOAT16,
                                          name=f"kv_out_cast_{out.name}"))
    if not casts:
        raise ValueError("no float32 KV inputs/outputs to convert")
    # inputs' casts first so the node list stays topologically sorted
    first = [c for c in casts if c.name.startswith("kv_in_")]
    last = [c for c in casts if c.name.startswith("kv_out_")]
    nodes = first + list(g.node) + last
    del g.node[:]
    g.node.extend(nodes)
    return model


def fp16_gqa(model):
    """Run every GroupQueryAttention node in float16 with float16 KV inputs/outputs: q/k/v
    are cast to float16 before it and its output back to float32 after it; the graph
    inputs ``past_*``, ``cos_cache``, ``sin_cache`` and outputs ``present_*`` become float16."""
    from onnx import TensorProto, helper

    g = model.graph
    kv_in = tuple(FUSED_KV.past_name(k, "") for k in ("key", "value"))
    kv_out = tuple(FUSED_KV.new_name(k, "") for k in ("key", "value"))
    fp16_inputs = [i for i in g.input if i.name.startswith(kv_in) or i.name in ("cos_cache", "sin_cache")]
    fp16_outputs = [o for o in g.output if o.name.startswith(kv_out)]
    if not fp16_inputs or not any(n.op_type == "GroupQueryAttention" for n in g.node):
        raise ValueError("not a GroupQueryAttention graph with KV inputs")
    for vi in fp16_inputs + fp16_outputs:
        vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    nodes = []
    for n in g.node:
        if n.op_type != "GroupQueryAttention":
            nodes.append(n)
            continue
        for i in range(3):
            cast = f"{n.input[i]}_f16_{n.name or id(n)}"
            nodes.append(helper.make_node("Cast", [n.input[i]], [cast], to=TensorProto.FLOAT16,
                                          name=f"gqa_in_cast_{cast}"))
            n.input[i] = cast
        out = n.output[0]
        n.output[0] = out + "_f16"
        nodes.append(n)
        nodes.append(helper.make_node("Cast", [n.output[0]], [out], to=TensorProto.FLOAT, name=f"gqa_out_cast_{out}"))
    del g.node[:]
    g.node.extend(nodes)
    del g.value_info[:]  # stale float32 shapes of the KV edges; ONNX Runtime re-infers them
    return model


def fp16_weights(model, min_elements: int = 1024) -> int:
    """Store the float32 initializers of ``model``'s main graph with at least ``min_elements`` values in float16,
    each behind a Cast back to float32 under its old name (module docstring); one beyond fp16's range is kept.
    Returns how many were converted."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    g = model.graph
    keep, casts = [], []
    for t in g.initializer:
        if t.data_type != TensorProto.FLOAT or np.prod(t.dims, dtype=np.int64) < min_elements:
            keep.append(t)
            continue
        w = numpy_helper.to_array(t)
        with np.errstate(over="ignore"):
            half = w.astype(np.float16)
        if not np.all(np.isfinite(half) | ~np.isfinite(w)):
            keep.append(t)
            continue
        keep.append(numpy_helper.from_array(half, f"{t.name}_fp16"))
        casts.append(helper.make_node("Cast", [f"{t.name}_fp16"], [t.name], to=TensorProto.FLOAT,
                                      name=f"{t.name}_to_fp32"))
    del g.initializer[:]
    g.initializer.extend(keep)
    nodes = casts + list(g.node)
    del g.node[:]
    g.node.extend(nodes)
    return len(casts)


def decoder_check(base: Path, variant: Path, frames: int = 10) -> dict:
    """The variant's CPU decoder against the base's on seeded random codes (the arithmetic, over the whole
    codebooks): ``{"graph", "frames", "snr_db", "bound"}``; raises below the bound."""
    wavs, codes = [], None
    for where in (base, variant):
        bundle = Bundle.open(where, load_graphs=False)
        graph = "decoder_stream" if "decoder_stream" in bundle.manifest.graphs else "decoder"
        kwargs = decoder_kwargs(bundle, graph, {})
        codes = decoder_codes(frames, kwargs["codebook_size"]) if codes is None else codes
        wavs.append(Decoder(bundle.session(graph), **kwargs).decode(codes))
    snr = float(snr_db(wavs[1], wavs[0]))
    bound = BOUNDS["cpu-decoder-fp16"]["decoder_snr_db"][1]
    if not snr >= bound:
        raise KzttsError(f"{variant}: its fp16-weight decoder is {snr:.1f} dB from the fp32 one, under the "
                         f"{bound:.0f} dB bound; keep the decoder fp32 (leave out --decoder fp16)")
    return {"graph": graph, "frames": frames, "snr_db": round(snr, 2), "bound": bound}


def _save(model, path: Path) -> None:
    import onnx

    big = model.ByteSize() > 1_800_000_000
    path.parent.mkdir(parents=True, exist_ok=True)  # every graph of the folder may be rewritten (LM bundles)
    onnx.save_model(model, str(path), save_as_external_data=big, all_tensors_to_one_file=True,
                    location=path.name + ".data" if big else None)


# ---------------------------------------------------------------- bundles
def _external_data_files(bundle: Path, rel: str) -> set[str]:
    """Bundle-relative paths of the external-data files graph ``rel`` reads (graphs over 2 GB)."""
    import onnx

    model = onnx.load(str(bundle / rel), load_external_data=False)
    where = Path(rel).parent
    return {(where / e.value).as_posix() for t in model.graph.initializer for e in t.external_data
            if e.key == "location"}


def make_variant(base: str | Path, out: str | Path, *, weights: str = "int4", kv: str = "fp32",
                 decoder: str = "fp32", block_size: int = BLOCK_SIZE, accuracy_level: int = ACCURACY_LEVEL) -> Path:
    """Write the variant of bundle ``base`` into ``out`` (replaced if it exists). ``block_size`` and
    ``accuracy_level``: the int8/int4 weights' MatMulNBits settings (benchmarks compare them; bundles keep
    the defaults)."""
    import onnx

    _check(weights, kv, decoder)
    base, out = Path(base), Path(out)
    manifest = read_manifest(base)
    data = json.loads(json.dumps(manifest.data))
    tag = variant_tag(weights, kv, decoder)
    changes: dict[str, list[str]] = {}
    for name in WEIGHT_GRAPHS if weights != "fp32" else ():
        changes.setdefault(name, []).append(weights)
    for name in KV_GRAPHS if kv != "fp32" else ():
        changes.setdefault(name, []).append("kv-fp16")
    for name in DECODER_GRAPHS if decoder != "fp32" else ():
        changes.setdefault(name, []).append(decoder)
    changes = {n: c for n, c in changes.items() if n in manifest.graphs}
    shared = manifest.data.get("weights")  # the base's one weights file: the variant writes its own
    with staged_dir(out) as work:
        rewritten = {manifest.graphs[n].file for n in changes}
        # quantized weights: the tables compact too (kztts.bundle.table_compact.compact_tables)
        tables = {manifest.embeddings[n]["file"] for n in COMPACT_TABLES if n in manifest.embeddings} \
            if weights != "fp32" else set()
        # their external-data files too: onnx.load refuses a data file with a second hard link
        link_tree(base, work, rewritten | tables | {f for r in rewritten for f in _external_data_files(base, r)}
                  | ({shared["file"]} if shared else set()))
        if tables:
            data["embeddings"] = compact_tables(base, work, data["embeddings"])
        for name, what in changes.items():
            spec = manifest.graphs[name]
            precision = spec.precision
            if what == ["int8-static"]:
                log.info("%s: static int8 QDQ", name)
                quantize_decoder_graph(base / spec.file, work / spec.file, decoder_feeds(base, name))
                model = onnx.load(str(work / spec.file))
                del model.metadata_props[:]
                _save(model, work / spec.file)
                del model
                precision = "int8-static"
            elif what == ["fp16"]:
                model = onnx.load(str(base / spec.file))
                unshare_weights(model)
                del model.metadata_props[:]
                log.info("%s: %d weights stored fp16", name, fp16_weights(model))
                _save(model, work / spec.file)
                del model
                precision = "fp16"
            else:
                model = onnx.load(str(base / spec.file))
                unshare_weights(model)  # a fused weight is a constant again: the quantizer sees it
                del model.metadata_props[:]  # re-stamped below with this variant's export id
                bits = {"int8": 8, "int4": 4}.get(what[0])
                if bits is not None:
                    log.info("%s: %d-bit MatMulNBits", name, bits)
                    model = quantize_matmuls(model, bits, block_size=block_size, accuracy_level=accuracy_level)
                    precision = what[0]
                if "kv-fp16" in what:
                    model = fp16_gqa(model) if name in FUSED_KV_GRAPHS else fp16_kv_io(model)
                _save(model, work / spec.file)
                del model
            export_id = f"{spec.extra.get('export_id', 'unbundled')}-{tag}"
            new = graph_spec(work, name, spec.file, spec.variant, precision, export_id).to_json()
            keep = {k: v for k, v in spec.extra.items() if k not in ("bytes", "export_id")}
            new.update(keep)
            if name in KV_GRAPHS:
                new["kv_dtype"] = kv
            data["graphs"][name] = new
        if shared:  # every shared graph over the variant's own weights file: what it changed, and what it did not
            specs = {n: GraphSpec.from_json(n, data["graphs"][n]) for n in shared["graphs"]}
            specs, data["weights"] = share_graph_weights(
                work, specs, sources={n: base / s.file for n, s in specs.items() if n not in changes})
            data["graphs"].update({n: s.to_json() for n, s in specs.items()})
        # a table viewed in the base's weights file: re-pointed into this one, or written out (never old offsets)
        data["embeddings"] = view_tables(work, data["embeddings"], data.get("weights"), source=base)
        data["variant"] = {"base": base.name, "weights": weights, "kv": kv, "decoder": decoder}
        if weights != "fp32":
            data["variant"].update(block_size=int(block_size), accuracy_level=int(accuracy_level))
        write_manifest(work, data)
        if decoder == "fp16":
            data["decoder_check"] = decoder_check(base, work)
            write_manifest(work, data)
    return out


def cached_variant(base: str | Path, *, weights: str, kv: str = "fp32", decoder: str = "fp32") -> Path:
    """The variant of an exported bundle, built once next to it (keyed by this module's code and the tables').
    ``weights="fp32", kv="fp32", decoder="fp32"`` is the base itself."""
    _check(weights, kv, decoder)
    base = Path(base).resolve()
    if (weights, kv, decoder) == ("fp32", "fp32", "fp32"):
        return base
    name = f"{base.name}.{variant_tag(weights, kv, decoder)}"
    return build_once(base.parent / f"{name}-{code_key(__file__, compact_tables.__code__.co_filename, length=8)}",
                      lambda work: make_variant(base, work, weights=weights, kv=kv, decoder=decoder),
                      replaces=f"{name}-*")  # older variant code, same base


@contextlib.contextmanager
def variant_output(out_dir: str | Path, *, base_name: str, weights: str = "fp32", kv: str = "fp32",
                   decoder: str = "fp32", overwrite: bool = False) -> Iterator[Path]:
    """``kztts export --weights/--kv/--decoder``: where to export the fp32 bundle that ``out_dir`` is made from.
    The fp32 variant is ``out_dir`` itself (the exporter checks and locks it). Any other is a scratch folder
    ``base_name`` beside ``out_dir`` (the manifest's ``variant.base``), under ``out_dir``'s lock: when the block
    ends its variant is written to ``out_dir`` and the scratch folder removed. ``out_dir`` is self-contained: its
    unchanged files are hard links (copies across file systems) whose other name is removed."""
    _check(weights, kv, decoder)
    out_dir = Path(out_dir)
    if (weights, kv, decoder) == ("fp32", "fp32", "fp32"):
        yield out_dir
        return
    check_output(out_dir, overwrite)  # before the long export
    with exclusive_output(out_dir), scratch_dir(out_dir) as tmp:  # a second export of out_dir fails at once
        check_output(out_dir, overwrite)  # again: another export may have finished while we took the lock
        base = tmp / base_name
        yield base
        make_variant(base, out_dir, weights=weights, kv=kv, decoder=decoder)
    log.info("%s bundle written to %s", variant_tag(weights, kv, decoder), out_dir)
