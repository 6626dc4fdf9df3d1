"""HTP graphs spread over host processes, each opening at most a target's ``process_context_mb``.

One process cannot hold every HTP graph of a large model: the x86 HTP simulator refuses more
than about 2.9 GB of context binaries per process (``QNN_COMMON_ERROR_MEM_ALLOC`` once the 28
fp16 prefill layers of a 1.5B LM are open, 2.64 GB), and on a device each process gets one DSP
session with an address space of its own. A target with ``process_context_mb`` therefore places
its HTP graphs in child processes: the plan opens graphs in the order the runner needs them, and
:class:`HtpHosts` fills one host until the next graph would pass the budget, then starts the next.

The runners call a hosted graph through :class:`HostedSession`, which answers the
``onnxruntime.InferenceSession`` calls they make (``run``, ``get_inputs``, ``get_outputs``,
``get_providers``, ``get_provider_graph_assignment_info``). Arrays cross a pipe, pickled: a 1.5B
layer's decode call moves its KV window (~1 MB), small beside the call itself. A host that dies
(a signal, the OOM killer) turns into a :class:`HostError` naming its graphs, never a hang.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from kztts.bundle.bundle import Bundle
from kztts.bundle.onnx_wire import graph_read_bytes
from kztts.core.errors import KzttsError, signal_note
from kztts.htp.qnn import assignment, graph_files, open_target_session
from kztts.htp.targets import Target

log = logging.getLogger(__name__)

MB = 1 << 20


class HostError(KzttsError):
    """A host process failed: it died, or opening or running one of its graphs raised."""


@dataclass(frozen=True)
class Arg:
    """A graph input or output as ``InferenceSession.get_inputs()`` describes it."""

    name: str
    shape: list
    type: str


@dataclass(frozen=True)
class _Node:
    op_type: str
    name: str


@dataclass(frozen=True)
class _EpGraph:
    """One entry of ``get_provider_graph_assignment_info()``: an EP and its nodes."""

    ep_name: str
    nodes: tuple[_Node, ...]

    def get_nodes(self) -> tuple[_Node, ...]:
        return self.nodes


def graph_bytes(bundle, graph_name: str) -> int:
    """Bytes the QNN EP opens for a graph: its context binaries when it has them, else its source ONNX and the
    tensors it reads from other files (its part of a shared weights file: what a process holds of it, to first
    order)."""
    spec = bundle.manifest.graphs[graph_name]
    qnn_file, _ = graph_files(bundle, graph_name)
    binaries = {Path(bundle.path) / b for b in spec.extra.get("context_binaries", [])}
    return graph_read_bytes(qnn_file) + sum(f.stat().st_size for f in binaries if f.is_file())


# ---------------------------------------------------------------- the host process
def _describe(sess) -> dict:
    def args(xs) -> list[Arg]:
        return [Arg(a.name, list(a.shape), a.type) for a in xs]

    return {"inputs": args(sess.get_inputs()), "outputs": args(sess.get_outputs()),
            "providers": list(sess.get_providers()),
            "assignment": [_EpGraph(ep, tuple(_Node(op, n) for op, n in nodes))
                           for ep, nodes in assignment(sess).items()]}


def _exit_with_parent() -> None:
    """End this host as soon as the process that started it is gone, even inside a graph call.

    A parent killed by a signal never closes its hosts, and a host blocked in a simulated HTP call
    (a whole-stack w8a16 decode step of a 1.5B runs minutes) only sees the closed pipe when the call
    returns: it would hold both cores for nothing. multiprocessing gives a spawned child its parent's
    sentinel, which becomes ready when the parent ends, on every OS."""
    import threading

    parent = mp.parent_process()
    if parent is None:  # not started by multiprocessing
        return

    def watch() -> None:
        parent.join()
        os._exit(3)  # no cleanup to do: the sessions die with the process

    threading.Thread(target=watch, name="kztts-htp-host-parent-watch", daemon=True).start()


def host_main(conn, bundle_path: str, session_config, target: Target, strict: bool, log_level: int) -> None:
    """The host's loop: ``("open", name)``, ``("run", name, outputs, feeds)``, ``("close",)``."""
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s [htp host]: %(message)s")
    _exit_with_parent()
    bundle = Bundle.open(bundle_path, session_config, load_graphs=False)
    sessions: dict[str, Any] = {}
    while True:
        try:
            msg = conn.recv()
        except EOFError:  # the parent is gone
            return
        op = msg[0]
        if op == "close":
            conn.send(("ok", None))
            return
        try:
            if op == "open":
                sess = sessions[msg[1]] = open_target_session(bundle, msg[1], target, strict)
                reply = _describe(sess)
            elif op == "run":
                reply = sessions[msg[1]].run(msg[2], msg[3])
            else:
                raise ValueError(f"unknown request {op!r}")
        except Exception as exc:  # the parent re-raises it with the graph's name
            conn.send(("error", type(exc).__name__, str(exc), isinstance(exc, KzttsError)))
            continue
        conn.send(("ok", reply))


