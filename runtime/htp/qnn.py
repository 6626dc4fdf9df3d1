"""Sessions on the Qualcomm QNN execution provider (HTP), with a CPU fallback.

- The onnxruntime-qnn plugin library is registered once per process
  (:func:`qnn_available`); a second registration is an ONNX Runtime error.
- A target's provider options (``kztts.htp.targets``) are applied to every session,
  with ``soc_model``/``htp_arch`` from its SoC: float graphs then run in fp16 on
  the HTP, QDQ graphs in their quantized types.
- Strict mode sets ``session.disable_cpu_ep_fallback``: a graph with a node the
  HTP cannot run fails at session creation. ONNX Runtime's own message does not
  say which node; :func:`create_session` re-opens the graph without the flag,
  reads the assignment and raises :class:`QnnPlacementError` naming the nodes
  and op types that would fall back.
- Without onnxruntime-qnn, or when its library fails to load, non-strict
  sessions run on the CPU EP after one warning per process; strict ones fail.
  ``KZTTS_DISABLE_QNN=1`` forces that path. A graph the HTP backend cannot
  prepare also runs on the CPU EP (with a warning naming it) unless strict.

Caveat (docs/QNN_EP.md, "Precision"): once a session used ``soc_model`` (fp16), later QNN sessions in
the same process also compute in fp16. Compare fp32 and fp16 in separate processes.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import onnxruntime as ort

from kztts.bundle import graphs as G
from kztts.bundle.sessions import SessionConfig, _check_io, _check_stamp, _session_options
from kztts.core import env
from kztts.core.errors import BundleError, KzttsError
from kztts.htp.qnn_package import host_is_simulator
from kztts.htp.targets import Target

log = logging.getLogger(__name__)

EP_NAME = "QNNExecutionProvider"
CPU_EP = "CPUExecutionProvider"


class QnnPlacementError(KzttsError):
    """Strict mode: some nodes of a graph would run on the CPU EP instead of the HTP."""

    def __init__(self, message: str, cpu_nodes: list[tuple[str, str]]):
        super().__init__(message)
        self.cpu_nodes = cpu_nodes  # (op_type, node name)


@dataclass
class _State:
    lock: threading.Lock = field(default_factory=threading.Lock)
    tried: bool = False
    devices: list = field(default_factory=list)
    htp_path: str | None = None
    error: str | None = None
    warned: bool = False


_STATE = _State()


def _register() -> None:
    """Import onnxruntime-qnn and register its EP library (once; the result is kept)."""
    st = _STATE
    with st.lock:
        if st.tried:
            return
        st.tried = True
        if env.flag("KZTTS_DISABLE_QNN"):
            st.error = "disabled by KZTTS_DISABLE_QNN"
            return
        # libsndfile dlopen'ed after the HTP backend is loaded segfaults on its first file
        # (seen with onnxruntime-qnn 2.7.0, e.g. reading a voice WAV after the sessions
        # opened): load it first.
        import soundfile  # noqa: F401

        try:
            import onnxruntime_qnn as qnn
        except Exception as exc:  # ImportError, or a broken package
            st.error = f"onnxruntime-qnn is not installed ({type(exc).__name__}: {exc}); pip install 'kztts[qnn]'"
            return
        try:
            lib, htp = qnn.get_library_path(), qnn.get_qnn_htp_path()
            if EP_NAME not in {d.ep_name for d in ort.get_ep_devices()}:
                ort.register_execution_provider_library(qnn.get_ep_name(), lib)
            devices = [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]
            if not devices:
                raise RuntimeError("the library registered but offers no QNN device")
            if not Path(htp).is_file():
                raise RuntimeError(f"HTP backend {htp} is missing")
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            st.error = f"the onnxruntime-qnn library failed to load ({first[:300]})"
            return
        st.devices, st.htp_path = devices, htp
        log.debug("registered %s from %s", EP_NAME, lib)


def qnn_available() -> bool:
    """True when the QNN EP is registered in this process (registering it on first call)."""
    _register()
    return _STATE.error is None


def qnn_unavailable_reason() -> str | None:
    _register()
    return _STATE.error


def disable_for_this_process(why: str) -> None:
    """Run every HTP graph of this process on the CPU EP (``KZTTS_DISABLE_QNN=1``, inherited by its child
    processes, e.g. Ray tasks): refused when QNN already opened here, where the switch could no longer hold."""
    with _STATE.lock:
        if _STATE.tried and _STATE.error is None:
            raise KzttsError(f"{why}: the QNN execution provider is already in use in this process; run it in a "
                             "process of its own")
        env.set_flag("KZTTS_DISABLE_QNN")
        _STATE.tried, _STATE.error = True, f"disabled: {why}"


def _warn_fallback() -> None:
    with _STATE.lock:
        first, _STATE.warned = not _STATE.warned, True
    if first:
        log.warning("QNN execution provider unavailable: %s; running on the CPU execution provider instead",
                    _STATE.error)


def _flush_c_stdio() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError, TypeError):  # no C runtime handle (Windows): nothing buffered to lose
        pass


@contextlib.contextmanager
def _native_output_to_log():
    """The HTP library prints a banner (``# LIBNATIVE: ...``) on the process's stdout when first
    loaded, from native code that no log level reaches: while a QNN session is created, fd 1 goes
    to a temporary file whose lines are logged at debug level (-vv), so stdout keeps only results
    (--json) and stderr only kztts's own messages."""
    import tempfile

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):
        yield
        return
    sys.stdout.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as captured:
        try:
            os.dup2(captured.fileno(), fd)
            yield
        finally:
            sys.stdout.flush()
            _flush_c_stdio()  # a banner still in C's stdout buffer must land in the file, not later on stdout
            os.dup2(saved, fd)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode(errors="replace").splitlines():
                if line.strip():
                    log.debug("QNN backend: %s", line.strip())


