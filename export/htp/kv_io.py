"""The KV input/output type of a bundle's static Talker graphs, changed after the export.

``kztts export --target`` writes the type the target asks for (``kztts.bundle.graphs.HTP_KV_DTYPES``).
:func:`retype_bundle_kv` turns the float graphs of an existing bundle to another float KV type
(float32 <-> float16) without re-exporting: float16 gets a Cast at each KV end (an existing one is
retargeted), float32 loses them (the graph an fp32-KV export writes), so the arithmetic is the
same; then the manifest entries are rewritten. Used to compare
fp16 with fp32 KV on the same weights and to move older fp32-KV bundles to fp16 KV.
"""
from __future__ import annotations

from pathlib import Path

from kztts.bundle import graphs as G
from kztts.bundle.manifest import read_manifest, write_manifest
from kztts.export.common.graph_parts import graph_spec

_ONNX_TYPES = {"fp32": 1, "fp16": 10}  # onnx.TensorProto.FLOAT / FLOAT16


def _bypass(graph, old: str, new: str) -> None:
    """Every node input ``old`` now reads ``new``."""
    for n in graph.node:
        n.input[:] = [new if i == old else i for i in n.input]


def retype_kv(model, kv_dtype: str, num_layers: int):
    """``model`` (onnx ModelProto, changed in place) with its static KV inputs/outputs of ``kv_dtype``
    (``fp32`` or ``fp16``); the graph computes in float32 behind a Cast at each KV end."""
    import onnx
    from onnx import helper

    to = _ONNX_TYPES[kv_dtype]
    past, new = set(G.STATIC_KV.past_names(num_layers)), set(G.STATIC_KV.new_names(num_layers))
    g = model.graph
    added = []
    for vi in g.input:
        if vi.name not in past:
            continue
        vi.type.tensor_type.elem_type = to
        users = [n for n in g.node if vi.name in n.input]
        if users and all(n.op_type == "Cast" for n in users):  # cast to float32 inside already
            if kv_dtype == "fp32":  # an identity now: drop it, as a float32 export has none
                for c in users:
                    _bypass(g, c.output[0], vi.name)
                    g.node.remove(c)
            continue
        inner = f"{vi.name}_kv_float"
        for n in users:
            n.input[:] = [inner if i == vi.name else i for i in n.input]
        added.append(helper.make_node("Cast", [vi.name], [inner], to=onnx.TensorProto.FLOAT,
                                      name=f"{vi.name}_kv_cast"))
    for vi in g.output:
        if vi.name not in new:
            continue
        vi.type.tensor_type.elem_type = to
        producer = next(n for n in g.node if vi.name in n.output)
        if producer.op_type == "Cast":
            if kv_dtype == "fp32":
                inner = next(n for n in g.node if producer.input[0] in n.output)
                inner.output[:] = [vi.name if o == producer.input[0] else o for o in inner.output]
                _bypass(g, producer.input[0], vi.name)
                g.node.remove(producer)
                continue
            for a in producer.attribute:
                if a.name == "to":
                    a.i = to
            continue
        inner = f"{vi.name}_kv_float"
        producer.output[:] = [inner if o == vi.name else o for o in producer.output]
        added.append(helper.make_node("Cast", [inner], [vi.name], to=to, name=f"{vi.name}_kv_cast"))
    for n in reversed(added):  # an input's Cast before its users, an output's after its producer
        g.node.insert(0, n) if n.input[0] in past else g.node.append(n)
    onnx.checker.check_model(model)
    return model


# the manifest keys that describe a graph's context binary (export.htp_export._with_context_binaries);
# "context" itself is the static graph's KV length and stays
CONTEXT_BINARY_KEYS = ("context_file", "context_binaries", "shared_context", "context_target", "context_bytes")


def retype_bundle_kv(bundle_dir: str | Path, kv_dtype: str, graphs=("talker_prefill", "talker_decode")) -> None:
    """Rewrite the float static Talker graphs of ``bundle_dir`` with ``kv_dtype`` KV I/O and their
    manifest entries (I/O, ``kv_dtype``); context binaries of those graphs are dropped (stale)."""
    import onnx

    bundle_dir = Path(bundle_dir)
    m = read_manifest(bundle_dir)
    data = dict(m.data)
    data["graphs"] = dict(data["graphs"])
    for name in graphs:
        spec = m.graphs[name]
        if spec.precision != G.FLOAT_HTP_PRECISION:
            raise ValueError(f"{name}: only float (fp16) static graphs can be retyped, not {spec.precision}")
        G.htp_kv_dtype(spec.precision, kv_dtype)
        path = bundle_dir / spec.file
        model = retype_kv(onnx.load(str(path)), kv_dtype, int(m.talker["num_layers"]))
        onnx.save(model, str(path))
        fresh = graph_spec(bundle_dir, name, spec.file, spec.variant, spec.precision, spec.extra["export_id"])
        extra = {k: v for k, v in spec.extra.items() if k not in CONTEXT_BINARY_KEYS}
        data["graphs"][name] = {**fresh.to_json(), **extra, **fresh.extra, "kv_dtype": kv_dtype}
    write_manifest(bundle_dir, data)
