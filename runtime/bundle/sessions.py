"""ONNX Runtime session creation, with bundle-level error messages.

Every graph of a bundle is opened here, so a corrupt file, or one whose inputs
and outputs differ from what the manifest promises, is reported as a
BundleError naming the file rather than as an ONNX Runtime traceback.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import onnxruntime as ort

from kztts.bundle.manifest import GraphSpec
from kztts.core import env
from kztts.core.blas import one_blas_thread
from kztts.core.errors import BundleError

log = logging.getLogger(__name__)

_ORT_DTYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64",
               "tensor(int32)": "int32", "tensor(bool)": "bool", "tensor(uint8)": "uint8",
               "tensor(int8)": "int8", "tensor(uint16)": "uint16", "tensor(int16)": "int16"}


def _default_threads() -> int:
    return env.threads("KZTTS_THREADS", 0)


def _default_spinning() -> bool:
    return env.flag("KZTTS_SPIN", False)


def _default_decoder_threads() -> int | None:
    return env.threads("KZTTS_DECODER_THREADS", None)


DECODER_GRAPHS = ("decoder", "decoder_stream")


@dataclass(frozen=True)
class SessionConfig:
    """How graphs are run. ``threads`` 0 lets ONNX Runtime choose (``$KZTTS_THREADS`` sets the default);
    ``spinning``: worker threads busy-wait between a run's operators (``$KZTTS_SPIN``, default 0).
    ``graph_threads``: (graph name, threads) pairs overriding ``threads`` for those graphs;
    ``decoder_threads`` (``$KZTTS_DECODER_THREADS``) is a shorthand for both decoder graphs (a
    pipelined stream runs the decoder next to the Talker and Code Predictor: one core each)."""

    threads: int = field(default_factory=_default_threads)
    optimization: str = "all"  # "disable" | "basic" | "extended" | "all"
    spinning: bool = field(default_factory=_default_spinning)
    graph_threads: tuple[tuple[str, int], ...] = ()
    decoder_threads: int | None = field(default_factory=_default_decoder_threads)

    def __post_init__(self) -> None:
        # the same bound as the variables and flags: a huge count makes ONNX Runtime hang
        env.check_threads("threads", int(self.threads))
        if self.decoder_threads is not None:
            env.check_threads("decoder_threads", int(self.decoder_threads))
        for name, threads in self.graph_threads:
            env.check_threads(f"threads of {name}", int(threads))

    def threads_for(self, graph: str) -> int:
        """Intra-op threads for ``graph`` (0 = ONNX Runtime's choice)."""
        for name, threads in self.graph_threads:
            if name == graph:
                return int(threads)
        if self.decoder_threads is not None and graph in DECODER_GRAPHS:
            return int(self.decoder_threads)
        return self.threads


_OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def _session_options(cfg: SessionConfig, graph: str | None = None) -> ort.SessionOptions:
    """ORT options for ``graph`` (its thread count from ``cfg.threads_for``; ``cfg.threads`` without a name)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = _OPT_LEVELS[cfg.optimization]
    threads = cfg.threads_for(graph) if graph is not None else cfg.threads
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    # A Talker / Code Predictor run is ~1000-3000 small operators at M = 1: without spinning
    # the worker thread sleeps between them and each wake-up costs tens of microseconds (on an
    # idle machine, int4 Talker decode 38 -> 26 ms and cp_frame 96 -> 72 ms at 0.6B with 2
    # threads). But spinning threads hold their cores: with another process running, or the
    # next stage's session waiting, it was 1.5-2x slower (kztts bench --spin 1,0). So off by
    # default; KZTTS_SPIN=1 for a machine that runs nothing else.
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if cfg.spinning else "0")
    so.log_severity_level = 3  # ORT warnings about unused initializers etc. are noise for users
    return so


GRAPH_KEY = "kztts.graph"
EXPORT_ID_KEY = "kztts.export_id"


def _check_stamp(path: Path, spec: GraphSpec, sess: ort.InferenceSession) -> None:
    meta = sess.get_modelmeta().custom_metadata_map
    want = spec.extra.get("export_id")
    got = (meta.get(GRAPH_KEY), meta.get(EXPORT_ID_KEY))
    if want is not None and got != (spec.name, want):
        raise BundleError(f"{path}: this file is graph {got[0]!r} of export {got[1]!r}, but the manifest "
                          f"expects graph {spec.name!r} of export {want!r}: the file comes from another "
                          "bundle; re-export the bundle")


def _check_io(path: Path, spec: GraphSpec, sess: ort.InferenceSession) -> None:
    for kind, declared, actual in (("input", spec.inputs, sess.get_inputs()),
                                   ("output", spec.outputs, sess.get_outputs())):
        got = {a.name: (_ORT_DTYPES.get(a.type, a.type), len(a.shape)) for a in actual}
        want = {t.name: (t.dtype, len(t.shape)) for t in declared}
        if got != want:
            missing = sorted(set(want) - set(got))
            extra = sorted(set(got) - set(want))
            differ = sorted(n for n in set(want) & set(got) if want[n] != got[n])
            raise BundleError(
                f"{path}: graph {kind}s do not match the manifest for {spec.name!r} "
                f"(missing {missing[:4]}, unexpected {extra[:4]}, different dtype/rank {differ[:4]}); "
                "the file belongs to another export: re-export the bundle")


def open_session(bundle_dir: Path, spec: GraphSpec, cfg: SessionConfig | None = None) -> ort.InferenceSession:
    """Open ``spec.file`` on the CPU EP and check its I/O against the manifest."""
    one_blas_thread()  # the runtime's numpy products run between these graphs' calls (kztts.core.blas)
    path = Path(bundle_dir) / spec.file
    if not path.is_file():
        raise BundleError(f"{path}: graph file for {spec.name!r} is missing; re-export the bundle")
    try:
        sess = ort.InferenceSession(str(path), sess_options=_session_options(cfg or SessionConfig(), spec.name),
                                    providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises several unrelated types for unreadable models
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BundleError(f"{path}: cannot load graph {spec.name!r}: the ONNX file is corrupt or "
                          f"truncated ({first[:200]}); re-export the bundle") from exc
    _check_stamp(path, spec, sess)
    _check_io(path, spec, sess)
    log.debug("opened %s (%s, %s)", path.name, spec.variant, spec.precision)
    return sess