def qnn_session_options(target: Target, *, strict: bool, config: SessionConfig | None = None,
                        context: dict[str, str] | None = None) -> ort.SessionOptions:
    """Session options with the target's QNN provider (EP must be registered)."""
    so = _session_options(config or SessionConfig())
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    if strict:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    for k, v in (context or {}).items():
        so.add_session_config_entry(k, v)
    so.add_provider_for_devices(_STATE.devices, target.qnn_options(_STATE.htp_path))
    return so


def assignment(sess: ort.InferenceSession) -> dict[str, list[tuple[str, str]]]:
    """{EP name: [(op_type, node name), ...]} as ONNX Runtime placed the (optimized) graph."""
    out: dict[str, list[tuple[str, str]]] = {}
    try:
        info = sess.get_provider_graph_assignment_info()
    except Exception:  # session created without record_ep_graph_assignment_info
        return {}
    for g in info:
        out.setdefault(g.ep_name, []).extend((n.op_type, n.name) for n in g.get_nodes())
    return out


def cpu_nodes(sess: ort.InferenceSession) -> list[tuple[str, str]]:
    return assignment(sess).get(CPU_EP, [])


def _describe(nodes: list[tuple[str, str]], limit: int = 12) -> str:
    ops = Counter(op for op, _ in nodes)
    names = ", ".join(f"{name or '?'} ({op})" for op, name in nodes[:limit])
    more = f", ... {len(nodes) - limit} more" if len(nodes) > limit else ""
    return (f"op types {', '.join(f'{op} x{n}' for op, n in sorted(ops.items()))}; nodes {names}{more}")


def first_line(exc: BaseException, limit: int = 400) -> str:
    s = str(exc).strip()
    return (s.splitlines()[0] if s else type(exc).__name__)[:limit]