class _Host:
    """One child process and the graphs it has opened."""

    def __init__(self, index: int, bundle, target: Target, strict: bool):
        ctx = mp.get_context("spawn")  # a fresh interpreter: no inherited QNN state (fp16 mode is per process)
        self.index = index
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=host_main, name=f"kztts-htp-host-{index}", daemon=True,
                                args=(child, str(bundle.path), bundle.session_config, target, strict,
                                      logging.getLogger().getEffectiveLevel()))
        self.proc.start()
        child.close()
        self.graphs: list[str] = []
        self.bytes = 0

    def __repr__(self) -> str:
        return f"host {self.index} (pid {self.proc.pid}, {len(self.graphs)} graphs, {self.bytes / MB:.4g} MB)"

    def call(self, what: str, msg: tuple):
        try:
            self.conn.send(msg)
            reply = self.conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            self.proc.join(5)
            code = self.proc.exitcode
            how = signal_note(-code) if code is not None and code < 0 else f"exit code {code}"
            # a host that exits before its first graph usually failed to start: spawn re-imports the
            # caller's main module, which must then be guarded
            hint = ("; its error is above on stderr (a script starting HTP host processes needs an "
                    "`if __name__ == \"__main__\":` guard, as for any spawned process)"
                    if not self.graphs and code is not None and code > 0 else "")
            raise HostError(f"the HTP host process {self.index} (pid {self.proc.pid}) died ({how}) while {what}; "
                            f"it held {', '.join(self.graphs) or 'no graph yet'} ({self.bytes / MB:.4g} MB)"
                            f"{hint}") from None
        if reply[0] == "error":
            _, kind, text, ours = reply
            raise HostError(f"{what} in HTP host process {self.index}: {text}" if ours
                            else f"{what} in HTP host process {self.index} failed: {kind}: {text}")
        return reply[1]

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.call("closing", ("close",))
            except HostError:
                pass
            self.proc.join(10)
            if self.proc.is_alive():
                self.proc.kill()
        self.conn.close()


class HostedSession:
    """A graph opened in a host process, called like an ``onnxruntime.InferenceSession``."""

    def __init__(self, host: _Host, graph: str, info: dict):
        self.host, self.graph = host, graph
        self._inputs, self._outputs = info["inputs"], info["outputs"]
        self._providers, self._assignment = info["providers"], info["assignment"]

    def run(self, output_names: Sequence[str] | None, feeds: dict[str, np.ndarray], run_options=None) -> list:
        return self.host.call(f"running {self.graph}", ("run", self.graph, output_names, feeds))

    def get_inputs(self) -> list[Arg]:
        return list(self._inputs)

    def get_outputs(self) -> list[Arg]:
        return list(self._outputs)

    def get_providers(self) -> list[str]:
        return list(self._providers)

    def get_provider_graph_assignment_info(self) -> list[_EpGraph]:
        return list(self._assignment)


class HtpHosts:
    """Opens HTP graphs in host processes of at most ``budget_mb`` of graph files each."""

    def __init__(self, bundle, target: Target, strict: bool, budget_mb: float):
        self.bundle, self.target, self.strict, self.budget = bundle, target, strict, float(budget_mb) * MB
        self.hosts: list[_Host] = []  # daemons: multiprocessing ends any still running at exit

    def open(self, graph: str) -> HostedSession:
        size = graph_bytes(self.bundle, graph)
        if size > self.budget:
            raise KzttsError(f"{graph}: its HTP graph files take {size / MB:.4g} MB, more than one process may "
                             f"open ({self.budget / MB:.4g} MB, process_context_mb of target {self.target.name}): "
                             "export smaller graphs (--segments) or raise process_context_mb")
        host = self.hosts[-1] if self.hosts else None
        if host is None or host.bytes + size > self.budget:
            host = _Host(len(self.hosts), self.bundle, self.target, self.strict)
            self.hosts.append(host)
            log.info("HTP graphs past %.4g MB per process: starting HTP host process %d (pid %d)",
                     self.budget / MB, host.index, host.proc.pid)
        info = host.call(f"opening {graph}", ("open", graph))
        host.graphs.append(graph)
        host.bytes += size
        return HostedSession(host, graph, info)

    def summary(self) -> list[dict]:
        """Per host: its pid, graphs and MB (for reports)."""
        return [{"host": h.index, "pid": h.proc.pid, "graphs": list(h.graphs), "mb": round(h.bytes / MB, 3)}
                for h in self.hosts]

    def close(self) -> None:
        for h in self.hosts:
            h.close()
        self.hosts = []
