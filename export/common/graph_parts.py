"""What every graph exporter needs to describe its output: the stamp a graph file carries and its
manifest entry as ONNX Runtime sees it."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import onnxruntime as ort

from kztts.bundle.manifest import GraphSpec, TensorSpec
from kztts.bundle.sessions import _ORT_DTYPES, EXPORT_ID_KEY, GRAPH_KEY
from kztts.export.common.onnx_export import SHARED_WEIGHTS, share_weights


def stamp_graph(path: Path, name: str, export_id: str) -> None:
    """Record which bundle and graph a file belongs to, in the ONNX model metadata.

    The runtime compares the stamp with the manifest, so a graph copied in from
    another export (same I/O, other weights) is refused instead of run.
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    meta.update({GRAPH_KEY: name, EXPORT_ID_KEY: export_id})
    del model.metadata_props[:]
    for k, v in meta.items():
        model.metadata_props.add(key=k, value=v)
    onnx.save(model, str(path))


def graph_spec(bundle_dir: Path, name: str, rel_file: str, variant: str, precision: str,
               export_id: str) -> GraphSpec:
    """Stamp an exported graph and describe its I/O as ONNX Runtime sees it."""
    path = bundle_dir / rel_file
    stamp_graph(path, name, export_id)
    so = ort.SessionOptions()  # only the I/O is read: no optimization, weights mapped (external data), not packed
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.add_session_config_entry("session.disable_prepacking", "1")
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

    def spec(args):
        return tuple(TensorSpec(a.name, _ORT_DTYPES.get(a.type, a.type),
                                tuple(d if isinstance(d, (int, str)) else "?" for d in a.shape)) for a in args)

    return GraphSpec(name, rel_file, variant, precision, spec(sess.get_inputs()), spec(sess.get_outputs()),
                     {"bytes": path.stat().st_size, "export_id": export_id})


def with_file_bytes(bundle_dir: Path, spec: GraphSpec) -> GraphSpec:
    """``spec`` with the bytes its graph file has now (a rewrite pointed its tensors at another data file)."""
    return replace(spec, extra={**spec.extra, "bytes": (Path(bundle_dir) / spec.file).stat().st_size})


def share_with_static(bundle_dir: Path, graphs: dict[str, GraphSpec], static: dict[str, GraphSpec], weights: dict
                      ) -> tuple[dict[str, GraphSpec], dict]:
    """``share_graph_weights`` again once the static HTP graphs ``static`` are written: a float static graph holds
    the CPU graphs' weights again (the 0.6B Talker's 1.8 GB once per graph), a quantized pair the same codes twice.
    ``graphs``: every graph of the bundle; ``weights``: the manifest entry of the CPU graphs' sharing. Graphs outside
    the weights file's folder (the per-layer segments) keep their own: ONNX Runtime reads no external data outside a
    graph's folder. Returns the specs it rewrote and the new ``weights`` entry."""
    folder = Path(weights["file"]).parent
    return share_graph_weights(bundle_dir, {n: graphs[n] for n in (*weights["graphs"], *static)
                                            if Path(graphs[n].file).parent == folder})


def share_graph_weights(bundle_dir: Path, specs: dict[str, GraphSpec], sources: dict[str, Path] | None = None
                        ) -> tuple[dict[str, GraphSpec], dict]:
    """The CPU graphs ``specs`` of the bundle at ``bundle_dir`` rewritten over one shared weights file
    (``kztts.export.common.onnx_export.share_weights``: each weight stored once), in ``specs``' order (the plain
    graphs before the fused ones, whose fused weights become Concats of the plain ones). ``sources``: where a graph
    is read from when not from the bundle itself (a precision variant's unchanged graphs, in its base). Returns
    the specs with their new file sizes and the manifest's ``weights`` entry: {file, bytes, graphs}."""
    bundle_dir = Path(bundle_dir)
    folders = {Path(s.file).parent for s in specs.values()}
    if len(folders) != 1:
        raise ValueError(f"shared weights: the graphs are in several folders ({sorted(map(str, folders))})")
    rel = (next(iter(folders)) / SHARED_WEIGHTS).as_posix()
    sources = sources or {}
    size = share_weights([(sources.get(n, bundle_dir / s.file), bundle_dir / s.file) for n, s in specs.items()],
                         bundle_dir / rel, consume=not sources)  # an export: its staging folder
    out = {n: with_file_bytes(bundle_dir, s) for n, s in specs.items()}
    return out, {"file": rel, "bytes": size, "graphs": list(specs)}