def create_session(path: str | os.PathLike, target: Target, *, strict: bool = False,
                   config: SessionConfig | None = None, context: dict[str, str] | None = None,
                   cpu_path: str | os.PathLike | None = None, fold_weights: bool = True) -> ort.InferenceSession:
    """Open ``path`` on the target's HTP (QNN EP), nodes it cannot run on the CPU EP.

    ``strict``: no CPU fallback at all; a missing QNN EP or a node the HTP cannot
    run raises (naming the nodes). Non-strict without QNN: one warning per process,
    then the CPU EP opens ``cpu_path`` (default ``path``; an EPContext model
    cannot run on the CPU, so context-binary graphs pass their source graph).
    ``context``: extra session config entries (EPContext generation/sharing). ``fold_weights``: on the CPU EP,
    a QDQ graph's weights are dequantized once at load (fast per call, float-sized in memory) rather than per call.
    """
    path = Path(path)
    if not qnn_available():
        if strict:
            raise KzttsError(f"strict mode: the QNN execution provider is unavailable ({_STATE.error}); "
                             f"cannot run {path.name} on the HTP of target {target.name!r}")
        _warn_fallback()
        return _cpu_session(cpu_path or path, config, fold_weights)
    try:
        with _native_output_to_log():
            sess = ort.InferenceSession(str(path), sess_options=qnn_session_options(
                target, strict=strict, config=config, context=context))
    except Exception as exc:
        if strict and "fallback to CPU EP has been explicitly disabled" in str(exc):
            nodes = _cpu_nodes_of(path, target, config)
            raise QnnPlacementError(
                f"strict mode: {len(nodes)} node(s) of {path.name} cannot run on the HTP of target "
                f"{target.name!r} and would fall back to the CPU: {_describe(nodes)}", nodes) from None
        if strict or context:  # context-binary generation/sharing must not silently become a CPU session
            raise KzttsError(f"{path}: the QNN execution provider could not create a session for target "
                             f"{target.name!r}: {first_line(exc)}") from exc
        log.warning("%s: the QNN execution provider could not prepare this graph for target %r (%s); running "
                    "it on the CPU execution provider", path.name, target.name, first_line(exc))
        return _cpu_session(cpu_path or path, config, fold_weights)
    return sess


def _cpu_session(path: Path, config: SessionConfig | None, fold_weights: bool = True) -> ort.InferenceSession:
    so = _session_options(config or SessionConfig())
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    # a QDQ graph meant for the HTP: no QDQ fusion (the CPU EP would swap in its own integer kernels), so it runs
    # its own arithmetic, fp32 between the Q/DQ pairs; the weights' DequantizeLinear then fold into float constants
    # at load (the same values), unless the caller keeps them packed: a 1.5B's prefill graph folded is 6 GB more
    so.add_session_config_entry("session.disable_quant_qdq", "1")
    disabled = [] if fold_weights else ["ConstantFolding"]
    return ort.InferenceSession(str(path), sess_options=so, providers=[CPU_EP], disabled_optimizers=disabled)


def _cpu_nodes_of(path: Path, target: Target, config: SessionConfig | None) -> list[tuple[str, str]]:
    """The nodes a non-strict session puts on the CPU EP (to explain a strict-mode failure)."""
    with _native_output_to_log():
        sess = ort.InferenceSession(str(path), sess_options=qnn_session_options(target, strict=False, config=config))
    return cpu_nodes(sess)


# ------------------------------------------------------------------ bundles
def graph_files(bundle, graph_name: str) -> tuple[Path, Path]:
    """(file for the QNN EP, its source graph: what the CPU EP runs in its place) of a bundle graph: a
    context-binary graph (``extra.context_file``) runs its EPContext model on QNN; a graph with an HTP form of
    its own (``extra.htp_file``: a QDQ ``cp_frame`` beside the float one the CPU plan runs) has that as its
    source."""
    try:
        spec = bundle.manifest.graphs[graph_name]
    except KeyError:
        raise BundleError(f"{bundle.manifest.path}: the bundle has no graph {graph_name!r} "
                          f"(it has {sorted(bundle.manifest.graphs)})") from None
    plain = Path(bundle.path) / spec.extra.get("htp_file", spec.file)
    ctx = spec.extra.get("context_file")
    return (Path(bundle.path) / ctx if ctx else plain), plain


