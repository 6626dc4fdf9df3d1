"""``kztts bench --ray``: a sweep's units as Ray tasks, each kept as it finishes, resumable, retried.

A **unit** is one (configuration, text) measurement: a TTS grid row (one round of it; the grid has one
text), an HTP simulator row, the end-to-end pair, or one causal-LM row over one of its texts.
``kztts.bench.run`` and ``kztts.bench.lm`` describe their units (:class:`Unit`) and turn the results into
the tables a sequential run prints; :func:`run_units` runs them on a local Ray or a cluster.

- **Keys.** A unit's key is the sha256 of its identity: the digests of the bundles it reads
  (``kztts.bundle.manifest.bundle_digest``), its configuration, its text, the settings that shape it
  and the **code version** (:func:`code_version`: ``code_key`` of the modules that compute such a row,
  with the versions of onnxruntime, numpy and the other packages it runs on).
- **Kept at once.** The driver writes each finished unit to ``OUT/units/<name>.<key>.json`` (and
  ``.npz`` for its arrays) atomically (``kztts.core.atomic``); a rerun with the same ``--out`` reuses
  every unit whose file has its key and no error, and runs only the others. Results of other
  bundles, code versions or settings stay in the folder unused (logged in one line).
- **Retries.** A unit whose process is killed (a signal, the OOM killer, its Ray worker or node gone)
  is submitted again, at most :data:`ATTEMPTS` times in all, then reported as failed in the table
  (its ``error`` names the attempts); a unit whose row raises is a failed row at once, as in a
  sequential run. Failed units are run again by the next rerun.
- **Resources.** Every task states its CPUs and memory (:class:`Resources`, estimated from the files
  the row's execution plan opens: :func:`plan_memory_mb`), so Ray never packs units whose sum passes a
  node's memory. A **timed** unit (CPU rows: their ms columns) asks for every CPU of the largest node
  alive when the run starts, so nothing else of the sweep runs beside it; untimed units (HTP simulator
  rows) ask for their threads. A unit larger than every node is refused in one line, not left waiting.
- **Bundles reach the workers by path**: bundles, checkpoints and the cache (``$KZTTS_CACHE``) must be
  on storage mounted at the same path on every node, with the same kztts installed (each task checks
  both: a node that lacks a bundle or computes with other code fails that unit in one line). The small
  inputs (x-vector, baseline, target and placement files, the fp32 row's logits for the LM rows) travel
  with the task through Ray's object store; results come back to the driver, the only writer of ``OUT``.

Ray is imported only here and only when ``--ray`` is given (the ``cluster`` extra, ``ray>=2.9``).
``python -m kztts.bench.ray_units SPEC.json`` runs one LM unit in a child process (``kztts.core.worker_process``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import platform
import re
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import psutil

import kztts
from kztts.bench import bandwidth
from kztts.bench import e2e as bench_e2e
from kztts.bundle.bundle import Bundle
from kztts.bundle.manifest import bundle_digest
from kztts.bundle.onnx_wire import graph_read_bytes
from kztts.core.atomic import atomic_outputs
from kztts.core.build_cache import code_key
from kztts.core.errors import KzttsError
from kztts.core.progress import Steps, phase
from kztts.core.worker_process import WorkerError, run_worker, worker_main
from kztts.eval.lm_accuracy import SAMPLES, RowSpec, run_text
from kztts.htp.hosts import graph_bytes
from kztts.plan.resolve import resolve_plan

log = logging.getLogger(__name__)

LOCAL = "local"  # ``--ray`` without an address: a Ray started here with this machine's CPUs
ATTEMPTS = 3  # runs of a unit whose process is killed, before it is reported as failed
MB = 1 << 20
LOCAL_OBJECT_STORE_MB = 1024  # results are small; Ray's default (30% of memory) is taken from what tasks may use

# Memory of a unit's process tree, estimated from the files its plan opens (measured on the 1.5B LM,
# benchmarks/lm_precision/README.md): a CPU row holds about twice its graph files while ONNX Runtime
# builds the session (fp32 CPU rows, 6.2 GB graph: peak RSS 11.4 GB); HTP graphs about their context
# binaries and a half (fp16 all-htp, 5.9 GB of binaries in 3 host processes: tree peak 7.63 GiB);
# each process (the row's and every HTP host) ~500 MB of interpreter, numpy and ONNX Runtime.
PROCESS_MB = 500
CPU_FACTOR = 2.0
HTP_FACTOR = 1.5
TORCH_MB, TORCH_FACTOR = 1500, 3.0  # the qwen-tts reference: torch, and its checkpoint loaded in fp32
PROBE_MB = 2 * bandwidth.PROBE_MB  # the bandwidth probe's weight, built then prepacked

# What computes a row, by bench (paths under the kztts package; "export:" under kztts.export): their
# bytes are the code version of a unit, with the versions of the packages below
_CODE = {
    "lm": ("eval/lm_accuracy.py", "lm", "runners", "plan", "htp", "bundle", "generation", "core/metrics.py"),
    "tts": ("bench/worker.py", "bench/htp_worker.py", "bench/batch_worker.py", "bench/batch_rows.py",
            "bench/e2e.py", "bench/e2e_worker.py", "bench/bandwidth.py", "tts", "runners", "plan", "htp", "bundle",
            "generation", "core/metrics.py", "core/audio.py", "eval/replay.py", "export:tts/bench_reference.py",
            "export:validate/htp.py"),
}
_PACKAGES = {
    "lm": ("onnxruntime", "onnxruntime-qnn", "numpy", "tokenizers"),
    "tts": ("onnxruntime", "onnxruntime-qnn", "numpy", "tokenizers", "torch", "transformers", "qwen-tts"),
}


# ------------------------------------------------------------------ keys
@cache
def code_version(bench: str) -> str:
    """The code version of ``bench``'s units ("lm" or "tts"): ``code_key`` of the modules that compute a row
    and the versions of the packages they run on (a unit of other code is another unit)."""
    root = Path(kztts.__file__).resolve().parent
    spec = importlib.util.find_spec("kztts.export")  # its folder, without importing torch
    export_root = Path(spec.origin).parent if spec is not None and spec.origin else None
    files: list[Path] = []
    for entry in _CODE[bench]:
        base, rel = (export_root, entry[len("export:"):]) if entry.startswith("export:") else (root, entry)
        if base is None:
            continue
        path = base / rel
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.is_file() else []
    versions = {name: _version(name) for name in _PACKAGES[bench]}
    versions["python"] = ".".join(platform.python_version_tuple()[:2])
    return code_key(*files, extra=json.dumps(versions, sort_keys=True).encode(), length=16)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


@cache
def _digest(path: str) -> str:
    return bundle_digest(Path(path))


def bundle_id(path: str | Path) -> dict:
    """A bundle as a key names it: its folder's name and :func:`~kztts.bundle.manifest.bundle_digest`
    (computed once per run: it reads every byte)."""
    p = Path(path).resolve()
    return {"name": p.name, "digest": _digest(str(p))}


def file_sha(path: str | Path) -> str:
    """The sha256 (16 hex digits) of a small file's bytes (a target, a placement)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def arrays_sha(path: str | Path) -> str:
    """The sha256 (16 hex digits) of an ``.npy``/``.npz`` file's arrays, names and bytes: the same arrays
    saved again give the same value (an ``.npz`` file's own bytes carry the time it was written)."""
    h = hashlib.sha256()
    data = np.load(path)
    arrays = {"": data} if isinstance(data, np.ndarray) else {k: data[k] for k in sorted(data.files)}
    for name, a in arrays.items():
        h.update(f"{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def fingerprint(path: str | Path) -> str:
    """A cheap identity of a shared folder (every file's relative name and size, and a bundle's manifest):
    what a task compares to tell that its node sees the driver's bundle, not another copy."""
    root = Path(path)
    h = hashlib.sha256()
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    for f in files:
        h.update(f"{f.relative_to(root).as_posix() if f != root else f.name}\0{f.stat().st_size}\0".encode())
    if (root / "kztts.json").is_file():
        h.update((root / "kztts.json").read_bytes())
    return h.hexdigest()[:16]


def unit_key(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


# ------------------------------------------------------------------ resources
@dataclass(frozen=True)
class Resources:
    """What a unit's task asks Ray for: ``cpus`` (None with ``whole_node``: every CPU of the largest node)
    and ``memory_mb``, with ``basis``: how the memory was estimated."""

    memory_mb: int
    basis: str
    cpus: float | None = 1
    whole_node: bool = False


def _cpu_graph_bytes(bundle: Bundle, graph: str) -> int:
    # a session holds the tensors its graph reads: its part of the shared weights file, not the file's size
    return graph_read_bytes(Path(bundle.path) / bundle.manifest.graphs[graph].file)


def plan_memory_mb(bundle: str | Path, roles: Sequence[str], *, target=None, placement=None, cp_mode: str = "frame",
                   attention: str | None = None, check_saturation: bool = False) -> tuple[int, str]:
    """(MB, how) a row's processes hold: from the graph files its execution plan opens for ``roles`` (CPU
    graphs x :data:`CPU_FACTOR`, HTP graphs x :data:`HTP_FACTOR`), its embedding tables, and
    :data:`PROCESS_MB` for its process and for each HTP host process (``process_context_mb`` of the target:
    the HTP graph files over it). A plan that cannot be resolved here counts the whole bundle as CPU graphs."""
    b = Bundle.open(bundle, load_graphs=False)
    tables = sum(p.stat().st_size for p in (Path(b.path) / "embeddings").glob("*") if p.is_file())
    try:
        plan = resolve_plan(b, target=target, placement=placement, strict=True, cp_mode=cp_mode, attention=attention,
                            check_saturation=check_saturation)
    except KzttsError as e:
        total = sum(p.stat().st_size for p in Path(b.path).rglob("*") if p.is_file())
        mb = PROCESS_MB + CPU_FACTOR * total / MB
        return int(mb), f"{CPU_FACTOR:g} x the whole bundle ({total / MB:.0f} MB; its plan: {str(e)[:80]})"
    cpu = htp = 0
    seen: set[tuple[str, str]] = set()
    for step in plan.steps.values():
        if step.role not in roles:
            continue
        for g in step.graphs:
            if (g, step.device) in seen:
                continue
            seen.add((g, step.device))
            if step.device == "htp":
                htp += graph_bytes(b, g)
            else:
                cpu += _cpu_graph_bytes(b, g)
                shared = b.manifest.data.get("weights")  # the CPU graphs' one weights file: counted once
                if shared and g in shared["graphs"] and ("weights", "cpu") not in seen:
                    seen.add(("weights", "cpu"))
                    cpu += shared["bytes"]
    budget = getattr(plan.target, "process_context_mb", None) if htp else None
    hosts = math.ceil(htp / (budget * MB)) if budget else 0
    mb = PROCESS_MB * (1 + hosts) + CPU_FACTOR * cpu / MB + HTP_FACTOR * htp / MB + tables / MB
    how = (f"{PROCESS_MB} MB per process + {CPU_FACTOR:g} x {cpu / MB:.0f} MB of CPU graphs + "
           f"{tables / MB:.0f} MB of tables")
    if htp:
        how += f" + {HTP_FACTOR:g} x {htp / MB:.0f} MB of HTP graphs"
        how += f" in {hosts} host process(es) of <= {budget:g} MB" if hosts else " in the row's process"
    return int(mb), how


def checkpoint_memory_mb(model_dir: str | Path) -> tuple[int, str]:
    """(MB, how) of the qwen-tts PyTorch reference on ``model_dir`` (torch and the fp32 checkpoint)."""
    size = sum(p.stat().st_size for p in Path(model_dir).rglob("*") if p.is_file())
    return int(TORCH_MB + TORCH_FACTOR * size / MB), f"{TORCH_MB} MB of torch + {TORCH_FACTOR:g} x the checkpoint"


# ------------------------------------------------------------------ units and their store
@dataclass
class Unit:
    """One task of a sweep. ``call``: "worker" (``python -m payload["module"]`` on ``payload["spec"]``) or
    "e2e" (the end-to-end pair); ``files``: spec key -> a small local file sent with the task (the spec then
    names the node's copy); ``shared``: folders the node must see at the same path (bundles, checkpoints);
    ``after``: the key of the unit whose result this one needs (its keys named in ``payload["take"]`` go into
    the spec)."""

    name: str
    label: str
    bench: str  # "tts" or "lm": whose code version the node must compute with
    identity: dict
    call: str
    payload: dict
    resources: Resources
    files: dict = field(default_factory=dict)
    shared: list = field(default_factory=list)
    after: str | None = None

    @property
    def key(self) -> str:
        return unit_key(self.identity)

    @property
    def file_stem(self) -> str:
        return f"{re.sub(r'[^A-Za-z0-9._-]+', '_', self.name)}.{self.key[:16]}"


class UnitStore:
    """``OUT/units``: one JSON file per finished unit (its arrays in an ``.npz`` beside it), written atomically."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        for tmp in self.root.glob(".*.tmp*"):  # a killed driver's half-written unit: never a result
            tmp.unlink(missing_ok=True)

    def files(self) -> list[Path]:
        """The finished units' JSON files (not the hidden temporary names an unfinished write uses)."""
        return sorted(f for f in self.root.glob("*.json") if not f.name.startswith("."))

    def paths(self, unit: Unit) -> tuple[Path, Path]:
        return self.root / f"{unit.file_stem}.json", self.root / f"{unit.file_stem}.npz"

    def load(self, unit: Unit) -> dict | None:
        """The unit's kept result, if it finished without an error under this key; else None."""
        path, npz = self.paths(unit)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        result = data.get("result") or {}
        if data.get("key") != unit.key or result.get("error"):
            return None
        if data.get("arrays"):
            try:
                with np.load(npz) as z:
                    result.update({k: z[k] for k in z.files})
            except (OSError, ValueError):
                return None
        return result

    def save(self, unit: Unit, result: dict) -> Path:
        """Write ``result`` (arrays to the ``.npz``, written first so the JSON means complete)."""
        path, npz = self.paths(unit)
        arrays = {k: v for k, v in result.items() if isinstance(v, np.ndarray)}
        plain = {k: v for k, v in result.items() if k not in arrays}
        doc = {"key": unit.key, "name": unit.name, "identity": unit.identity, "arrays": sorted(arrays),
               "resources": dataclasses.asdict(unit.resources), "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
               "result": plain}
        with atomic_outputs([npz, path] if arrays else [path]) as tmps:
            if arrays:
                with open(tmps[0], "wb") as f:
                    np.savez(f, **arrays)
            tmps[-1].write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
        return path

    def others(self, keys: set[str]) -> list[Path]:
        """Kept results of units not in this run (other bundles, code versions or settings)."""
        out = []
        for f in self.files():
            stem_key = f.stem.rpartition(".")[2]
            if not any(k.startswith(stem_key) for k in keys):
                out.append(f)
        return out


# ------------------------------------------------------------------ the cluster
@dataclass
class Cluster:
    """The Ray this run uses and its nodes alive at the start."""

    ray: Any
    address: str
    nodes: list[dict]

    @property
    def whole_node_cpus(self) -> float:
        return max(n["cpus"] for n in self.nodes)

    def fits(self, r: Resources) -> str | None:
        """Why no node can run a task of ``r`` (None: one can)."""
        cpus = self.whole_node_cpus if r.whole_node else r.cpus
        able = [n for n in self.nodes if n["cpus"] >= cpus]
        if not able:
            return f"asks {cpus:g} CPUs, the largest node has {self.whole_node_cpus:g}"
        room = max(n["memory_mb"] for n in able)
        if r.memory_mb > room:
            return (f"needs ~{r.memory_mb} MB ({r.basis}), the largest node offers Ray {room} MB: run it on a node "
                    "with more memory, or alone without --ray")
        return None

    def to_json(self) -> dict:
        return {"address": self.address, "nodes": self.nodes}


def _nodes(ray) -> list[dict]:
    out = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = n.get("Resources", {})
        out.append({"id": n["NodeID"][:12], "ip": n.get("NodeManagerAddress"), "cpus": float(res.get("CPU", 0)),
                    "memory_mb": int(res.get("memory", 0) / MB)})
    return out


@contextmanager
def cluster(address: str) -> Iterator[Cluster]:
    """Ray for ``--ray [ADDRESS]``: the one this process already joined, else a local Ray with this machine's
    CPUs (``address`` :data:`LOCAL`), else the cluster at ``address``; left (and a local one stopped) at the end."""
    try:
        import ray  # the cluster extra is optional: only --ray imports Ray
    except ImportError:
        raise KzttsError("--ray: Ray is not installed (the cluster extra): pip install 'kztts[cluster]'") from None
    started = not ray.is_initialized()
    if started:
        check_address(address)
        try:
            if address == LOCAL:
                ray.init(num_cpus=os.cpu_count(), object_store_memory=LOCAL_OBJECT_STORE_MB * MB,
                         include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
            else:
                ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            token = "" if os.environ.get("RAY_AUTH_MODE") else (
                "; a cluster with token authentication (Ray's default) needs RAY_AUTH_MODE=token and its token here")
            raise KzttsError(f"--ray {address}: cannot start or join Ray there ({first}); start a cluster with "
                             f"`ray start --head` and give its address, or --ray alone for a local one{token}"
                             ) from None
    try:
        nodes = _nodes(ray)
        if not nodes or max(n["cpus"] for n in nodes) < 1:
            raise KzttsError(f"--ray {address}: the Ray cluster has no node with a CPU; add worker nodes")
        yield Cluster(ray, address, nodes)
    finally:
        if started:
            ray.shutdown()


def check_address(address: str) -> None:
    """``--ray ADDRESS`` checked before any work: Ray installed, and a HOST:PORT answering (Ray itself retries
    an address where nothing listens for many minutes)."""
    if importlib.util.find_spec("ray") is None:
        raise KzttsError("--ray: Ray is not installed (the cluster extra): pip install 'kztts[cluster]'")
    if address in (LOCAL, "auto") or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise KzttsError(f"--ray {address}: give the head's HOST:PORT (its GCS port, 6379 unless `ray start --head "
                         "--port` said otherwise), auto, or nothing for a local Ray")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=10).close()
    except OSError as e:
        raise KzttsError(f"--ray {address}: nothing answers there ({e.strerror or e}); start the head with "
                         f"`ray start --head --port {port}`, or check the address") from None


# ------------------------------------------------------------------ the task (runs on a node)
def node_facts() -> dict:
    """Which node and process ran a unit (recorded in its result)."""
    import ray  # only ever called inside a Ray task

    return {"id": ray.get_runtime_context().get_node_id()[:12], "ip": ray.util.get_node_ip_address(),
            "host": socket.gethostname(), "pid": os.getpid()}


def _check_node(bench: str, code: str, shared: dict[str, str]) -> str | None:
    """Why this node cannot run the unit (None: it can): other kztts code, or a shared folder missing or
    not the driver's."""
    here = code_version.__wrapped__(bench)  # not the cache: a long-lived worker may outlive an edit of the code
    if here != code:
        return (f"node {socket.gethostname()} computes with other kztts code or package versions (code version "
                f"{here}, the run's {code}): the code changed since the run started, or the node has another "
                "install; rerun (finished units are kept), with the same kztts and packages on every node")
    for path, fp in shared.items():
        if not Path(path).exists():
            return (f"{path}: not on node {socket.gethostname()}: put bundles and checkpoints ($KZTTS_CACHE) on "
                    "storage mounted at the same path on every node (docs/CLUSTER.md)")
        if fingerprint(path) != fp:
            return f"{path} on node {socket.gethostname()} is not the driver's copy (other files or sizes): sync it"
    return None


SCRATCH = "kztts-unit-"  # a task's scratch folder: kztts-unit-<pid>-<random> in the node's temporary folder


def _remove_stale_scratch() -> None:
    """Remove the scratch folders of tasks whose process is gone (a killed task never removes its own)."""
    for d in Path(tempfile.gettempdir()).glob(f"{SCRATCH}*-*"):
        pid = d.name[len(SCRATCH):].partition("-")[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


def execute(call: str, payload: dict, files: dict, check: dict, needed: dict | None = None) -> dict:
    """A unit's task: check the node, write the small files next to the spec, run the unit; its result with
    ``node``. A killed row process gives ``{"killed": why}`` (the driver retries it)."""
    node = node_facts()
    why = _check_node(check["bench"], check["code"], check["shared"])
    if why is not None:
        return {"error": why, "node": node}
    _remove_stale_scratch()
    with tempfile.TemporaryDirectory(prefix=f"{SCRATCH}{os.getpid()}-") as tmp:
        local = {}
        for key, (name, data) in files.items():
            p = Path(tmp) / "files" / key / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
            local[key] = str(p)
        if call == "e2e":
            row = bench_e2e.run_pair(payload["options"], Path(payload["model_dir"]), Path(payload["bundle"]),
                                     Path(local["xvector"]), Path(tmp))
            return {**row, "node": node}
        spec = {**payload["spec"], **local, **{k: needed[k] for k in payload.get("take", ())}}
        threads = int(payload["threads"])
        out: dict = {}
        if payload.get("probe"):  # this node's streaming bandwidth, for the row's "% of limit"
            out["bandwidth_probe"] = bandwidth.probe(threads)
        load = psutil.getloadavg()[0]
        try:
            row = run_worker(payload["module"], spec, Path(tmp), payload["tag"],
                             env={"OMP_NUM_THREADS": str(threads), "KZTTS_THREADS": str(threads)})
        except WorkerError as e:
            if e.signal is not None:
                return {"killed": f"{e.brief()[-300:]}", "node": node}
            row = {"error": e.brief()[-400:]}
        if payload.get("load"):
            row["load_avg_before"] = round(load, 2)
            if "error" not in row:
                row["load_avg_after"] = round(psutil.getloadavg()[0], 2)
        return {**row, **out, "node": node}


# ------------------------------------------------------------------ the driver
@dataclass
class Outcome:
    """What :func:`run_units` did: results by unit key, and which units were reused, run and failed."""

    results: dict[str, dict]
    reused: list[str] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self, c: Cluster, store: UnitStore) -> dict:
        return {**c.to_json(), "units": len(self.results), "reused": sorted(self.reused), "ran": sorted(self.ran),
                "failed": sorted(self.failed), "store": store.root.name, "attempts_max": ATTEMPTS,
                "seconds": round(self.seconds, 1)}


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def _env() -> dict:
    """The driver's KZTTS_* variables, for every task (sampling overrides, attention, cache, QNN configs)."""
    return {k: v for k, v in os.environ.items() if k.startswith("KZTTS_") and k != "KZTTS_THREADS"}


def run_units(units: Sequence[Unit], store: UnitStore, c: Cluster, desc: str, known: Sequence[str] = ()) -> Outcome:
    """Run every unit not kept in ``store`` as a Ray task (dependencies first), writing each result to
    ``store`` as it finishes; retries killed units (:data:`ATTEMPTS` in all). Returns every unit's result.
    ``known``: keys of this run's units kept in ``store`` by the caller (the TTS baseline)."""
    ray = c.ray
    t0 = time.monotonic()
    by_key = {u.key: u for u in units}
    outcome = Outcome({})
    for u in units:
        kept = store.load(u)
        if kept is not None:
            outcome.results[u.key] = kept
            outcome.reused.append(u.name)
    others = store.others(set(by_key) | set(known))
    if others:
        log.warning("%s: %d kept unit result(s) of other bundles, code versions or settings are not used",
                    store.root, len(others))
    if outcome.reused:
        phase("%s: %d of %d units kept from an earlier run, %d to run", store.root, len(outcome.reused), len(units),
              len(units) - len(outcome.reused))
    bar = Steps(len(units), desc, unit="unit")
    bar.update(len(outcome.reused))
    remote = ray.remote(execute)
    env = _env()
    pending: dict = {}
    refs: dict[str, Any] = {}
    failures: dict[str, list[str]] = {}
    shared_fp: dict[str, str] = {}

    def finish(u: Unit, result: dict, attempts: int) -> None:
        result["attempts"] = attempts
        if failures.get(u.key):
            result["failures"] = failures[u.key]
        result["unit"] = store.paths(u)[0].name
        store.save(u, result)
        outcome.results[u.key] = result
        (outcome.failed if result.get("error") else outcome.ran).append(u.name)
        where = (result.get("node") or {}).get("host", "?")
        bar.phase(f"{u.label}: {'FAILED' if result.get('error') else 'done'} on {where}")
        bar.update()

    def submit(u: Unit, attempt: int) -> None:
        for p in u.shared:
            if p not in shared_fp:
                shared_fp[p] = fingerprint(p)
        files = {k: (Path(p).name, Path(p).read_bytes()) for k, p in u.files.items()}
        check = {"bench": u.bench, "code": code_version(u.bench), "shared": {p: shared_fp[p] for p in u.shared}}
        needed = None
        if u.after is not None:
            needed = refs.get(u.after)
            if needed is None:  # kept from an earlier run: put it in the object store once
                needed = refs[u.after] = ray.put(outcome.results[u.after])
        r = u.resources
        opts = {"num_cpus": c.whole_node_cpus if r.whole_node else r.cpus, "memory": int(r.memory_mb * MB),
                "max_retries": 0, "name": u.name, "runtime_env": {"env_vars": env}}
        pending[remote.options(**opts).remote(u.call, u.payload, files, check, needed)] = (u, attempt)

    waiting = [u for u in units if u.key not in outcome.results]
    for u in list(waiting):
        why = c.fits(u.resources)
        if why is not None:
            waiting.remove(u)
            log.error("%s: refused: %s", u.label, why)
            finish(u, {"error": f"refused under --ray: {why}"}, 0)
    try:
        while waiting or pending:
            for u in list(waiting):
                dep = outcome.results.get(u.after) if u.after is not None else None
                if u.after is None or (dep is not None and not dep.get("error")):
                    waiting.remove(u)
                    submit(u, 1)
                elif dep is not None:
                    waiting.remove(u)
                    finish(u, {"error": f"not run: {by_key[u.after].label} failed"}, 0)
            if not pending:
                raise RuntimeError(f"units wait for units not in the run: {[u.name for u in waiting]}")
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            u, attempt = pending.pop(ref)
            killed = None
            try:
                result = ray.get(ref)
                killed = result.pop("killed", None)
                if killed:
                    killed = f"{killed} on {result.get('node', {}).get('host', '?')}"
            except ray.exceptions.RayTaskError as e:  # the task itself raised: a bug, not retried
                result = {"error": _one_line(e.cause if getattr(e, "cause", None) is not None else e)}
            except ray.exceptions.RayError as e:  # its worker or node died (killed, out of memory)
                killed = _one_line(e)
            if killed is not None:
                failures.setdefault(u.key, []).append(f"attempt {attempt}: {killed}")
                log.warning("%s: attempt %d of %d killed (%s)", u.label, attempt, ATTEMPTS, killed)
                if attempt < ATTEMPTS:
                    submit(u, attempt + 1)
                    continue
                result = {"error": f"killed in all {attempt} attempts; the last: {killed}"}
            elif not result.get("error"):
                refs[u.key] = ref
            finish(u, result, attempt)
    finally:
        bar.close()
        outcome.seconds = time.monotonic() - t0
    phase("%s: %d units: %d kept from before, %d run, %d failed (%.0f s)", desc, len(units), len(outcome.reused),
          len(outcome.ran), len(outcome.failed), outcome.seconds)
    return outcome


# ------------------------------------------------------------------ an LM unit's process
def lm_unit(spec: dict) -> dict:
    """One (row, text) of the LM rows (``kztts.eval.lm_accuracy.run_text``), from its spec."""
    row = spec["row"]
    rs = RowSpec(row["name"], Path(row["bundle"]), weights=row["weights"], target=spec.get("target"),
                 placement=spec.get("placement"), check_saturation=row["check_saturation"], strict=row["strict"],
                 guard_counts=row["guard_counts"])
    sample = next(s for s in SAMPLES if s.name == spec["text"])
    reference = ({k: spec[k] for k in ("ref_tokens", "ref_greedy", "ref_logits")} if "ref_logits" in spec else None)
    return run_text(rs, sample, threads=int(spec["threads"]), steps=int(spec["steps"]), limit=int(spec["limit"]),
                    reference=reference)


def row_spec_json(spec: RowSpec) -> dict:
    """A :class:`RowSpec` as an LM unit's spec carries it (its target and placement travel apart)."""
    d = dataclasses.asdict(spec)
    d["bundle"] = str(Path(spec.bundle).resolve())
    d.pop("target")
    d.pop("placement")
    return d


def main(argv: list[str] | None = None) -> int:
    return worker_main(lm_unit, argv)


if __name__ == "__main__":
    sys.exit(main())