def open_target_session(bundle, graph_name: str, target: Target, strict: bool = False,
                        config: SessionConfig | None = None) -> ort.InferenceSession:
    """Open a bundle graph on the target's HTP (see :func:`create_session`), checked
    against the manifest like CPU graphs."""
    spec = bundle.manifest.graphs.get(graph_name)
    if spec is None:
        graph_files(bundle, graph_name)  # raises the BundleError
    qnn_file, cpu_file = graph_files(bundle, graph_name)
    built_for = spec.extra.get("context_target", spec.extra.get("target"))
    packed = bool(spec.extra.get("packed_context"))
    if packed:
        _check_packed_context(qnn_file, graph_name, spec, built_for, target)
    if qnn_file != cpu_file and built_for and built_for != target.name:
        log.info("%s: context binary was prepared for %r, not %r: compiling the source graph", graph_name,
                 built_for, target.name)
        qnn_file = cpu_file
    if qnn_file != cpu_file and spec.extra.get("shared_context") and qnn_available():
        if host_is_simulator():
            # the x86 HTP emulator segfaults reloading a multi-graph, weight-shared context
            # (onnxruntime-qnn 2.7.0): the process would die, so the source graph is compiled instead
            log.warning("%s: its context binary shares weights with other graphs (prepared for %s), which the "
                        "x86 HTP simulator cannot load; compiling the source graph instead", graph_name,
                        built_for or target.name)
            qnn_file = cpu_file
    needed = {qnn_file, cpu_file}
    if qnn_file != cpu_file:
        needed |= {Path(bundle.path) / b for b in spec.extra.get("context_binaries", [])}
    for f in needed:
        if not f.is_file():
            raise BundleError(f"{f}: graph file for {graph_name!r} is missing; re-export the bundle")
    ctx = {}
    if (qnn_file != cpu_file or packed) and spec.extra.get("shared_context") and qnn_available():
        ctx = {"ep.share_ep_contexts": "1"}
    # on the CPU EP only a graph called per token (seq 1) has its weights folded: one called per chunk keeps them
    # packed, so a prefill and a decode graph of a large model fit beside the CPU's own graphs
    sess = create_session(qnn_file, target, strict=strict, config=config or bundle.session_config,
                          context=ctx, cpu_path=cpu_file, fold_weights=spec.extra.get("seq", 1) == 1)
    opened = qnn_file if qnn_available() else cpu_file
    _check_stamp(opened, spec, sess)
    _check_io(opened, spec, sess)
    log.debug("opened %s for %s (%s)", graph_name, target.name, session_precision(spec.precision, sess))
    return sess


def _check_packed_context(path: Path, graph_name: str, spec, built_for: str | None, target: Target) -> None:
    """A device bundle (``kztts pack``) keeps a context binary without its source graph: it runs only where its
    target's HTP does; anywhere else, one line saying so."""
    where = f"{path}: graph {graph_name!r} is a QNN context binary packed for target {built_for} (`kztts pack`)"
    if built_for != target.name:
        raise BundleError(f"{where}, not {target.name}; pack the full bundle for {target.name}")
    if not qnn_available():
        raise BundleError(f"{where} and runs only on the QNN execution provider, which is unavailable here "
                          f"({_STATE.error}); run the full bundle on this machine")
    if spec.extra.get("shared_context") and host_is_simulator():
        raise BundleError(f"{where}; its context shares weights with other graphs, which the x86 HTP simulator "
                          "cannot load: it runs on the device (run the full bundle here)")


def bundle_target(bundle) -> str:
    """The target name a bundle's static graphs were exported for."""
    name = next((g.extra["target"] for g in bundle.manifest.graphs.values() if g.extra.get("target")), None)
    if not name:
        raise BundleError(f"{bundle.manifest.path}: no target recorded for the static graphs; pass --target")
    return name


def session_precision(graph_precision: str, sess: ort.InferenceSession) -> str:
    """The arithmetic in force: QNN runs float graphs in fp16 (soc_model is always set), QDQ
    graphs in their quantized types; the CPU EP runs float graphs in fp32."""
    return planned_precision(graph_precision, EP_NAME in sess.get_providers() and bool(assignment(sess).get(EP_NAME)))


def planned_precision(graph_precision: str, on_qnn: bool) -> str:
    """``session_precision`` of a graph the plan runs on QNN (``on_qnn``) or on the CPU EP, without a session."""
    entry = G.HTP_PRECISION_ENTRIES.get(graph_precision)
    quantized = entry is not None and entry.quantized
    if not on_qnn:
        return f"{graph_precision} (cpu, simulated QDQ)" if quantized else "fp32 (cpu)"
    return f"{graph_precision} (htp)" if quantized else f"{G.FLOAT_HTP_PRECISION} (htp)"


@dataclass
class Placement:
    """Where a session's nodes run."""

    qnn_nodes: int
    cpu_nodes: int
    cpu_op_types: dict[str, int]
    cpu_node_names: list[str]
    providers: list[str]

    @classmethod
    def of(cls, sess: ort.InferenceSession) -> "Placement":
        a = assignment(sess)
        cpu = a.get(CPU_EP, [])
        return cls(len(a.get(EP_NAME, [])), len(cpu), dict(Counter(op for op, _ in cpu)), [n for _, n in cpu],
                   list(sess.get_providers()))
